"""What a backend runs, answered without torch (``backends/support.py``), against the backend once built.

``precsearch validate`` checks a CPU space with the registry entry's ``support`` instead of building the
backend. If these fail, the two answers have drifted apart: a CPU space would validate and then be refused
by its probe (or the other way round).
"""

from __future__ import annotations

import pytest
import torch

from precsearch.backends import BACKENDS, backend_support, chosen_backend, get_backend
from precsearch.policy.rules import MemoryKnobs
from precsearch.precision import LayerRecipe, Precision

KNOBS = [MemoryKnobs(), MemoryKnobs(master_weights=True, moment_dtype="fp32"), MemoryKnobs(fp8_attention="dpa")]
WITH_SUPPORT = [name for name, entry in BACKENDS.items() if entry.support is not None]


def test_the_emulated_backend_answers_without_being_built():
    assert "emulated" in WITH_SUPPORT


@pytest.mark.parametrize("name", WITH_SUPPORT)
def test_support_answers_as_the_built_backend_does_on_a_cpu(name):
    support, built = BACKENDS[name].support(), get_backend(name, torch.device("cpu"))
    assert support.name == built.name == name
    assert support.supported_precisions("cpu") == built.supported_precisions(torch.device("cpu"))
    for knobs in KNOBS:
        assert support.memory_knob_problem(knobs, "cpu") == built.memory_knob_problem(knobs, torch.device("cpu"))


def test_a_refusal_reads_the_same_from_either_side(monkeypatch):
    """The message names the recipe, the layer and the device as before (a device name prints as the device)."""
    from precsearch.backends.support import EmulatedSupport, UnsupportedRecipe

    monkeypatch.setattr(EmulatedSupport, "supported_precisions", lambda self, device: {Precision.BF16: None,
                                                                                        Precision.NVFP4: "no"})
    recipes = {"layer": LayerRecipe(precision=Precision.NVFP4)}
    messages = []
    for backend, device in ((EmulatedSupport(), "cpu"), (get_backend("emulated", torch.device("cpu")),
                                                          torch.device("cpu"))):
        with pytest.raises(UnsupportedRecipe) as info:
            backend.check_supported(recipes, device)
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "'nvfp4' (layer layer) on cpu: no. Valid here: bf16" in messages[0]


def test_which_spaces_answer_without_torch():
    """Only a CPU device, and only a backend with support data (auto resolves to emulated on a CPU)."""
    assert backend_support("auto", "cpu").name == "emulated"
    assert backend_support("emulated", "cpu").name == "emulated"
    assert backend_support("emulated", "auto") is None and backend_support("emulated", "cuda") is None
    assert backend_support("te", "cpu") is None and backend_support("no-such-backend", "cpu") is None
    assert chosen_backend("auto", "cpu", [Precision.NVFP4]) == ("emulated", "cpu")
