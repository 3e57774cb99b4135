"""Statistics for comparing runs: IQM, stratified bootstrap CIs, probability of improvement.

scipy (not a pickaxe dependency) is the cross-check where it is installed.
"""

import numpy as np
import pytest

from pickaxe.eval import (
    as_scores,
    iqm,
    mean,
    probability_of_improvement,
    probability_of_improvement_ci,
    stratified_bootstrap_ci,
)

# ------------------------------------------------------------------------------------------------ iqm / mean


def test_iqm_hand_computed():
    assert iqm([1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx(4.5)  # cut 2 each end: mean(3, 4, 5, 6)
    assert iqm([0, 1, 2, 3, 4, 5, 6, 100]) == pytest.approx(3.5)  # an outlier run does not move it
    assert iqm([5, 1, 4, 2, 3]) == pytest.approx(3.0)  # n=5: cut 1 each end, mean(2, 3, 4)
    assert iqm([1.0, 2.0, 9.0]) == pytest.approx(4.0)  # n<4 cuts nothing: the mean
    assert iqm([7.0]) == 7.0
    assert iqm([[1, 2], [3, 4], [5, 6], [7, 8]]) == pytest.approx(4.5)  # [runs, tasks] pooled


def test_iqm_matches_scipy_trim_mean():
    trim_mean = pytest.importorskip("scipy.stats").trim_mean
    rng = np.random.default_rng(0)
    for n in range(1, 23):
        x = rng.standard_cauchy(n)
        assert iqm(x) == pytest.approx(trim_mean(x, 0.25), rel=1e-12, abs=1e-12)
    x = rng.normal(size=(7, 5))
    assert iqm(x) == pytest.approx(trim_mean(x, 0.25, axis=None))
    np.testing.assert_allclose(iqm(x, axis=1), trim_mean(x, 0.25, axis=1))
    np.testing.assert_allclose(iqm(x, axis=0), trim_mean(x, 0.25, axis=0))


def test_mean_and_scores_validation():
    assert mean([[1, 2], [3, 6]]) == pytest.approx(3.0)
    np.testing.assert_allclose(mean([[1, 2], [3, 6]], axis=0), [2.0, 4.0])
    assert as_scores([1, 2, 3]).shape == (3, 1)
    for bad in ([], [1.0, float("nan")], [[[1.0]]], [1.0, float("inf")]):
        with pytest.raises(ValueError):
            as_scores(bad)
    with pytest.raises(ValueError):
        iqm([])


# --------------------------------------------------------------------------------------- stratified bootstrap


def test_bootstrap_is_deterministic_and_brackets_the_estimate():
    x = np.random.default_rng(1).normal(size=(10, 3))
    a = stratified_bootstrap_ci(x, iqm, seed=5)
    assert a == stratified_bootstrap_ci(x, iqm, seed=5)
    assert a != stratified_bootstrap_ci(x, iqm, seed=6)
    assert a[0] <= iqm(x) <= a[1]


def test_bootstrap_of_constant_or_single_run_has_zero_width():
    assert stratified_bootstrap_ci([[3.0]], mean) == (3.0, 3.0)
    assert stratified_bootstrap_ci(np.full((5, 2), 2.5), iqm) == (2.5, 2.5)


def test_bootstrap_is_stratified_by_task():
    # Task 0 scores all 0, task 1 all 10: every stratified resample keeps 4 runs of each task, so the
    # pooled mean is exactly 5 in every resample (resampling over all 8 cells would vary).
    scores = np.array([[0.0, 10.0]] * 4)
    assert stratified_bootstrap_ci(scores, mean, reps=500) == (5.0, 5.0)


def test_vectorised_statistics_match_the_generic_path():
    trim_mean = pytest.importorskip("scipy.stats").trim_mean
    x = np.random.default_rng(2).normal(size=(9, 2))
    assert stratified_bootstrap_ci(x, mean, reps=300, seed=3) == pytest.approx(
        stratified_bootstrap_ci(x, lambda s: float(np.mean(s)), reps=300, seed=3)
    )
    assert stratified_bootstrap_ci(x, iqm, reps=300, seed=3) == pytest.approx(
        stratified_bootstrap_ci(x, lambda s: float(trim_mean(s, 0.25, axis=None)), reps=300, seed=3)
    )


def test_bootstrap_ci_covers_the_true_mean_and_narrows_with_more_runs():
    rng = np.random.default_rng(0)
    small, large = rng.normal(size=10), rng.normal(size=400)
    lo_s, hi_s = stratified_bootstrap_ci(small, mean)
    lo_l, hi_l = stratified_bootstrap_ci(large, mean)
    assert lo_s < 0 < hi_s and lo_l < 0 < hi_l
    assert hi_l - lo_l < 0.5 * (hi_s - lo_s)
    # a 99% interval is wider than a 90% one from the same resamples
    lo99, hi99 = stratified_bootstrap_ci(small, mean, alpha=0.01)
    lo90, hi90 = stratified_bootstrap_ci(small, mean, alpha=0.10)
    assert lo99 <= lo90 and hi90 <= hi99


def test_bootstrap_coverage_is_close_to_nominal():
    # 200 independent experiments of 20 N(0, 1) runs: a 90% percentile CI should cover 0 about 90% of the time.
    rng = np.random.default_rng(123)
    hits = sum(
        lo < 0 < hi
        for lo, hi in (
            stratified_bootstrap_ci(rng.normal(size=20), mean, reps=400, alpha=0.1, seed=i) for i in range(200)
        )
    )
    assert 0.8 <= hits / 200 <= 0.97


def test_bootstrap_rejects_bad_arguments():
    with pytest.raises(ValueError):
        stratified_bootstrap_ci([1.0, 2.0], mean, reps=0)
    with pytest.raises(ValueError):
        stratified_bootstrap_ci([1.0, 2.0], mean, alpha=1.5)


# ---------------------------------------------------------------------------------- probability of improvement


def test_probability_of_improvement_hand_computed():
    # pairs of x=[1,2,3] with y=[2,2,2]: 1<2 (0 x3), 2=2 (0.5 x3), 3>2 (1 x3) -> 4.5 / 9
    assert probability_of_improvement([1, 2, 3], [2, 2, 2]) == pytest.approx(0.5)
    # x=[3,4] vs y=[1,2,3]: 3 -> 1+1+0.5, 4 -> 3 -> 5.5 / 6
    assert probability_of_improvement([3, 4], [1, 2, 3]) == pytest.approx(5.5 / 6)
    assert probability_of_improvement([10, 11], [1, 2, 3]) == 1.0
    # averaged over tasks: task 0 x always wins, task 1 x always loses
    assert probability_of_improvement([[1, 0], [1, 0]], [[0, 1], [0, 1]]) == pytest.approx(0.5)


def test_probability_of_improvement_matches_mann_whitney():
    mannwhitneyu = pytest.importorskip("scipy.stats").mannwhitneyu
    rng = np.random.default_rng(4)
    x, y = rng.integers(0, 6, size=(7, 3)).astype(float), rng.integers(0, 6, size=(5, 3)).astype(float)  # ties
    per_task = [mannwhitneyu(x[:, t], y[:, t]).statistic / (7 * 5) for t in range(3)]
    assert probability_of_improvement(x, y) == pytest.approx(np.mean(per_task))
    assert probability_of_improvement(x, y) + probability_of_improvement(y, x) == pytest.approx(1.0)


def test_probability_of_improvement_ci():
    rng = np.random.default_rng(5)
    good, bad = rng.normal(3, 1, size=8), rng.normal(0, 1, size=6)
    lo, hi = probability_of_improvement_ci(good, bad)
    assert 0.5 < lo <= probability_of_improvement(good, bad) <= hi <= 1.0
    assert (lo, hi) == probability_of_improvement_ci(good, bad)  # deterministic
    same_a, same_b = rng.normal(size=10), rng.normal(size=10)
    lo, hi = probability_of_improvement_ci(same_a, same_b)
    assert lo < 0.5 < hi
    assert probability_of_improvement_ci([5.0, 6.0], [1.0, 2.0]) == (1.0, 1.0)
    with pytest.raises(ValueError, match="same tasks"):
        probability_of_improvement_ci(np.zeros((3, 2)), np.zeros((3, 1)))


def test_finite_number_reads_logged_values() -> None:
    from pickaxe.eval.stats import finite_number

    assert finite_number(3) == 3.0 and finite_number(0.5) == 0.5
    for bad in (None, True, "1.0", float("nan"), float("inf"), [1.0]):
        assert finite_number(bad) is None
