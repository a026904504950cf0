"""The probe: a small Llama 3 trained for a few steps under a policy, and what it measures.

:mod:`.runner` is the training loop (:func:`run_probe`), :mod:`.result` what one probe returns,
:mod:`.continuation` probes that resume another's state, :mod:`.regime` whether a probe's set-up
measures what a study needs. Subpackages: :mod:`.model`, :mod:`.data`, :mod:`.measure`,
:mod:`.memory`, :mod:`.parallel`, :mod:`.damage`. Public names are re-exported here and imported on
first use (the probe needs torch; importing this package does not).
"""

from __future__ import annotations

from precsearch.utils.lazy import lazy_exports

__all__ = ["advice", "check_regime", "Leg", "ProbeResult", "RegimeVerdict", "run_probe", "StepCallback"]

_WHERE = {
    "Leg": "continuation",
    "advice": "regime", "check_regime": "regime", "RegimeVerdict": "regime",
    "ProbeResult": "result",
    "run_probe": "runner", "StepCallback": "runner",
}
"""Public name -> the module that defines it, imported on first use (:func:`~precsearch.utils.lazy.lazy_exports`)."""

__getattr__ = lazy_exports(__name__, _WHERE)
