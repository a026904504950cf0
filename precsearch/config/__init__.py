"""The space file: its sections as validated models (:mod:`.space`), loading it (:mod:`.loader`), and the
checks of the file alone (:mod:`.checks`, which runs :mod:`.value_checks`, :mod:`.group_checks` and
:mod:`.unit_checks`); what this machine must have is :mod:`precsearch.runtime.preflight`'s.

The data sources a space can name are :mod:`.data_source`'s table. Public names are re-exported here
and imported on first use, so importing the package costs nothing.
"""

from __future__ import annotations

from precsearch.utils.lazy import lazy_exports

__all__ = ["check_nproc", "check_space", "DamageSection", "DataSource", "FidelitySection", "FILE_SOURCES",
           "instability_unit", "load_space", "MEMORY_KNOB_NAMES", "ModelSection", "ObjectivesSection",
           "PREFIX_SOURCES", "ProbeSection", "Sampler", "searched_units", "SearchedUnit", "SOURCE_KINDS", "Space",
           "StudySection"]

_WHERE = {
    "check_nproc": "checks", "check_space": "checks", "MEMORY_KNOB_NAMES": "checks",
    "DamageSection": "damage_section",
    "DataSource": "data_source",
    "FILE_SOURCES": "data_source",
    "PREFIX_SOURCES": "data_source",
    "SOURCE_KINDS": "data_source",
    "FidelitySection": "fidelity",
    "load_space": "loader",
    "ModelSection": "model_section",
    "instability_unit": "space",
    "ObjectivesSection": "space",
    "ProbeSection": "space",
    "Sampler": "space",
    "Space": "space",
    "StudySection": "space",
    "searched_units": "unit_space", "SearchedUnit": "unit_space",
}
"""Public name -> the module that defines it, imported on first use (:func:`~precsearch.utils.lazy.lazy_exports`)."""

__getattr__ = lazy_exports(__name__, _WHERE)
