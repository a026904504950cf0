"""What each export target can express: one contract every format keeps, then each target's known gaps.

``cannot_express`` is read from the format's ``as_run`` (what the written files make the framework run), so a
test failing here means validation, the front column or the export's "what changes" would disagree with the
files the export writes.
"""

from __future__ import annotations

import pytest

from precsearch.export.registry import FORMATS, TARGETS, cannot_express, render, version_problem
from precsearch.policy import Policy, Rule
from precsearch.policy.rules import MemoryKnobs
from precsearch.precision import Fp8Format, LayerRecipe, Precision

P = Precision
N = 4

#: Policies every target expresses as they are: all BF16 (clipping included), and plain fp8_current blocks.
PLAIN = [Policy(), Policy(clip_grad=0.5),
         Policy(rules=(Rule("head", ("lm_head",), P.BF16),), default=P.FP8_CURRENT)]


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("policy", PLAIN)
def test_every_target_runs_a_plain_policy_as_it_is(target, policy):
    """Contract: BF16, clipping and per-module tensorwise FP8 (kept BF16 at the head) are in every target;
    a change here would make every such trial 'not runnable' in the front."""
    assert cannot_express(TARGETS[target], policy, N) == []


CHANGED = [Policy(default=P.FP8_DELAYED, warmup_steps=10), Policy(memory=MemoryKnobs(fp8_attention="dpa")),
           Policy(default=P.FP8_CURRENT, recipe=LayerRecipe(fp8_format=Fp8Format.E4M3), warmup_steps=3),
           Policy(memory=MemoryKnobs(moment_dtype="fp8_block", fp8_weights=True)),
           Policy(rules=(Rule("mlp", ("*mlp*",), P.MXFP8),), default=P.FP8_CURRENT)]


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("policy", CHANGED)
def test_what_a_target_cannot_express_is_warned_about_in_its_export(target, policy):
    """Contract: a policy the target runs otherwise gets at least one warning in its files (nothing changes
    silently)."""
    changes = cannot_express(TARGETS[target], policy, N)
    assert not changes or render(TARGETS[target], policy, N).warnings, changes


def test_precsearch_expresses_everything():
    policy = Policy(default=P.NVFP4, warmup_steps=5, recipe=LayerRecipe(fp8_format=Fp8Format.E4M3),
                    memory=MemoryKnobs(moment_dtype="fp8_block", master_weights=True, fp8_attention="mha"))
    assert cannot_express("policy", policy, N) == []


@pytest.mark.parametrize(("target", "policy", "change"), [
    ("megatron", Policy(default=P.FP8_CURRENT, warmup_steps=10), "FP8 warm-up: 10 -> 0 steps"),
    ("megatron", Policy(memory=MemoryKnobs(moment_dtype="fp8_block")), "first moment: fp8_block -> bf16"),
    ("megatron", Policy(memory=MemoryKnobs(fp8_attention="dpa")), "fp8_attention: dpa -> off"),
    ("torchtitan", Policy(default=P.FP8_DELAYED), "fp8_delayed -> bf16"),
    ("torchtitan", Policy(default=P.FP8_CURRENT, recipe=LayerRecipe(fp8_format=Fp8Format.E4M3)),
     "fp8_format: e4m3 -> hybrid"),
    ("torchtitan", Policy(memory=MemoryKnobs(moment_dtype="bf16")), "first moment: bf16 -> fp32"),
    ("torchtitan", Policy(memory=MemoryKnobs(fp8_weights=True)), "fp8_weights: true -> false"),
    ("accelerate", Policy(default=P.FP8_CURRENT, warmup_steps=10), "FP8 warm-up: 10 -> 0 steps"),
    ("accelerate", Policy(memory=MemoryKnobs(fp8_attention="mha")), "fp8_attention: mha -> off"),
])
def test_each_target_names_what_it_runs_otherwise(target, policy, change):
    changes = cannot_express(TARGETS[target], policy, N)
    assert any(change in line for line in changes), changes


def test_accelerate_keeps_the_warm_up_when_its_snippet_uses_precsearch():
    """A mixed policy goes through precsearch's Python API, which runs the warm-up: nothing is lost."""
    policy = Policy(rules=(Rule("mlp", ("*mlp*",), P.FP8_BLOCK),), default=P.FP8_CURRENT, warmup_steps=10)
    assert cannot_express("accelerate", policy, N) == []


def test_targets_name_each_format_once_and_record_the_version_checked():
    assert list(TARGETS) == ["precsearch", "megatron", "torchtitan", "accelerate"]
    assert all(FORMATS[fmt].checked for fmt in TARGETS.values())
    assert version_problem("torchtitan", FORMATS["torchtitan"].checked) is None
    assert "before 0.3" in version_problem("torchtitan", "v0.3.0")
    assert "0.16 or newer" in version_problem("megatron", "core_v0.15.0")
    assert version_problem("megatron", "core_v0.18.0") is None
    assert version_problem("policy", "0.0.1") is None  # precsearch reads its own policy.yaml
