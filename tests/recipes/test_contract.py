"""The contract of :class:`precsearch.recipes.Recipe`, with every consumer run over every registered recipe.

A new precision in the registry runs here with no change to this file; if a test fails for it, the consumer
the test names (capability checks, the emulated quantizer, the TE recipe, the memory model, the space's inert
rules, validate's soak check, an exporter) would give a wrong answer, or none, for it.
"""

from __future__ import annotations

import copy
import sys
import types

import pytest
import torch

from precsearch.arch import PRESETS
from precsearch.arch.units import OUTPUT_LAYER, unit_names
from precsearch.backends.capability import te_reason, torchao_reason
from precsearch.backends.te import make_te_recipe, recipe_key
from precsearch.config.inert import inert_in
from precsearch.config.loader import parse_space
from precsearch.config.soak_checks import check_soak, soak_warnings
from precsearch.config.space import RecipeSection
from precsearch.errors import UserError
from precsearch.export.accelerate import accelerate_files, choose_path
from precsearch.export.megatron import megatron_export, megatron_table
from precsearch.export.torchtitan import torchtitan_export
from precsearch.fp8.nvfp4 import NVFP4_BLOCK
from precsearch.fp8.scaling import ROLES, SCALERS, make_scaler
from precsearch.policy import Policy
from precsearch.policy.file import dump_policy, parse_policy
from precsearch.precision import LayerRecipe, Precision
from precsearch.probe.memory.peak import predict_peak, saved_linear_input_bytes
from precsearch.recipes import BLACKWELL, DEFAULT_PRECISION, HOPPER, RECIPES, SETTINGS, Recipe, readers, recipe_for
from precsearch.search.sensitivity import first_recipe, speed_effect
from precsearch.soak import SoakFinding

from _spaces import tiny_space_dict

import yaml

#: The lowest signal-to-noise ratio a recipe's round trip may have on a Gaussian tensor: FP4 elements keep
#: about 13 dB, FP8 ones about 30 dB; below this the quantizer is broken, not coarse.
MIN_SNR_DB = 10.0
N_LAYERS = 4


@pytest.fixture(params=list(RECIPES), ids=[p.value for p in RECIPES])
def recipe(request) -> Recipe:
    return RECIPES[request.param]


def _low(recipe: Recipe) -> None:
    if not recipe.low:
        pytest.skip("BF16 quantizes nothing")


def test_the_registry_holds_each_precision_once(recipe):
    """Every enum member has one recipe, found by member or value; else a consumer meets a KeyError at run time."""
    assert set(RECIPES) == set(Precision)
    assert recipe_for(recipe.precision) is recipe is recipe_for(recipe.name)
    assert recipe.spec.label and recipe.spec.data_bits in (4, 8, 16)


def test_its_settings_are_layer_recipe_fields_and_the_space_offers_them(recipe):
    """A setting the space file cannot search, or the policy cannot hold, could never reach the recipe."""
    assert set(recipe.settings) <= set(SETTINGS) <= set(RecipeSection.model_fields)
    for setting in recipe.settings:
        assert recipe.precision in readers(setting)


def test_a_setting_it_does_not_read_is_unsampled_where_it_runs_alone(recipe):
    """The sampler leaves out exactly the recipe settings no layer of the trial reads (derived from the recipes);
    a wrong derivation samples dead settings, or freezes live ones."""
    unread = {f"recipe.{s}" for s in SETTINGS if s not in recipe.settings}
    assert {s for s in inert_in({DEFAULT_PRECISION, recipe.precision}) if s.startswith("recipe.")} == unread


def test_the_te_cache_key_follows_its_settings(recipe):
    """Layers differing only in a setting the recipe does not read share one TE recipe object; in one it reads,
    they do not (else TE runs one layer with the other's settings)."""
    base = LayerRecipe(recipe.precision)
    for setting in SETTINGS:
        value = getattr(base, setting)
        other = {"fp8_format": "e4m3", "amax_history_len": 16, "amax_compute_algo": "most_recent", "margin": 1}.get(
            setting, not value)
        changed = LayerRecipe(recipe.precision, **{setting: other})
        assert (recipe_key(changed) != recipe_key(base)) == (setting in recipe.settings), setting


