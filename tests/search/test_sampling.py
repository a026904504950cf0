"""From a space and a trial to a policy: the NVFP4 switches and the BF16 edge blocks."""

from __future__ import annotations

import optuna

from _spaces import tiny_space_dict
from precsearch.config.space import Space
from precsearch.precision import Precision
from precsearch.search.sampling import edge_rules, policy_from_params, suggest_policy


def _space(**overrides) -> Space:
    return Space.model_validate(tiny_space_dict(**overrides))


NVFP4_MLP = [{"name": "mlp", "modules": ["*.mlp.*"], "precision": "nvfp4"}]


def test_nvfp4_switches_are_searched_params():
    """A searched switch must become a trial param and reach the layer recipe (else it changes nothing)."""
    space = _space(**{"search.recipe.nvfp4_rht": {"choices": [True, False]},
                      "search.recipe.nvfp4_stochastic_rounding": False, "search.groups": NVFP4_MLP})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    policy = suggest_policy(space, trial)
    assert "recipe.nvfp4_rht" in trial.params and "recipe.nvfp4_stochastic_rounding" not in trial.params
    assert policy.recipe.nvfp4_rht is trial.params["recipe.nvfp4_rht"]
    assert policy.recipe.nvfp4_stochastic_rounding is False and policy.recipe.nvfp4_2d_weights is True
    rebuilt = policy_from_params(space, {**trial.params, "recipe.nvfp4_rht": False})
    assert rebuilt.recipe.nvfp4_rht is False


def test_bf16_edge_blocks_win_over_groups():
    """The first/last blocks must run BF16 whatever their group chose; the blocks between keep the group's."""
    space = _space(**{"model.n_layers": 4, "search.bf16_blocks": {"first": 1, "last": {"choices": [0, 2]}},
                      "search.groups": [{"name": "all", "modules": ["*"], "precision": "nvfp4"}],
                      "search.warmup_steps": 0})
    policy = policy_from_params(space, {"bf16_blocks.last": 2})
    names = [f"decoder.layers.{b}.mlp.linear_fc1" for b in range(4)]
    assert [policy.precision_for(n, 4) for n in names] == [Precision.BF16, Precision.NVFP4, Precision.BF16,
                                                          Precision.BF16]
    assert policy.precision_for("output_layer", 4) is Precision.NVFP4  # "*" with a block limit: no head
    assert policy_from_params(space, {"bf16_blocks.last": 0}).precision_for(names[3], 4) is Precision.NVFP4
    assert edge_rules(0, 0) == ()


def test_a_setting_no_layer_of_the_trial_reads_is_not_sampled():
    """Issue 53: trials differing only in a setting their layers never read scored alike and both reached the
    front. A trial with no delayed-scaling layer must not ask for the delayed settings, so its params equal
    those of every such twin (caught as a duplicate). The FP8 warm-up stays sampled in an all-BF16 trial."""
    space = _space(**{"search.recipe.amax_history_len": {"choices": [1, 16]}, "search.recipe.margin": {"low": 0,
                      "high": 2}, "search.warmup_steps": {"choices": [4, 0]}})
    params = {"precision.attention": "bf16", "precision.mlp": "fp8_block"}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial(params)
    trial = study.ask()
    policy = suggest_policy(space, trial)
    assert set(trial.params) == {"precision.attention", "precision.mlp", "warmup_steps"}  # fp8_block: no history
    assert policy.recipe.amax_history_len == 1 and policy.recipe.margin == 0  # the first value, unasked
    delayed = policy_from_params(space, {"precision.attention": "fp8_delayed", "precision.mlp": "bf16",
                                         "recipe.amax_history_len": 16, "recipe.margin": 2, "warmup_steps": 0})
    assert (delayed.recipe.amax_history_len, delayed.recipe.margin) == (16, 2)  # read, so searched
    bf16 = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    bf16.enqueue_trial({"precision.attention": "bf16", "precision.mlp": "bf16"})
    trial = bf16.ask()
    suggest_policy(space, trial)
    assert set(trial.params) == {"precision.attention", "precision.mlp", "warmup_steps"}
