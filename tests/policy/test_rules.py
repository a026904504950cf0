"""Policy rules: glob patterns, block selectors, first match wins, YAML round trip."""

from precsearch.policy import Policy, Rule, block_index
from precsearch.policy.file import dump_policy, load_policy_file, save_policy
from precsearch.precision import LayerRecipe, Precision

import pytest

from precsearch.errors import UserError

NAMES = [f"model.layers.{i}.{s}" for i in range(4) for s in ("self_attn.q_proj", "mlp.down_proj")] + ["lm_head"]


def test_block_index():
    assert block_index("model.layers.12.mlp.up_proj") == 12
    assert block_index("decoder.layers.3.self_attention.linear_qkv") == 3
    assert block_index("lm_head") is None


def test_first_match_wins_and_default_applies():
    """Edge blocks kept BF16 must override the later attention rule; unmatched layers take the default."""
    policy = Policy(
        rules=(
            Rule("edges", ("*",), Precision.BF16, first=1, last=1),
            Rule("attn", ("*.self_attn.*",), Precision.FP8_DELAYED),
        ),
        default=Precision.FP8_CURRENT,
    )
    got = {n: policy.precision_for(n, 4) for n in NAMES}
    assert got["model.layers.0.self_attn.q_proj"] is Precision.BF16
    assert got["model.layers.3.self_attn.q_proj"] is Precision.BF16
    assert got["model.layers.1.self_attn.q_proj"] is Precision.FP8_DELAYED
    assert got["model.layers.2.mlp.down_proj"] is Precision.FP8_CURRENT
    assert got["lm_head"] is Precision.FP8_CURRENT  # block selectors never match lm_head


def test_indices_selector_and_recipe_settings_carry():
    policy = Policy(rules=(Rule("mid", ("*",), Precision.FP8_DELAYED, indices=(2,)),),
                    recipe=LayerRecipe(amax_history_len=16, margin=1))
    recipes = policy.layer_recipes(NAMES, 4)
    fp8 = {n for n, r in recipes.items() if r.precision.is_fp8}
    assert fp8 == {"model.layers.2.self_attn.q_proj", "model.layers.2.mlp.down_proj"}
    assert recipes["model.layers.2.mlp.down_proj"].amax_history_len == 16
    assert recipes["model.layers.2.mlp.down_proj"].margin == 1


def test_policy_file_round_trip(tmp_path):
    policy = Policy(rules=(Rule("a", ("*.mlp.*",), Precision.FP8_BLOCK, last=2),), default=Precision.BF16,
                    recipe=LayerRecipe(fp8_format="e4m3"), warmup_steps=7, clip_grad=0.5)
    path = tmp_path / "policy.yaml"
    save_policy(policy, path, {"study": "s", "trial": 3})
    loaded, provenance = load_policy_file(path)
    assert loaded == policy
    assert provenance == {"study": "s", "trial": 3}


def test_newer_or_malformed_policy_file_is_refused(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(dump_policy(Policy()).replace("schema_version: 1", "schema_version: 99"))
    with pytest.raises(UserError, match="schema_version 99"):
        load_policy_file(path)
    path.write_text("policy:\n  default: fp9\nschema_version: 1\n")
    with pytest.raises(UserError, match="malformed"):
        load_policy_file(path)
    path.write_text("just: text\n")
    with pytest.raises(UserError, match="not a precsearch policy"):
        load_policy_file(path)


def test_nvfp4_switches_round_trip_and_are_type_checked(tmp_path):
    """An exported NVFP4 policy must reload with its switches (else the training stack runs TE's defaults),
    and a non-boolean switch must be refused naming the field."""
    import yaml

    from precsearch.errors import UserError
    from precsearch.policy.file import parse_policy
    from precsearch.precision import LayerRecipe, Precision

    policy = Policy(default=Precision.NVFP4, recipe=LayerRecipe(nvfp4_rht=False, nvfp4_stochastic_rounding=False))
    path = tmp_path / "policy.yaml"
    save_policy(policy, path)
    loaded, _ = load_policy_file(path)
    assert loaded.recipe == policy.recipe
    data = yaml.safe_load(dump_policy(policy))
    data["policy"]["recipe"]["nvfp4_2d_weights"] = "yes"
    with pytest.raises(UserError, match="nvfp4_2d_weights"):
        parse_policy(data)