def test_the_emulated_quantizer_round_trips_every_role(recipe):
    """Each role of a low precision has a scaler of a known family that keeps a Gaussian tensor above
    :data:`MIN_SNR_DB`; BF16 has none (the emulated backend leaves its layers alone)."""
    layer = LayerRecipe(recipe.precision)
    if not recipe.low:
        assert recipe.emulation is None
        with pytest.raises(ValueError, match="needs no FP8 scaler"):
            make_scaler(layer, "input")
        return
    assert recipe.emulation in SCALERS
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    for role in ROLES:
        scaler = make_scaler(layer, role)
        for _ in range(2 if recipe.history else 1):  # a history recipe reads the amax of the call before
            out = scaler.quantize(x)
        snr = 10 * torch.log10(x.pow(2).sum() / (out - x).pow(2).sum())
        assert out.shape == x.shape and snr > MIN_SNR_DB, (role, float(snr))


def test_its_blocks_are_the_quantizers(recipe):
    """The spec's blocks are what the emulation uses (the memory model counts scale bytes from them)."""
    if recipe.emulation in ("block", "mx"):
        scaler = make_scaler(LayerRecipe(recipe.precision), "input")
        assert scaler.block == recipe.spec.activation_block
    if recipe.emulation == "two_level_fp4":
        assert recipe.spec.activation_block == (1, NVFP4_BLOCK)


def test_transformer_engine_runs_it_on_blackwell_or_says_why(recipe):
    """On a B200 (10.0, CUDA 12.9) TE runs every recipe it has; one it lacks is refused with its reason, on every
    GPU; without a GPU every low recipe is refused."""
    on_b200 = te_reason(recipe.precision, BLACKWELL, (12, 9))
    assert on_b200 == recipe.te_never
    on_h100 = te_reason(recipe.precision, HOPPER, (12, 9))
    needs_more = recipe.low and recipe.spec.min_capability > HOPPER
    assert (on_h100 is not None) == (needs_more or recipe.te_never is not None)
    assert (recipe.spec.te_recipe is None) == (not recipe.low or recipe.te_never is not None)
    if recipe.low:
        assert te_reason(recipe.precision, None) is not None


def test_below_its_lowest_gpu_it_is_refused_by_its_label(recipe):
    """A GPU under the spec's minimum capability is refused naming the recipe's label."""
    need = recipe.spec.min_capability
    if need is None or recipe.te_never:
        return
    below = (need[0] - 1, 0)
    assert recipe.spec.label in te_reason(recipe.precision, below, (12, 9))


def test_torchao_runs_it_or_says_why(recipe):
    """Exactly one of: a torchao recipe name, or a reason that holds on every GPU (BF16: neither)."""
    if not recipe.low:
        assert torchao_reason(recipe.precision, None) is None
        return
    assert (recipe.spec.torchao_recipe is None) == (recipe.torchao_never is not None)
    assert torchao_reason(recipe.precision, BLACKWELL) == recipe.torchao_never


def test_te_builds_its_recipe_class(recipe, monkeypatch):
    """make_te_recipe picks the spec's TE class with the recipe's arguments; a stand-in TE module records which
    (TE needs a GPU here)."""
    if recipe.spec.te_recipe is None:
        return
    fake = types.ModuleType("transformer_engine.common.recipe")
    setattr(fake, recipe.spec.te_recipe, lambda **kw: (recipe.spec.te_recipe, kw))
    fake.Format = types.SimpleNamespace(HYBRID="HYBRID", E4M3="E4M3")
    common = types.ModuleType("transformer_engine.common")
    common.recipe = fake
    monkeypatch.setitem(sys.modules, "transformer_engine", types.ModuleType("transformer_engine"))
    monkeypatch.setitem(sys.modules, "transformer_engine.common", common)
    monkeypatch.setitem(sys.modules, "transformer_engine.common.recipe", fake)
    name, kwargs = make_te_recipe(LayerRecipe(recipe.precision))
    assert name == recipe.spec.te_recipe
    assert ("fp8_format" in kwargs) == recipe.fp8_encoded


