"""A probe started from a Hugging Face checkpoint computes what the checkpoint computes.

With every block taken, the probe's logits must match ``LlamaForCausalLM``'s (float32); with a subset,
they must match a Hugging Face model made of exactly those blocks in that order. A failure means a
tensor went to the wrong place (q/k/v grouping, gate/up order, a norm from another block, a block
renumbered wrongly), or the config was read wrong (GQA, RoPE scaling, eps).
"""

from __future__ import annotations

import pytest
import torch

from _checkpoints import hf_llama, save_checkpoint
from precsearch.arch.hf_checkpoint import CheckpointStart, LayerPick, pick_layers, read_config
from precsearch.backends import get_backend
from precsearch.config.space import ProbeSection
from precsearch.policy import Policy
from precsearch.probe.model.checkpoint_init import load_start
from precsearch.probe.data import TokenBatches, synthetic_tokens
from precsearch.probe.model.llama3 import build_model
from precsearch.probe.runner import build_probe, run_probe

CPU = torch.device("cpu")
IDS = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))


def _probe_logits(start: CheckpointStart) -> torch.Tensor:
    cfg = read_config(start.path).with_overrides(n_layers=len(start.layers))
    model = build_probe(cfg, Policy.bf16(None), get_backend("emulated", CPU), CPU, seed=0, init=start)
    return model.eval()(IDS)


@pytest.mark.parametrize("shard", [None, "60KB"])
def test_all_blocks_match_hugging_face(tmp_path, shard):
    hf = hf_llama()
    path = save_checkpoint(hf, tmp_path, shard)
    with torch.no_grad():
        expected = hf(IDS).logits
        actual = _probe_logits(CheckpointStart(path, tuple(range(5))))
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pick", list(LayerPick))
def test_chosen_blocks_match_a_hugging_face_model_of_those_blocks(tmp_path, pick):
    hf = hf_llama()
    path = save_checkpoint(hf, tmp_path)
    layers = pick_layers(5, 3, pick)
    small = hf_llama(num_hidden_layers=3)
    state = hf.state_dict()
    for new, old in enumerate(layers):
        state |= {k.replace(f"model.layers.{old}.", f"model.layers.{new}."): v
                  for k, v in hf.state_dict().items() if k.startswith(f"model.layers.{old}.")}
    small.load_state_dict({k: v for k, v in state.items() if k in small.state_dict()})
    with torch.no_grad():
        torch.testing.assert_close(_probe_logits(CheckpointStart(path, layers)), small(IDS).logits,
                                   rtol=1e-5, atol=1e-5)


def test_tied_embeddings_feed_the_output_layer(tmp_path):
    hf = hf_llama(tie_word_embeddings=True)
    path = save_checkpoint(hf, tmp_path)
    state = load_start(CheckpointStart(path, (0, 1, 2, 3, 4)), read_config(path))
    torch.testing.assert_close(state["output_layer.weight"], hf.model.embed_tokens.weight)
    with torch.no_grad():
        torch.testing.assert_close(_probe_logits(CheckpointStart(path, tuple(range(5)))), hf(IDS).logits,
                                   rtol=1e-5, atol=1e-5)


def test_trained_start_has_lower_loss_than_random_init(tmp_path):
    """The probe really starts from the checkpoint: a checkpoint trained on the data starts far below ln(256)."""
    cfg = read_config(save_checkpoint(hf_llama(), tmp_path / "x")).with_overrides(n_layers=2)
    tokens = synthetic_tokens(20000, 256, seed=0)
    data = TokenBatches(tokens, seq_len=32, micro_batch=8, seed=0, eval_batches=2)
    model = build_model(cfg, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(150):
        loss = model(*data.train_batch(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
    from precsearch.probe.model.hf_weights import to_hf
    trained = hf_llama(num_hidden_layers=2)
    trained.load_state_dict(to_hf(cfg, model.state_dict()))
    path = save_checkpoint(trained, tmp_path / "trained")
    probe = ProbeSection(steps=2, micro_batch=8, seq_len=32, lr=1e-4, device="cpu", lr_warmup_steps=0)
    policy, backend = Policy.bf16(None), get_backend("emulated", CPU)
    warm = run_probe(cfg, probe, policy, data, backend, CPU, init=CheckpointStart(path, (0, 1)))
    cold = run_probe(cfg, probe, policy, data, backend, CPU)
    assert warm.losses[0] < cold.losses[0] - 1.0, (warm.losses, cold.losses)


def test_seed_draws_the_data_order_of_a_checkpoint_start(tmp_path):
    """A checkpoint start has no random init: without this, every BF16 reference seed would be the same run
    and the noise floor zero. The seed must change the training windows, never the held-out set."""
    hf = hf_llama(num_hidden_layers=2)
    path = save_checkpoint(hf, tmp_path)
    cfg = read_config(path)
    data = TokenBatches(synthetic_tokens(20000, 256, seed=0), seq_len=32, micro_batch=4, seed=0, eval_batches=2)
    probe = ProbeSection(steps=3, micro_batch=4, seq_len=32, lr=1e-3, device="cpu", lr_warmup_steps=0)
    start, policy, backend = CheckpointStart(path, (0, 1)), Policy.bf16(None), get_backend("emulated", CPU)
    runs = [run_probe(cfg, probe.model_copy(update={"seed": s}), policy, data, backend, CPU, init=start)
            for s in (0, 0, 1)]
    assert runs[0].losses == runs[1].losses
    assert runs[0].losses[0] != runs[2].losses[0]  # another first batch
    assert data.with_seed(1).eval_set()[0][0].equal(data.eval_set()[0][0])
