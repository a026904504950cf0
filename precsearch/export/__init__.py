"""Turning a chosen policy into files training code uses.

Which trial, read from the study, is chosen in :mod:`precsearch.runtime.study_export`.
"""
