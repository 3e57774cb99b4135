"""The best-checkpoint rules on hand-made candidates, candidates read from records, and samples_to_separate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pickaxe.errors import ConfigError
from pickaxe.eval.selection import Candidate, SelectConfig, candidates_from_records, resolve_metric, select_best
from pickaxe.eval.stats import samples_to_separate

M = "eval/sampled/gold"

# Gold over training: up, a wide-CI peak at 300, a narrow 400, then down.
CANDIDATES = [
    Candidate(0, 0.50, 0.45, 0.55),
    Candidate(100, 0.70, 0.62, 0.78),
    Candidate(200, 0.76, 0.70, 0.82),
    Candidate(300, 0.80, 0.66, 0.94),
    Candidate(400, 0.74, 0.71, 0.77),
    Candidate(500, 0.60, 0.55, 0.65),
]


@pytest.mark.parametrize(
    ("rule", "mode", "step"),
    [
        ("undominated", "max", 300),
        ("max-mean", "max", 300),
        ("max-lower", "max", 400),  # 0.71 is the best low end
        ("earliest-tied", "max", 100),  # 100's CI reaches 0.78 >= 300's low end 0.66; step 0's (0.55) does not
        ("latest", "max", 500),
        ("undominated", "min", 0),
        ("max-mean", "min", 0),
        ("max-lower", "min", 0),  # the lowest high end: 0.55
        ("earliest-tied", "min", 0),
        ("latest", "min", 500),
    ],
)
def test_each_rule_picks_its_step(rule: str, mode: str, step: int) -> None:
    sel = select_best(list(reversed(CANDIDATES)), SelectConfig(rule=rule, mode=mode), M)  # type: ignore[arg-type]
    assert sel is not None
    assert (sel.step, sel.rule, sel.metric) == (step, rule, M)
    pick = next(c for c in CANDIDATES if c.step == step)
    assert (sel.mean, sel.low, sel.high) == (pick.mean, pick.low, pick.high)
    assert sel.reason.startswith(f"step {step}: {M} ") and "\n" not in sel.reason


def test_undominated_drops_the_steps_a_later_step_beats_beyond_their_ci() -> None:
    sel = select_best(CANDIDATES, SelectConfig(), M)
    assert sel is not None and "5 of 6" in sel.reason and "dropped: 0)" in sel.reason
    # min: a later step's CI wholly below (better): 200, 300 and 400 all lie above 500's [0.55, 0.65].
    low = select_best(CANDIDATES, SelectConfig(mode="min"), M)
    assert low is not None and "3 of 6" in low.reason and "dropped: 200, 300, 400)" in low.reason
    # The best mean is never dropped: an early lucky step with a wide CI stays the pick (as max-mean's would).
    cs = [Candidate(0, 0.9, 0.2, 1.6), Candidate(10, 0.5, 0.1, 0.9), Candidate(20, 0.8, 0.7, 0.9)]
    assert select_best(cs, SelectConfig(), M).step == 0  # type: ignore[union-attr]
    # A later step beyond an early one's CI drops it.
    cs = [Candidate(0, 0.3, 0.25, 0.35), Candidate(10, 0.8, 0.7, 0.9)]
    assert "dropped: 0)" in select_best(cs, SelectConfig(), M).reason  # type: ignore[union-attr]


def test_ties_go_to_the_earlier_step_and_no_ci_counts_as_a_point() -> None:
    cs = [Candidate(5, 1.0), Candidate(1, 1.0), Candidate(9, 0.5)]
    for rule in ("undominated", "max-mean", "max-lower", "earliest-tied"):
        assert select_best(cs, SelectConfig(rule=rule), "m").step == 1  # type: ignore[arg-type, union-attr]
    assert select_best([], SelectConfig(), "m") is None


def test_candidates_from_records_and_resolve_metric() -> None:
    records = [
        {"step": 0, "loss": 1.0},
        {"step": 100, M: 0.5, f"{M}_ci_low": 0.4, f"{M}_ci_high": 0.6, "eval/accuracy": 0.1},
        {"step": 200, M: float("nan")},
        {"step": 300, M: 0.7},
        {"step": 100, M: 0.55, f"{M}_ci_low": 0.45, f"{M}_ci_high": 0.65},  # re-evaluated after a resume
    ]
    assert candidates_from_records(records, M) == [Candidate(100, 0.55, 0.45, 0.65), Candidate(300, 0.7, None, None)]
    keys = {k for r in records for k in r}
    assert resolve_metric(SelectConfig(), keys) == M
    assert resolve_metric(SelectConfig(), {"eval/accuracy", "eval/return_mean"}) == "eval/accuracy"
    assert resolve_metric(SelectConfig(), {"eval/return_mean"}) == "eval/return_mean"
    assert resolve_metric(SelectConfig(metric="eval/accuracy"), keys) == "eval/accuracy"
    assert resolve_metric(SelectConfig(metric="eval/pass@4"), keys) is None
    assert resolve_metric(SelectConfig(), {"loss"}) is None


def test_select_config_rejects_a_bad_rule() -> None:
    with pytest.raises(ConfigError, match="rule must be one of undominated"):
        SelectConfig(rule="nope")  # type: ignore[arg-type]


Z2 = 1.959963984540054**2  # the two-sided 95% normal quantile, squared


def test_samples_to_separate_by_hand() -> None:
    a, b = np.array([1.0, 0.0, 1.0, 0.0]), np.zeros(4)
    # Paired: differences [1, 0, 1, 0], mean 0.5, variance 1/3: N > z^2 (1/3) / 0.25 = 5.12 -> 6 samples, 2 more.
    assert math.floor(Z2 / 3 / 0.25) + 1 - 4 == 2
    assert samples_to_separate(a, b, paired=True) == 2
    # Unpaired, n = 4 each: variances 1/3 and 0, the same sum here, so the same answer.
    assert samples_to_separate(a, b, paired=False) == 2
    # Correlated samples: pairing removes the prompt-to-prompt spread. Differences [1, 1, 1, 1, 0]: mean 0.8,
    # variance 0.2, N > 1.2 (already separated). Unpaired: variances 2.5 and 3.7, N > z^2 6.2 / 0.64 = 37.2 -> 33 more.
    a, b = np.array([1.0, 2.0, 3.0, 4.0, 5.0]), np.array([0.0, 1.0, 2.0, 3.0, 5.0])
    assert samples_to_separate(a, b, paired=True) == 0
    assert math.floor(Z2 * 6.2 / 0.64) + 1 - 5 == 33
    assert samples_to_separate(a, b, paired=False) == 33
    # Unequal sizes: [0, 1, 2] (variance 1) against five zeros: z sqrt(1 / (3 + m)) < 1 first at m = 1.
    assert samples_to_separate([0.0, 1.0, 2.0], np.zeros(5), paired=False) == 1
    # A lower confidence needs fewer: z(0.5) = 0.674, N > 0.4549 * (1/3) / 0.25 = 0.61 -> already separated.
    assert samples_to_separate([1.0, 0.0, 1.0, 0.0], np.zeros(4), paired=True, confidence=0.5) == 0


def test_samples_to_separate_equal_means_and_bad_input() -> None:
    assert samples_to_separate([1.0, 2.0, 3.0], [3.0, 2.0, 1.0], paired=True) is None
    assert samples_to_separate([1.0, 2.0, 3.0], [2.0, 2.0, 2.0], paired=False) is None
    with pytest.raises(ValueError, match="as many"):
        samples_to_separate([1.0, 2.0, 3.0], [1.0, 2.0], paired=True)
    with pytest.raises(ValueError, match="at least 2 samples"):
        samples_to_separate([1.0], [1.0, 2.0], paired=False)
