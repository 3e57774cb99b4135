"""The best-checkpoint rule: which evaluated step of a run to keep, from each evaluation's mean and 95% CI.

A :class:`Candidate` is one evaluated step with the mean of the selection metric and its CI (``M_ci_low`` and
``M_ci_high`` in ``metrics.jsonl``; None when not logged). :func:`select_best` applies the rule of a
:class:`SelectConfig` and says why in one line. Pure Python; used by the trainer (``RUN/selection.json``) and by
``pickaxe eval --checkpoints best``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pickaxe.config_keys import validate
from pickaxe.eval.stats import finite_number

__all__ = [
    "METRICS",
    "RULES",
    "Candidate",
    "SelectConfig",
    "Selection",
    "candidates_from_records",
    "resolve_metric",
    "select_best",
]

METRICS = ("eval/sampled/gold", "eval/reward/gold", "eval/accuracy", "eval/return_mean", "eval/fqe_value")
"""The metrics tried, in order, when ``SelectConfig.metric`` is None: the last, fitted Q evaluation's estimate
(``pickaxe eval --checkpoints ... --fqe``), picks where no online return was measured."""

Rule = Literal["undominated", "max-mean", "max-lower", "earliest-tied", "latest"]
RULES: tuple[str, ...] = Rule.__args__  # type: ignore[attr-defined]


@dataclass
class SelectConfig:
    """How the best checkpoint of a run is chosen among its evaluated steps."""

    metric: str | None = None
    """The metric to select on; None: the first logged of eval/sampled/gold, eval/reward/gold, eval/accuracy,
    eval/return_mean, eval/fqe_value."""
    mode: Literal["max", "min"] = "max"
    """Whether a higher (max) or lower (min) value of the metric is better."""
    rule: Rule = "undominated"
    """undominated: drop every step whose CI lies wholly below (worse than) a later step's, then the best mean;
    max-mean: the best mean; max-lower: the best pessimistic CI bound; earliest-tied: the earliest step whose CI
    overlaps the best mean's (the one-standard-error rule); latest: the last evaluated step."""

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True)
class Candidate:
    """One evaluated step: the mean of the selection metric and its 95% CI (None: not logged)."""

    step: int
    mean: float
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class Selection:
    """The chosen step, the metric and rule that chose it, its mean and CI, and why, in one line."""

    step: int
    metric: str
    rule: str
    mean: float
    low: float | None
    high: float | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (``RUN/selection.json``, the ``best`` of ``checkpoints.json``)."""
        return {
            "step": self.step,
            "metric": self.metric,
            "rule": self.rule,
            "mean": self.mean,
            "low": self.low,
            "high": self.high,
            "reason": self.reason,
        }


def resolve_metric(cfg: SelectConfig, keys: Iterable[str]) -> str | None:
    """The metric to select on among the logged ``keys``: ``cfg.metric`` if logged, else the first logged of
    :data:`METRICS`; None when none is logged (an explicit ``cfg.metric`` that is not logged also gives None)."""
    present = set(keys)
    if cfg.metric is not None:
        return cfg.metric if cfg.metric in present else None
    return next((m for m in METRICS if m in present), None)


def candidates_from_records(records: Sequence[Mapping[str, Any]], metric: str) -> list[Candidate]:
    """One candidate per step whose record logs ``metric`` (a finite number), with ``metric_ci_low/high`` when
    logged; sorted by step. When a step is logged twice (a resumed run re-evaluating it), the later record wins."""
    by_step: dict[int, Candidate] = {}
    for record in records:
        mean = finite_number(record.get(metric))
        if mean is None or "step" not in record:
            continue
        low, high = finite_number(record.get(f"{metric}_ci_low")), finite_number(record.get(f"{metric}_ci_high"))
        if low is None or high is None:
            low = high = None
        step = int(record["step"])
        by_step[step] = Candidate(step, mean, low, high)
    return [by_step[s] for s in sorted(by_step)]


def _fmt_ci(c: Candidate) -> str:
    return "" if c.low is None or c.high is None else f" [{c.low:.4g}, {c.high:.4g}]"


def _steps(cs: Sequence[Candidate], limit: int = 6) -> str:
    shown = ", ".join(str(c.step) for c in cs[:limit])
    return shown + (f" and {len(cs) - limit} more" if len(cs) > limit else "")


def select_best(candidates: Sequence[Candidate], cfg: SelectConfig, metric: str) -> Selection | None:
    """The step ``cfg.rule`` picks among ``candidates`` (None when there are none).

    Scores are oriented so that higher is better (``mode=min`` negates them and swaps the CI ends). A candidate
    without a CI counts as the interval ``[mean, mean]``. Ties go to the earlier step.

    - ``undominated``: drop every candidate whose CI lies wholly below a later candidate's CI (``high < later low``:
      a later step is better beyond doubt), then take the best mean of the rest. The best mean can never be
      dominated (its CI holds its mean, which no later CI lies wholly above), so the step is max-mean's; the
      reason line adds which steps later training beat beyond their CIs.
    - ``max-mean``: the best mean.
    - ``max-lower``: the best pessimistic end of the CI (the low end for max).
    - ``earliest-tied``: the earliest candidate whose CI overlaps the CI of the best mean (the one-standard-error
      rule: the least-trained step that is statistically tied with the best).
    - ``latest``: the last step.
    """
    if not candidates:
        return None
    cs = sorted(candidates, key=lambda c: c.step)
    sign = 1.0 if cfg.mode == "max" else -1.0

    def score(c: Candidate) -> float:
        return sign * c.mean

    def bounds(c: Candidate) -> tuple[float, float]:
        """The CI oriented so that higher is better: (pessimistic, optimistic)."""
        if c.low is None or c.high is None:
            return score(c), score(c)
        a, b = sign * c.low, sign * c.high
        return min(a, b), max(a, b)

    def best_of(pool: Sequence[Candidate], key: Any) -> Candidate:
        return max(pool, key=lambda c: (key(c), -c.step))  # first step at the maximum

    word = "highest" if cfg.mode == "max" else "lowest"
    n = len(cs)
    rule = cfg.rule
    if rule == "undominated":
        dominated = [c for i, c in enumerate(cs) if any(bounds(c)[1] < bounds(later)[0] for later in cs[i + 1 :])]
        kept = [c for c in cs if c not in dominated]
        pick = best_of(kept, score)
        why = f"the {word} mean of {len(kept)} of {n} evaluated steps not beaten beyond their CI by a later step"
        if dominated:
            why += f" (dropped: {_steps(dominated)})"
    elif rule == "max-mean":
        pick = best_of(cs, score)
        why = f"the {word} mean of {n} evaluated steps"
    elif rule == "max-lower":
        pick = best_of(cs, lambda c: bounds(c)[0])
        end = "low" if cfg.mode == "max" else "high"
        why = f"the {word} CI {end} end of {n} evaluated steps"
    elif rule == "earliest-tied":
        top = best_of(cs, score)
        tied = [c for c in cs if bounds(c)[1] >= bounds(top)[0] and bounds(c)[0] <= bounds(top)[1]]
        pick = tied[0]
        why = (
            f"the earliest of {len(tied)} steps whose CI overlaps that of the {word} mean "
            f"(step {top.step}: {top.mean:.4g}{_fmt_ci(top)})"
        )
    else:  # latest
        pick = cs[-1]
        why = f"the last of {n} evaluated steps"
    reason = f"step {pick.step}: {metric} {pick.mean:.4g}{_fmt_ci(pick)}, {why}"
    return Selection(pick.step, metric, rule, pick.mean, pick.low, pick.high, reason)
