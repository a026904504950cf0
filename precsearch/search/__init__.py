"""The Optuna driver: sampling policies, scoring trials, the Pareto front."""
