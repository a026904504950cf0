"""Values that parse but make no sense (issue 16, classes 1, 2 and 5): ``validate`` refuses each, naming the field.

Each row is a change to ``search_spaces/cpu_smoke.yaml`` (2 blocks, 12 steps, seq 32; groups ``attention``
and ``mlp``), the field path the one-line error must name, and a fragment of what it says. A row failing
here means a user would get "valid" for a file that fails later, does nothing, or trains wrongly (gradient
ascent with ``clip_grad: -1``), or an error that sends them to the wrong field.
"""

from __future__ import annotations

import pytest

from _spaces import tiny_space_dict, write_space
from precsearch.cli import main

ATTN = {"name": "attention", "modules": ["*.self_attention.*"], "precision": {"choices": ["bf16", "fp8_current"]}}
MLP = {"name": "mlp", "modules": ["*.mlp.*"], "precision": {"choices": ["bf16", "fp8_block"]}}


def _groups(*groups: dict) -> dict:
    return {"search.groups": list(groups)}


#: (case id, overrides of tiny_space_dict, field the error names, fragment of the message), by class.
CASES = [
    # --- FP8 recipe settings that do nothing or blow up -----------------------------------------
    ("amax_history_zero", {"search.recipe.amax_history_len": 0}, "search.recipe.amax_history_len", ">= 1"),
    ("amax_history_zero_choice", {"search.recipe.amax_history_len": {"choices": [16, 0]}},
     "search.recipe.amax_history_len", ">= 1"),
    ("amax_history_absurd", {"search.recipe.amax_history_len": 10**12}, "search.recipe.amax_history_len",
     "at most"),
    ("amax_history_range_to_absurd", {"search.recipe.amax_history_len": {"low": 16, "high": 10**9}},
     "search.recipe.amax_history_len", "at most"),
    ("margin_negative", {"search.recipe.margin": -1}, "search.recipe.margin", ">= 0"),
    ("margin_negative_range", {"search.recipe.margin": {"low": -2, "high": 2}}, "search.recipe.margin", ">= 0"),
    ("margin_flushes_everything", {"search.recipe.margin": 40}, "search.recipe.margin", "flush"),
    # --- BF16 edge blocks that are negative or leave no low-precision block (2-block probe) ------
    ("edge_blocks_negative", {"search.bf16_blocks": {"first": -1}}, "search.bf16_blocks.first", ">= 0"),
    ("edge_blocks_cover_probe", {"search.bf16_blocks": {"first": 1, "last": {"choices": [0, 1]}}},
     "search.bf16_blocks", "no low-precision block"),
    ("nvfp4_switch_not_bool", {"search.recipe.nvfp4_rht": {"choices": [True, "sometimes"]}},
     "search.recipe.nvfp4_rht", "bool"),
    # --- gradient clipping that silently trains wrongly --------------------------------------------
    ("clip_zero", {"search.clip_grad": 0}, "search.clip_grad", "> 0"),
    ("clip_negative", {"search.clip_grad": -1}, "search.clip_grad", "> 0"),
    ("clip_zero_among_choices", {"search.clip_grad": {"choices": [None, 0.0]}}, "search.clip_grad", "> 0"),
    ("clip_range_from_zero", {"search.clip_grad": {"low": 0.0, "high": 2.0}}, "search.clip_grad", "> 0"),
    ("clip_inf", {"search.clip_grad": float("inf")}, "search.clip_grad", "finite"),
    # --- layer groups past the probe, empty, or never reached -------------------------------------
    ("group_indices_past_depth", _groups({**ATTN, "layers": {"indices": [0, 5]}}, MLP),
     "search.groups[0].layers.indices", "past"),
    ("group_first_past_depth", _groups({**ATTN, "layers": {"first": 3}}, MLP),
     "search.groups[0].layers.first", "2 blocks"),
    ("group_last_past_depth", _groups(ATTN, {**MLP, "layers": {"last": 7}}), "search.groups[1].layers.last",
     "2 blocks"),
    ("group_empty_indices", _groups({**ATTN, "layers": {"indices": []}}, MLP), "search.groups[0].layers",
     "no block"),
    ("group_first_zero", _groups({**ATTN, "layers": {"first": 0}}, MLP), "search.groups[0].layers", "no block"),
    ("group_duplicate_indices", _groups({**ATTN, "layers": {"indices": [1, 1]}}, MLP),
     "search.groups[0].layers.indices", "twice"),
    ("group_shadowed", _groups(ATTN, MLP, {"name": "late", "modules": ["*.mlp.linear_fc2"],
                                           "precision": "fp8_current"}), "search.groups[2].modules", "mlp"),
    ("group_shadowed_blocks", _groups({**ATTN, "modules": ["*"]}, {**MLP, "layers": {"last": 1}}),
     "search.groups[1].modules", "attention"),
    ("group_pattern_matching_nothing", _groups(ATTN, {**MLP, "modules": ["*.mlp.*", "*.feed_forward.*"]}),
     "search.groups[1].modules[1]", "matches no"),
    ("group_empty_name", _groups({**ATTN, "name": ""}, MLP), "search.groups[0].name", "letters"),
    ("default_searched_but_unused", {"search.default_precision": {"choices": ["bf16", "fp8_current"]},
                                     **_groups(ATTN, MLP, {"name": "head", "modules": ["output_layer"]})},
     "search.default_precision", "no layer"),
    # --- data settings the source never reads --------------------------------------------------------
    ("path_with_stdlib", {"data.path": "tokens.npy"}, "data.path", "ignored"),
    ("tokenizer_with_tokens", {"data": {"source": "tokens", "path": "t.npy", "tokenizer": "tok.json"}},
     "data.tokenizer", "ignored"),
    # --- the probe's schedule and optimizer -----------------------------------------------------
    ("lr_warmup_longer_than_probe", {"probe.lr_warmup_steps": 12}, "probe.lr_warmup_steps", "probe.steps"),
    ("beta1_one", {"probe.betas": [1.0, 0.95]}, "probe.betas", "[0, 1)"),
    ("beta2_above_one", {"probe.betas": [0.9, 1.5]}, "probe.betas", "[0, 1)"),
    ("beta_negative", {"probe.betas": [-0.1, 0.95]}, "probe.betas", "[0, 1)"),
    ("steps_zero", {"probe.steps": 0}, "probe.steps", "greater than 0"),
    ("lr_zero", {"probe.lr": 0}, "probe.lr", "greater than 0"),
    ("lr_negative", {"probe.lr": -1e-3}, "probe.lr", "greater than 0"),
    ("micro_batch_zero", {"probe.micro_batch": 0}, "probe.micro_batch", "greater than 0"),
    ("eval_batches_zero", {"data.eval_batches": 0}, "data.eval_batches", "greater than 0"),
    ("seq_len_past_max", {"probe.seq_len": 1024}, "probe.seq_len", "max_seq_len"),
    ("fp8_warmup_negative", {"search.warmup_steps": -1}, "search.warmup_steps", ">= 0"),
    ("fp8_warmup_whole_probe", {"search.warmup_steps": {"low": 0, "high": 12}}, "search.warmup_steps",
     "probe.steps"),
    # --- model shapes --------------------------------------------------------------------------
    ("heads_not_dividing_dim", {"model.n_heads": 3}, "model.n_heads", "divisible"),
    ("kv_heads_not_dividing_heads", {"model.n_kv_heads": 3}, "model.n_kv_heads", "divisible"),
    ("kv_heads_above_heads", {"model.n_kv_heads": 8}, "model.n_kv_heads", "divisible"),
    ("probe_deeper_than_target", {"model.probe_layers": 3}, "model.probe_layers", "model.n_layers"),
    # --- choice lists ----------------------------------------------------------------------------
    ("empty_choices_warmup", {"search.warmup_steps": {"choices": []}}, "search.warmup_steps", "non-empty"),
    ("duplicate_choices_clip", {"search.clip_grad": {"choices": [1.0, 1.0]}}, "search.clip_grad", "duplicates"),
    ("duplicate_choices_precision", _groups({**ATTN, "precision": {"choices": ["bf16", "bf16"]}}, MLP),
     "search.groups[0].precision", "duplicates"),
    # --- the study's own settings ---------------------------------------------------------------
    ("relative_limit_in_percent", {"objectives.stability_limit": 5}, "objectives.stability_limit", "write 0.05"),
    ("stale_before_heartbeat", {"study.heartbeat_s": 10, "study.stale_after_s": 5}, "study.stale_after_s",
     "heartbeat_s"),
    ("study_name_empty", {"study.name": ""}, "study.name", "empty"),
    ("study_name_quote", {"study.name": "it's"}, "study.name", "letters"),
    ("study_name_dotdot", {"study.name": ".."}, "study.name", "letters"),
    ("study_name_slash", {"study.name": "a/b"}, "study.name", "letters"),
    ("experiment_empty", {"tracking.experiment": ""}, "tracking.experiment", "empty"),
    # --- a field the message used to blame wrongly --------------------------------------------------
]


