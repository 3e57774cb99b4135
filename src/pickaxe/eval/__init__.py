"""Evaluation tools: statistics for comparing runs and checkpoints (IQM, stratified bootstrap CIs, probability of
improvement, Wilson intervals, unbiased pass@k, samples needed to separate two checkpoints), reward-hacking alarms
and the best-checkpoint rule."""

from pickaxe.eval.alarms import Alarm, AlarmConfig, AlarmMonitor, detect_alarms, gao_fit, gao_fit_free
from pickaxe.eval.selection import (
    Candidate,
    SelectConfig,
    Selection,
    candidates_from_records,
    resolve_metric,
    select_best,
)
from pickaxe.eval.stats import (
    as_scores,
    iqm,
    mean,
    pass_at_k,
    probability_of_improvement,
    probability_of_improvement_ci,
    samples_to_separate,
    stratified_bootstrap_ci,
    wilson_interval,
)

__all__ = [
    "Alarm",
    "AlarmConfig",
    "AlarmMonitor",
    "Candidate",
    "SelectConfig",
    "Selection",
    "as_scores",
    "candidates_from_records",
    "detect_alarms",
    "gao_fit",
    "gao_fit_free",
    "iqm",
    "mean",
    "pass_at_k",
    "probability_of_improvement",
    "probability_of_improvement_ci",
    "resolve_metric",
    "samples_to_separate",
    "select_best",
    "stratified_bootstrap_ci",
    "wilson_interval",
]
