"""Experiments: sweeps, job queue and comparison reports (``pickaxe compare``: ``exp.compare``)."""

from pickaxe.exp.compare import (
    IGNORED_KEYS,
    Comparison,
    Estimate,
    GroupSummary,
    PairComparison,
    RunGroup,
    RunRecord,
    compare,
    group_runs,
    learning_curve,
    load_runs,
    main_compare,
)

__all__ = [
    "IGNORED_KEYS",
    "Comparison",
    "Estimate",
    "GroupSummary",
    "PairComparison",
    "RunGroup",
    "RunRecord",
    "compare",
    "group_runs",
    "learning_curve",
    "load_runs",
    "main_compare",
]
