"""``objectives.damage.keep_states: disk`` (issue 55: the reading's memory): the states and gradients in temporary
files instead of memory, read back a slice at a time.

The reading must be the one from memory to the bit (every figure, value and standard error, per state and unit),
the reader must hold no tensor in memory between trials (its bytes on disk instead, exactly what the host placement
holds in memory), the files must have no name in their directory and be closed when the reader closes (and a
policy's as soon as its state is compared), and ``auto`` must choose disk on a CPU where there is room.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from _floats import same_values

from precsearch.backends.emulated import EmulatedBackend
from precsearch.config.space import DamageSection, ProbeSection
from precsearch.policy import MemoryKnobs, Policy, Rule
from precsearch.precision import Precision
from precsearch.probe.damage import DamageReader, placement
from precsearch.probe.damage.spill import Spilled
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.model.llama3 import ModelConfig
from precsearch.probe.model.reuse import ModelCache

CFG = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
PROBE = ProbeSection(steps=6, micro_batch=2, seq_len=32, lr=3e-3, lr_warmup_steps=1, device="cpu")
CPU = torch.device("cpu")

POLICIES = {
    "fp8_current": Policy(rules=(Rule("fp8", ("*",), Precision.FP8_CURRENT),)),
    "fp8_delayed, blocks": Policy(rules=(Rule("fp8", ("decoder.layers.*",), Precision.FP8_DELAYED),), clip_grad=1.0),
    # scaled storages: the compare's amax passes read every slice twice more
    "fp8 moments, fp16 master": Policy.bf16(None, MemoryKnobs(moment_dtype="fp8", master_weights=True,
                                                               master_dtype="fp16")),
}
VOLATILE = ("seconds", "seconds_by_part", "bf16_side_s", "states_on")


@pytest.fixture(scope="module")
def data() -> TokenBatches:
    return TokenBatches(synthetic_tokens(20_000, CFG.vocab_size, seed=0), seq_len=32, micro_batch=2, seed=0,
                        eval_batches=1)


def _reader(data, keep: str, spill_dir: Path | None = None, states=(0.0, 0.5, 1.0), **kw) -> DamageReader:
    settings = DamageSection(states=list(states), batches=3, tokens_per_step=4096, keep_states=keep)
    return DamageReader(CFG, PROBE, data, EmulatedBackend(), CPU, settings, spill_dir=spill_dir, **kw)


def _numbers(reading: dict) -> dict:
    return {k: v for k, v in reading.items() if k not in VOLATILE}


def _open_in(directory: Path) -> list[str]:
    """This process's open files in ``directory`` (an anonymous file shows as the directory, or '#N (deleted)')."""
    fds = Path("/proc/self/fd")
    targets = []
    for fd in fds.iterdir():
        try:
            targets.append(os.readlink(fd))
        except OSError:
            continue
    return [t for t in targets if t.startswith(str(directory))]


@pytest.mark.parametrize("name", list(POLICIES))
def test_a_reading_from_disk_is_the_reading_from_memory(data, tmp_path, name):
    """Every figure, per state (step 0 without moments included) and unit, equal to the bit; two policies read
    in turn through the same reader (the second reads the BF16 side back from disk)."""
    host, disk = _reader(data, "host"), _reader(data, "disk", tmp_path)
    for policy in (POLICIES[name], POLICIES["fp8_current"]):
        a, b = host.read(policy), disk.read(policy)
        assert b["states_on"] == "disk" and a["states_on"] == "host"
        assert a["value"] > 0 and same_values(_numbers(a), _numbers(b))
    disk.close()


def test_through_the_kept_model_too(data, tmp_path):
    """A study's reader sets its kept model's weights to each state (:mod:`precsearch.probe.model.reuse`): from
    disk one tensor at a time, to the same reading."""
    policy = POLICIES["fp8_current"]
    fresh = _reader(data, "host").read(policy)
    models = ModelCache()
    reader = _reader(data, "disk", tmp_path, models=models)
    reader.read(policy)
    again = reader.read(policy)
    assert models.reused > 0 and same_values(_numbers(fresh), _numbers(again))
    reader.close()


