"""Evaluation tools: statistics for comparing runs and checkpoints (IQM, stratified bootstrap CIs, probability of
improvement, Wilson intervals, unbiased pass@k)."""

from pickaxe.eval.stats import (
    as_scores,
    iqm,
    mean,
    pass_at_k,
    probability_of_improvement,
    probability_of_improvement_ci,
    stratified_bootstrap_ci,
    wilson_interval,
)

__all__ = [
    "as_scores",
    "iqm",
    "mean",
    "pass_at_k",
    "probability_of_improvement",
    "probability_of_improvement_ci",
    "stratified_bootstrap_ci",
    "wilson_interval",
]