def test_its_memory_terms_never_exceed_bf16(recipe):
    """Stored bytes per element are positive and, for a low recipe, under BF16's 2; a model all in it saves less
    for the backward than all BF16 and peaks no higher (else the memory objective rewards BF16 over it)."""
    spec = recipe.spec
    assert 0 < spec.activation_bytes <= 2 and 0 < spec.weight_bytes <= 2 and recipe.head_transient_bytes >= 0
    assert (spec.activation_bytes < 2) == recipe.low
    cfg = PRESETS["llama3-8b"].with_overrides(n_layers=2)
    mine = {u: recipe.precision for u in unit_names(cfg) if u != OUTPUT_LAYER}
    saved = saved_linear_input_bytes(cfg, mine, "bf16"), saved_linear_input_bytes(cfg, {}, "bf16")
    assert (saved[0] < saved[1]) == recipe.low
    assert predict_peak(cfg, mine, seq_len=256, micro_batch=1).total <= predict_peak(cfg, {}, seq_len=256,
                                                                                     micro_batch=1).total


def test_the_sensitivity_table_has_a_speed_for_it(recipe):
    """BF16 saves nothing; a low recipe saves GEMM time by its nominal rate."""
    cfg = PRESETS["llama3-8b"].with_overrides(n_layers=2)
    assert (speed_effect(cfg, "decoder.layers.0.mlp.linear_fc1", recipe.precision) > 0) == recipe.low


def test_a_policy_in_it_round_trips_through_yaml(recipe):
    """policy.yaml holds the precision's name and reads it back (the name is the enum's value)."""
    policy = Policy(default=recipe.precision)
    back, _ = parse_policy(yaml.safe_load(dump_policy(policy)))
    assert back.default is recipe.precision


def _uniform(recipe: Recipe) -> Policy:
    return Policy(default=recipe.precision)


def test_megatron_names_it_or_keeps_it_bf16_saying_why(recipe):
    """A uniform policy becomes Megatron's global recipe flag with the spec's name, or every module stays BF16
    with a warning carrying the recipe's reason."""
    _low(recipe)
    flags, _, warnings = megatron_export(_uniform(recipe), N_LAYERS)
    if recipe.spec.megatron_recipe:
        flag = "--fp4-recipe" if recipe.spec.data_bits == 4 else "--fp8-recipe"
        assert flags[flags.index(flag) + 1] == recipe.spec.megatron_recipe
    else:
        table, _ = megatron_table(_uniform(recipe), N_LAYERS)
        assert set(table.values()) == {DEFAULT_PRECISION} and "--fp8-recipe" not in flags
        assert any(recipe.megatron_never in w for w in warnings)


def test_torchtitan_names_it_or_keeps_it_bf16_saying_why(recipe):
    """Either its converter and recipe name from the spec, or no converter and a warning with the reason."""
    _low(recipe)
    settings, warnings = torchtitan_export(_uniform(recipe), N_LAYERS)
    if recipe.spec.torchtitan:
        converter, key, name = recipe.spec.torchtitan
        assert settings["converters"] == [converter] and settings[key]["recipe_name"] == name
    else:
        assert settings["converters"] == [] and any(recipe.torchtitan_never in w for w in warnings)


def test_accelerate_writes_a_setup_for_it(recipe):
    """A uniform policy gets Accelerate's TE path (TERecipeKwargs builds it), its torchao path (a torchao recipe),
    or precsearch's own API with policy.yaml; the snippet is valid Python either way."""
    path, _ = choose_path(_uniform(recipe), N_LAYERS)
    expected = ("bf16" if not recipe.low else "te" if recipe.accelerate_te and not recipe.accelerate_te_problem(
        LayerRecipe()) else "ao" if recipe.spec.torchao_recipe else "precsearch")
    assert path == expected
    rendered = accelerate_files(_uniform(recipe), N_LAYERS, {})
    compile(rendered.files["accelerate_fp8.py"], "accelerate_fp8.py", "exec")
    if path == "ao":
        assert recipe.spec.torchao_recipe in rendered.files["accelerate_fp8.py"]