def test_on_disk_the_reader_holds_no_tensor_in_memory(data, tmp_path):
    """Between trials a disk reader holds nothing in memory; its files hold what the host reader holds in memory,
    byte for byte (each state's weights and moments, each BF16 gradient)."""
    host, disk = _reader(data, "host"), _reader(data, "disk", tmp_path)
    host.bf16_sides(None), disk.bf16_sides(None)
    assert host.host_bytes() > 0 and host.disk_bytes() == 0
    assert disk.host_bytes() == 0 and disk.disk_bytes() == host.host_bytes()
    for state, side in disk.bf16_sides(None):
        assert isinstance(state.weights, Spilled) and isinstance(state.moments, Spilled)
        assert all(isinstance(batch, Spilled) for batch in side.grads)
    disk.close()


def test_the_files_have_no_name_and_are_closed_with_the_reader(data, tmp_path):
    """Nothing appears in the spill directory at any time (the files are anonymous: a crash leaves nothing); the
    BF16 side keeps one open file, a policy's file is closed once its states are compared, and close() closes
    the BF16 side's (the kernel frees it) and forgets the side."""
    reader = _reader(data, "disk", tmp_path)
    reader.read(POLICIES["fp8_current"])
    assert list(tmp_path.iterdir()) == []
    assert len(_open_in(tmp_path)) == 1  # the BF16 side's; the policy's were closed after each state
    assert reader.disk_bytes() > 0
    reader.close()
    assert _open_in(tmp_path) == [] and list(tmp_path.iterdir()) == [] and reader.disk_bytes() == 0
    assert reader.read(POLICIES["fp8_current"])["bf16_side_s"] > 0  # made again after a close
    reader.close()


def test_a_policys_file_is_closed_when_its_reading_fails(data, tmp_path, monkeypatch):
    """A reading that raises (here in the compare) leaves no policy file open."""
    from precsearch.probe.damage import reader as reader_mod

    reader = _reader(data, "disk", tmp_path)
    reader.bf16_sides(None)

    def broken(*args, **kwargs):
        raise RuntimeError("compare failed")

    monkeypatch.setattr(reader_mod, "read_state", broken)
    with pytest.raises(RuntimeError, match="compare failed"):
        reader.read(POLICIES["fp8_current"])
    assert len(_open_in(tmp_path)) == 1
    reader.close()


def test_auto_keeps_them_on_disk_on_a_cpu_where_there_is_room(data, tmp_path, monkeypatch):
    """``auto`` on a CPU: disk where the files take at most half the free space and are not small, else host
    memory."""
    settings = DamageSection(states=[0.5, 1.0], batches=3, keep_states="auto")
    assert placement.where_states(CFG, PROBE, settings, CPU, 2, 0, tmp_path) == "host"  # this model is small
    monkeypatch.setattr(placement, "HOST_SMALL_BYTES", 0)
    need = placement.disk_bytes(CFG, PROBE, settings, 2)
    assert need == placement.state_bytes(CFG, 2) + placement.gradient_bytes(CFG, PROBE, settings, 2) \
        + 3 * 4 * placement.unit_elements(CFG)
    assert placement.disk_fits(CFG, PROBE, settings, 2, free=2 * need)
    assert not placement.disk_fits(CFG, PROBE, settings, 2, free=2 * need - 1)
    assert placement.where_states(CFG, PROBE, settings, CPU, 2, 0, tmp_path) == "disk"
    for keep in ("host", "device", "disk"):
        fixed = settings.model_copy(update={"keep_states": keep})
        assert placement.where_states(CFG, PROBE, fixed, CPU, 2, 0, tmp_path) == keep
    reader = _reader(data, "auto", tmp_path, states=(0.5, 1.0))
    assert reader.read(POLICIES["fp8_current"])["states_on"] == "disk"
    reader.close()


def test_keep_states_disk_is_validated_with_the_others():
    assert DamageSection(keep_states="disk").keep_states == "disk"
    with pytest.raises(ValueError, match=r"keep_states"):
        DamageSection(keep_states="file")
