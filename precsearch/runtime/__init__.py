"""The runtime that runs a study's trials: the study facade and loop, workers and their processes,
liveness, stores and their retries, the output directory and the BF16 references.

The optimisation it drives (sampling, scoring, the Pareto front, promotion) is in
:mod:`precsearch.search`; this package only runs it. Entry point: :func:`precsearch.runtime.study.run_study`.
"""
