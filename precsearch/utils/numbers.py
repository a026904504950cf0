"""The one rule for numbers in space and policy files: the right type, and a range for every field.

Every numeric field of a space section or of ``policy.yaml`` declares a lower bound, and every
integer field an upper bound too (``tests/config/test_numbers.py`` walks the models and fails on a
field without one). Beyond the ranges, two things are refused whatever the field:

* ``true``/``false`` where a number is meant: Python counts a bool as an int, so ``steps: yes``
  would silently train one step;
* a float that is not finite (``"inf"`` or ``"nan"`` written as strings slip past the YAML check):
  every comparison with NaN is false, so a range check alone lets it through.

The bounds below are the ones several fields share; each says where it comes from.
"""

from __future__ import annotations

import math
from typing import Any

#: Optuna's samplers seed numpy's ``RandomState``, which takes 0 to 2**32 - 1 (a negative or larger
#: seed raises there, after the study has started); the probe's seed is held to the same range.
MAX_SEED = 2**32 - 1
#: Durations in seconds (heartbeats, timeouts, retry budgets): about 115 days. Past
#: ``threading.TIMEOUT_MAX`` (about 9.2e9 s) a wait raises OverflowError; no probe runs for months.
MAX_SECONDS = 10**7
#: Counts (steps, batches, trials, processes, retries, tokens, blocks): a typo guard far above any real
#: run (10**12 steps or tokens), which keeps sums such as seed + count far inside int64.
MAX_COUNT = 10**12
#: Transformer blocks of a model (Llama 3 405B has 126): space files and ``export --n-layers`` alike,
#: so a typo cannot make a command enumerate a billion layer names.
MAX_LAYERS = 1024


def number_problem(value: Any) -> str | None:
    """Why ``value`` cannot stand where a number is meant (a bool, a non-finite float), or None."""
    if isinstance(value, bool):
        return f"{str(value).lower()} is not a number; write the number itself"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    return None
