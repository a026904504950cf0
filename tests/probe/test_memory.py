"""The memory model: component arithmetic and the direction of FP8's effects."""

from precsearch.precision import Precision
from precsearch.probe.memory import linear_shapes, predict_peak
from precsearch.probe.model import PRESETS, linear_layer_names

CFG = PRESETS["tiny"]


def test_bf16_static_part_is_16_bytes_per_param():
    """fp32 params + fp32 grads + two fp32 AdamW moments."""
    m = predict_peak(CFG, {}, seq_len=128, micro_batch=8)
    n = CFG.num_params()
    assert m.params + m.grads + m.optimizer == 16 * n


def test_fp8_halves_saved_linear_inputs():
    names = linear_layer_names(CFG)
    bf16 = predict_peak(CFG, {}, seq_len=128, micro_batch=8)
    fp8 = predict_peak(CFG, {n: Precision.FP8_CURRENT for n in names}, seq_len=128, micro_batch=8)
    assert fp8.linear_inputs * 2 == bf16.linear_inputs
    assert fp8.weight_copies == bf16.weight_copies  # FP8 + transpose (2 x 1 B) vs one BF16 cast (2 B)
    assert fp8.total < bf16.total


def test_weights_dominate_at_short_sequences_so_fp8_saves_little():
    """With few tokens, activations are small: FP8's saving must shrink towards zero."""
    names = linear_layer_names(PRESETS["llama3-8b"].with_overrides(n_layers=2))
    cfg = PRESETS["llama3-8b"].with_overrides(n_layers=2)
    fp8 = {n: Precision.FP8_DELAYED for n in names}
    short = 1 - predict_peak(cfg, fp8, seq_len=16, micro_batch=1).total / predict_peak(cfg, {}, seq_len=16, micro_batch=1).total
    long = 1 - predict_peak(cfg, fp8, seq_len=8192, micro_batch=1).total / predict_peak(cfg, {}, seq_len=8192, micro_batch=1).total
    assert 0 <= short < 0.001 < long


def test_linear_shapes_match_the_model():
    shapes = linear_shapes(CFG)
    assert shapes["self_attn.k_proj"] == (CFG.dim, CFG.n_kv_heads * CFG.head_dim)
    assert shapes["mlp.down_proj"] == (CFG.ffn_dim, CFG.dim)


def test_bf16_parameters_halve_the_static_part_and_drop_the_cast():
    """BF16 params: 2 + 2 + 4 bytes/param, and no autocast weight cast for BF16 layers."""
    m = predict_peak(CFG, {}, seq_len=128, micro_batch=8, param_dtype="bf16")
    assert m.params + m.grads + m.optimizer == 8 * CFG.num_params()
    assert m.weight_copies == 0


def test_fp8_raises_memory_at_llama3_8b_shape_with_bf16_params():
    """The mission's measurement: TE FP8 as a drop-in raised peak memory (+16%) at 8B, seq 4096, mb 1.

    The model must at least get the sign right: FP8 weight copies outweigh the
    activations FP8 saves when parameters are BF16 and the micro-batch is 1.
    """
    cfg = PRESETS["llama3-8b"]
    fp8 = {n: Precision.FP8_DELAYED for n in linear_layer_names(cfg) if n != "lm_head"}
    bf16 = predict_peak(cfg, {}, seq_len=4096, micro_batch=1, param_dtype="bf16").total
    fp8_total = predict_peak(cfg, fp8, seq_len=4096, micro_batch=1, param_dtype="bf16").total
    assert 1.05 < fp8_total / bf16 < 1.30


def test_memory_knobs_move_the_optimizer_and_weight_bytes():
    """Master weights add 4 B/param; BF16 moments halve the moments; FP8 weights drop the per-step copy."""
    from precsearch.policy import MemoryKnobs

    cfg = PRESETS["llama3-8b"].with_overrides(n_layers=2)
    fp8 = {n: Precision.FP8_CURRENT for n in linear_layer_names(cfg) if n != "lm_head"}
    kw = dict(seq_len=1024, micro_batch=1, param_dtype="bf16")
    n = cfg.num_params()
    plain = predict_peak(cfg, fp8, **kw)
    master = predict_peak(cfg, fp8, memory=MemoryKnobs(master_weights=True, moment_dtype="fp32"), **kw)
    assert master.optimizer == n * (8 + 4)
    lean = predict_peak(cfg, fp8, memory=MemoryKnobs(master_weights=True, moment_dtype="bf16"), **kw)
    assert lean.optimizer == n * (4 + 4)
    stored = predict_peak(cfg, fp8, memory=MemoryKnobs(master_weights=True, moment_dtype="bf16", fp8_weights=True), **kw)
    assert stored.weight_copies == 0 < plain.weight_copies
    assert stored.optimizer == n * (8 + 4)  # FP8 weights force FP32 moments (TE's kernel)


def test_fp8_weights_imply_master_weights_and_fp32_moments():
    from precsearch.policy import MemoryKnobs

    knobs = MemoryKnobs(moment_dtype="bf16", fp8_weights=True)
    assert knobs.uses_master_weights and knobs.moments("bf16") == "fp32"
    assert MemoryKnobs(moment_dtype="param").moments("bf16") == "bf16"