def test_the_sensitivity_pass_takes_every_setting():
    """The sensitivity pass builds its recipe from the space's first choices of every recipe setting (derived
    from :data:`SETTINGS`, not listed again)."""
    space = types.SimpleNamespace(search=types.SimpleNamespace(recipe=RecipeSection()))
    assert first_recipe(space) == LayerRecipe()


def test_the_emulated_backend_trains_a_layer_in_it(recipe):
    """The emulated backend (the CPU path every study can take) converts a Linear to the recipe, and its output
    and weight gradient stay above :data:`MIN_SNR_DB` against the unconverted layer's; BF16 is left alone."""
    from torch import nn

    from precsearch.backends.emulated import EmulatedBackend

    torch.manual_seed(0)
    backend, ref = EmulatedBackend(), nn.Sequential(nn.Linear(128, 64, bias=False))
    model = backend.convert(copy.deepcopy(ref), {"0": LayerRecipe(recipe.precision)})
    assert backend.converted_layers(model) == ({"0": recipe.precision} if recipe.low else {})
    x = torch.randn(32, 128)
    pairs = []
    for m in (model, ref):
        out = m(x)
        (out * torch.linspace(-1, 1, 64)).sum().backward()
        pairs.append((out.detach(), next(m.parameters()).grad))
    for mine, theirs in zip(*pairs):
        snr = 10 * torch.log10(theirs.pow(2).sum() / (mine - theirs).pow(2).sum().clamp_min(1e-30))
        assert snr > MIN_SNR_DB, float(snr)


def test_it_states_its_soak_and_validate_reads_it(recipe):
    """Every recipe sets :attr:`Recipe.soak` in its own class (a finding, or None where no long run has passed it);
    a space offering it for a layer validates when it has a finding; is refused, opt-in or not, naming the group,
    the recipe and what its row measured when its long run failed (:attr:`Recipe.soak_refused`); and otherwise is
    refused unless ``search.allow_unsoaked``, which warns instead. Else validate offers GEMMs no long run has
    passed, or refuses ones that did."""
    assert "soak" in vars(type(recipe)) and (recipe.soak is None or isinstance(recipe.soak, SoakFinding))
    groups = [{"name": "mlp", "modules": ["*.mlp.*"], "precision": {"choices": sorted({DEFAULT_PRECISION.value, recipe.name})}}]
    space = parse_space(tiny_space_dict(**{"search.groups": groups}))
    allowed = parse_space(tiny_space_dict(**{"search.groups": groups, "search.allow_unsoaked": True}))
    if recipe.soak is not None:
        assert recipe.soak.non_finite == 0 and recipe.soak.date and not recipe.soak_refused  # passed: not refused
        check_soak(space)
        return
    offers = rf"search.groups\[0\].precision: '{recipe.name}' offers {recipe.spec.label}"
    if recipe.soak_refused:
        for refused in (space, allowed):  # no opt-in offers what failed
            with pytest.raises(UserError, match=offers + ".*which the long runs refused") as e:
                check_soak(refused)
            assert recipe.soak_refused in str(e.value)
        assert soak_warnings(allowed) == []
        return
    with pytest.raises(UserError, match=offers + ".*no long run has passed") as e:
        check_soak(space)
    assert "no bench_soak row runs it" in str(e.value)
    check_soak(allowed)
    assert [w.split(" offers")[0] for w in soak_warnings(allowed)] == [f"search.groups[0].precision: '{recipe.name}'"]


def test_a_recipe_must_state_its_soak():
    """A new precision cannot leave its soak unsaid (None must be written)."""
    with pytest.raises(TypeError, match="soak"):
        type("Unsaid", (Recipe,), {"precision": Precision.BF16, "spec": RECIPES[Precision.BF16].spec})
