"""Evaluation tools: statistics for comparing runs (IQM, stratified bootstrap CIs, probability of improvement)."""

from pickaxe.eval.stats import (
    as_scores,
    iqm,
    mean,
    probability_of_improvement,
    probability_of_improvement_ci,
    stratified_bootstrap_ci,
)

__all__ = [
    "as_scores",
    "iqm",
    "mean",
    "probability_of_improvement",
    "probability_of_improvement_ci",
    "stratified_bootstrap_ci",
]
