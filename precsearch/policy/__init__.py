"""Precision policies: what a trial chose, in a form training code can apply."""

from precsearch.policy.rules import Policy, Rule, block_index

__all__ = ["Policy", "Rule", "block_index"]