@pytest.mark.parametrize("overrides, field, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_nonsense_value_is_refused_naming_its_field(tmp_path, capsys, overrides, field, fragment):
    if field == "probe.device":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU: probe.device cuda is valid here")
    path = write_space(tmp_path, tiny_space_dict(**overrides))
    code = main(["validate", str(path)])
    err = capsys.readouterr().err
    assert code == 2, f"accepted: {err!r}"
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{path}: {field}: " in err, f"does not name {field}: {err!r}"
    assert fragment in err, f"{fragment!r} not in {err!r}"


def test_a_gpu_space_is_checked_on_cpu_and_refused_only_by_run(tmp_path, capsys):
    """``probe.device: cuda`` on a machine without one: ``validate`` checks the rest, exits 0 and names what it
    could not check; ``run`` refuses naming probe.device (a user checks a GPU space before renting the GPU)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: probe.device cuda is valid here")
    path = write_space(tmp_path, tiny_space_dict(**{"probe.device": "cuda"}))
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Not checked here" in out and "probe.device cuda" in out, out
    assert main(["run", str(path), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: probe.device: " in err and "cuda" in err and "Traceback" not in err, err


@pytest.mark.parametrize("overrides", [
    {"search.clip_grad": None}, {"search.clip_grad": {"choices": [None, 0.5, 1.0]}},
    {"search.recipe.amax_history_len": {"choices": [1, 1024]}}, {"search.recipe.margin": {"low": 0, "high": 3}},
    {"probe.lr_warmup_steps": 11}, {"probe.betas": [0.0, 0.999]}, {"study.name": "my-study_2.v1"},
    {"objectives": {"stability_unit": "noise", "stability_limit": 5, "reference_seeds": 2}},
    _groups({**ATTN, "layers": {"first": 1, "last": 1}}, MLP), _groups({**ATTN, "layers": {"first": 2}}, MLP),
    _groups(ATTN, MLP, {"name": "head", "modules": ["output_layer"], "precision": "bf16"}),
], ids=["clip_null", "clip_choices", "amax_1", "margin_range", "lr_warmup_one_less", "betas_edges", "name_chars", "noise_limit_5",
        "first_and_last", "first_all", "head_group"])
def test_sensible_values_still_pass(tmp_path, capsys, overrides):
    """The refusals above must not catch their sensible neighbours (a check that refuses everything passes them)."""
    path = write_space(tmp_path, tiny_space_dict(**overrides))
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err
