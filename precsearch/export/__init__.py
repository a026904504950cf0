"""Turning a chosen trial into files training code uses."""

from precsearch.export.policy_export import export_trial

__all__ = ["export_trial"]
