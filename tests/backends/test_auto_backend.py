"""``backend: auto`` picks Transformer Engine only where it runs every precision the space can choose,
and the emulation note appears exactly when Blackwell recipes run emulated."""

from __future__ import annotations

import pytest
import torch

from precsearch import backends
from precsearch.backends import capability
from precsearch.backends.capability import emulation_note, te_table
from precsearch.precision import Precision

P = Precision
CUDA = torch.device("cuda")


@pytest.fixture
def te_importable(monkeypatch):
    monkeypatch.setattr(capability, "te_import_error", lambda: None)


@pytest.mark.parametrize("cap, needs, chosen", [
    ((9, 0), {P.BF16, P.FP8_CURRENT}, "te"),          # an H100/H200 space: TE
    ((9, 0), {P.BF16, P.FP8_CURRENT, P.NVFP4}, "emulated"),  # the B200 space on an H200: emulated, all trials
    ((10, 0), {P.BF16, P.MXFP8, P.NVFP4}, "te"),      # the B200 space on a B200: TE
    ((12, 0), {P.MXFP8}, "emulated"),                 # TE refuses MXFP8 on consumer Blackwell
])
def test_auto_backend_needs_every_precision_on_te(te_importable, monkeypatch, cap, needs, chosen):
    """A space mixing recipes must not get TE where TE refuses one of them (every such trial would fail)."""
    monkeypatch.setattr(capability, "te_support", lambda device: te_table(cap, (13, 0)))
    assert backends._auto_backend(CUDA, needs) == chosen


def test_auto_backend_on_cpu_is_emulated():
    assert backends._auto_backend(torch.device("cpu"), {P.FP8_CURRENT}) == "emulated"


def test_emulation_note_only_for_emulated_blackwell_recipes():
    """The note must name the emulated Blackwell recipes and say speed and memory are not a B200's;
    it would mislead on TE or for Hopper recipes."""
    note = emulation_note("emulated", {P.BF16, P.NVFP4, P.MXFP8, P.FP8_CURRENT}, "cuda")
    assert note.startswith("note: mxfp8 and nvfp4 run emulated on cuda") and "not a B200's" in note
    assert emulation_note("te", {P.NVFP4}, "cuda") is None
    assert emulation_note("emulated", {P.FP8_CURRENT, P.FP8_DELAYED}, "cpu") is None
