"""The fixed-state damage reading: a policy's quantization error at states of the BF16 run, in SGD noise.

:mod:`.reading` explains the figures; :mod:`.states` the states; :mod:`.update`
the optimizer step a policy's memory knobs change; :mod:`.gram` the statistics;
:mod:`.reader` how a study reads each trial with the BF16 side shared;
:mod:`.placement` where the BF16 side is kept, and :mod:`.spill` and
:mod:`.spilled_adamw` how it is kept on disk.
"""

from precsearch.probe.damage.reader import DamageReader, reading_dict
from precsearch.probe.damage.reading import MEASURES

__all__ = ["DamageReader", "MEASURES", "reading_dict"]
