"""Tiny Llama GGUF files that tests write themselves with the gguf package's writer (imported by tests).

The file is laid out as llama.cpp's converter lays out a Hugging Face Llama: tensor names
``token_embd.weight``, ``blk.N.attn_q.weight``, ..., dimensions innermost first, and the rows of each
head of ``attn_q`` / ``attn_k`` reordered for llama.cpp's RoPE (pairs (0, 1), (2, 3), ... where Hugging
Face rotates halves). :func:`write_llama_gguf` returns what a correct reader must give back: each tensor
in the Hugging Face layout after the file's own quantisation round trip.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

#: 9 query / 3 KV heads of size 64 (SmolLM2's attention), 2 blocks, tied embeddings.
SHAPE = dict(vocab=320, dim=576, n_heads=9, n_kv_heads=3, ffn=256, blocks=2, eps=1e-5, theta=100000.0, context=2048)
#: GGUF tensor name suffix -> the type it is stored in (the rest are F32): a float16, and two block quantisations.
TYPES = {"attn_q.weight": "Q8_0", "attn_k.weight": "F16", "ffn_gate.weight": "Q4_1", "attn_v.weight": "Q8_0",
         "token_embd.weight": "F16"}
GGUF_OF_HF = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight", "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}


def gguf_name(hf: str) -> str:
    """The GGUF name of a Hugging Face Llama tensor name."""
    if hf.startswith("model.layers."):
        i, rest = hf[len("model.layers."):].split(".", 1)
        return f"blk.{i}.{GGUF_OF_HF[rest]}"
    return GGUF_OF_HF[hf]


def llama_cpp_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Hugging Face q/k rows -> llama.cpp's: per head, (half r, index j) -> (pair j, member r)."""
    rows, cols = w.shape
    return w.reshape(n_heads, 2, rows // n_heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def hf_state(seed: int = 0, tied: bool = True, **shape) -> dict[str, np.ndarray]:
    """A random float32 Llama state dict in Hugging Face names (norms around 1, weights ~ N(0, 0.05))."""
    s = SHAPE | shape
    rng = np.random.default_rng(seed)
    kv = s["n_kv_heads"] * s["dim"] // s["n_heads"]

    def w(*size: int) -> np.ndarray:
        return (0.05 * rng.standard_normal(size)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1 + 0.3 * rng.standard_normal(s["dim"])).astype(np.float32)

    out = {"model.embed_tokens.weight": w(s["vocab"], s["dim"]), "model.norm.weight": norm()}
    if not tied:
        out["lm_head.weight"] = w(s["vocab"], s["dim"])
    for i in range(s["blocks"]):
        out |= {f"model.layers.{i}.{k}": v for k, v in {
            "input_layernorm.weight": norm(), "post_attention_layernorm.weight": norm(),
            "self_attn.q_proj.weight": w(s["dim"], s["dim"]), "self_attn.k_proj.weight": w(kv, s["dim"]),
            "self_attn.v_proj.weight": w(kv, s["dim"]), "self_attn.o_proj.weight": w(s["dim"], s["dim"]),
            "mlp.gate_proj.weight": w(s["ffn"], s["dim"]), "mlp.up_proj.weight": w(s["ffn"], s["dim"]),
            "mlp.down_proj.weight": w(s["dim"], s["ffn"])}.items()}
    return out


def write_llama_gguf(path: Path, state: dict[str, np.ndarray], *, types: dict[str, str] | None = None,
                     arch: str = "llama", **shape) -> dict[str, np.ndarray]:
    """Write ``state`` (Hugging Face names) to ``path`` as llama.cpp would; return each tensor as a correct
    reader gives it back (Hugging Face layout, after the quantisation round trip of its type)."""
    gguf = pytest.importorskip("gguf")
    s = SHAPE | shape
    types = TYPES if types is None else types
    writer = gguf.GGUFWriter(str(path), arch)
    write_metadata(writer, s)
    expected = {}
    for hf, value in state.items():
        name = gguf_name(hf)
        kind = gguf.GGMLQuantizationType[next((t for k, t in types.items() if name.endswith(k)), "F32")]
        heads = {"attn_q.weight": s["n_heads"], "attn_k.weight": s["n_kv_heads"]}.get(name.split(".", 2)[-1])
        stored = llama_cpp_rows(value, heads) if heads else value
        data = gguf.quants.quantize(stored, kind)
        writer.add_tensor(name, data, raw_dtype=kind)
        # quantisation works along rows, so it commutes with the row permutation
        expected[hf] = gguf.quants.dequantize(gguf.quants.quantize(value, kind), kind).astype(np.float32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def write_metadata(writer, s: dict) -> None:
    """The llama.* keys llama.cpp writes for a model of sizes ``s`` (:data:`SHAPE`)."""
    writer.add_name("tiny-llama")
    writer.add_context_length(s["context"])
    writer.add_embedding_length(s["dim"])
    writer.add_block_count(s["blocks"])
    writer.add_feed_forward_length(s["ffn"])
    writer.add_head_count(s["n_heads"])
    writer.add_head_count_kv(s["n_kv_heads"])
    writer.add_rope_dimension_count(s["dim"] // s["n_heads"])
    writer.add_rope_freq_base(s["theta"])
    writer.add_layer_norm_rms_eps(s["eps"])
    writer.add_vocab_size(s["vocab"])


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte alphabet: byte -> the printable character a byte-level vocabulary spells it with (printable
    Latin-1 bytes stand for themselves, the 68 others for code points 256, 257, ... in byte order)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in kept]
    return dict(sorted(({b: chr(b) for b in kept} | {b: chr(256 + i) for i, b in enumerate(moved)}).items()))


#: A tiny byte-level BPE tokenizer as llama.cpp stores one: a control token, the 256 bytes, a few merges.
TINY_MERGES = ("Ġ t", "h e", "Ġt he", "Ġ Ġ", "1 2")


def tiny_tokenizer(model: str = "gpt2", pre: str | None = "smollm") -> dict:
    """The ``tokenizer.ggml.*`` metadata of :data:`TINY_MERGES` (id 0 ``<|endoftext|>``, bytes from id 1 in
    byte order, then each merge's result), as :func:`write_tokenizer_gguf` takes it."""
    tokens = ["<|endoftext|>", *byte_alphabet().values(), *(m.replace(" ", "") for m in TINY_MERGES)]
    meta = {"model": model, "tokens": tokens, "merges": list(TINY_MERGES), "types": [3] + [1] * (len(tokens) - 1)}
    return meta if pre is None else meta | {"pre": pre}


def write_tokenizer_gguf(path: Path, tokenizer: dict, drop: tuple[str, ...] = ()) -> Path:
    """A Llama GGUF holding only metadata: :func:`write_metadata`'s and the tokenizer ``tokenizer``
    (:func:`tiny_tokenizer`), less the ``tokenizer.ggml.<name>`` keys named in ``drop`` (no tensors: a
    tokenizer reader needs none)."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    write_metadata(writer, SHAPE | {"vocab": len(tokenizer["tokens"])})
    adders = {"model": writer.add_tokenizer_model, "pre": writer.add_tokenizer_pre, "tokens": writer.add_token_list,
              "merges": writer.add_token_merges, "types": writer.add_token_types}
    for name, value in tokenizer.items():
        if name not in drop:
            adders[name](value)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
