"""Statistics for comparing RL results from few runs (Agarwal et al. 2021, "Deep RL at the edge of the
statistical precipice"; ``rliable`` is the reference implementation).

Scores are a 2-D array ``[runs, tasks]``: one row per independent run (seed), one column per task
(environment). A 1-D array is one task. Aggregate statistics (``iqm``, ``mean``) pool every score;
confidence intervals come from a *stratified* bootstrap: runs are resampled with replacement, separately
within each task, so every bootstrap sample keeps the same number of runs per task.

Everything here is pure numpy and deterministic given ``seed`` (a ``numpy.random.Generator``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import NormalDist
from typing import Any

import numpy as np

__all__ = [
    "as_scores",
    "average_ranks",
    "finite_number",
    "iqm",
    "mean",
    "probability_of_improvement",
    "probability_of_improvement_ci",
    "samples_to_separate",
    "spearman",
    "stratified_bootstrap_ci",
]

Statistic = Callable[[np.ndarray], float]

# Pairwise comparisons are done in chunks of at most this many booleans to bound memory.
_CHUNK_ELEMENTS = 4_000_000


def finite_number(value: Any) -> float | None:
    """A logged value (a JSON number of ``metrics.jsonl``, a summary field) as a finite float; None for anything
    else: missing, a bool, a string, NaN or infinity."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def as_scores(x: np.ndarray | list) -> np.ndarray:
    """``x`` as a float array ``[runs, tasks]`` (a 1-D ``x`` is one task); raises ``ValueError`` if it is
    empty, has more than 2 dimensions or holds a NaN or infinity."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2:
        raise ValueError(f"scores must be 1-D [runs] or 2-D [runs, tasks], got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"scores are empty (shape {a.shape})")
    if not np.isfinite(a).all():
        raise ValueError("scores hold NaN or infinity; drop or replace them first")
    return a


def iqm(x: np.ndarray | list, axis: int | None = None) -> float | np.ndarray:
    """Interquartile mean: the mean of the middle 50% of the scores.

    Same definition as ``scipy.stats.trim_mean(x, 0.25)`` (and ``rliable``'s ``aggregate_iqm``): the
    values are sorted and ``floor(0.25 * n)`` are cut from each end; the rest are averaged with equal
    weight. When ``n`` is not a multiple of 4 slightly more than half the values are kept (``n < 4``
    cuts nothing, so the IQM of 3 runs is their mean). It is robust to outlier runs like the median,
    yet uses half the data, so it is far less noisy than the median with few runs.

    ``axis=None`` pools every element (all runs of all tasks); an integer axis reduces along it.
    """
    a = np.asarray(x, dtype=np.float64)
    if axis is None:
        a, axis = a.reshape(-1), 0
    n = a.shape[axis]
    if n == 0:
        raise ValueError("iqm of an empty array")
    cut = int(0.25 * n)
    kept = np.sort(a, axis=axis)
    kept = np.take(kept, np.arange(cut, n - cut), axis=axis)
    out = kept.mean(axis=axis)
    return float(out) if np.ndim(out) == 0 else out


def mean(x: np.ndarray | list, axis: int | None = None) -> float | np.ndarray:
    """Arithmetic mean of the scores (``axis=None``: all elements pooled)."""
    a = np.asarray(x, dtype=np.float64)
    if a.size == 0:
        raise ValueError("mean of an empty array")
    out = a.mean(axis=axis)
    return float(out) if np.ndim(out) == 0 else out


def _stratified_resample(scores: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    """``[reps, runs, tasks]``: each task's column resampled with replacement over runs, independently."""
    runs, tasks = scores.shape
    idx = rng.integers(0, runs, size=(reps, runs, tasks))
    return scores[idx, np.arange(tasks)]


def _percentile_interval(samples: np.ndarray, alpha: float) -> tuple[float, float]:
    low, high = np.quantile(samples, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def _check(reps: int, alpha: float) -> None:
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


def stratified_bootstrap_ci(
    scores: np.ndarray | list,
    statistic: Statistic = iqm,
    reps: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile ``(1 - alpha)`` confidence interval of ``statistic(scores)`` by stratified bootstrap.

    ``scores`` is ``[runs, tasks]`` (1-D: one task). Each of ``reps`` bootstrap samples draws, for every
    task separately, ``runs`` runs with replacement from that task's runs; ``statistic`` maps a
    ``[runs, tasks]`` array to a float. The interval is the ``alpha/2`` and ``1 - alpha/2`` quantiles of
    the ``reps`` bootstrap statistics. ``iqm`` and ``mean`` are evaluated vectorised; any other callable
    is called once per bootstrap sample. Deterministic given ``seed``.
    """
    _check(reps, alpha)
    a = as_scores(scores)
    rng = np.random.default_rng(seed)
    samples = _stratified_resample(a, reps, rng)
    if statistic is iqm or statistic is mean:
        values = np.asarray(statistic(samples.reshape(reps, -1), axis=1))
    else:
        values = np.array([float(statistic(s)) for s in samples])
    return _percentile_interval(values, alpha)


def _poi_batched(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) + 0.5 P(X = Y) averaged over tasks, for batches ``x [B, n, T]``, ``y [B, m, T]`` -> ``[B]``."""
    b, n, t = x.shape
    m = y.shape[1]
    out = np.empty(b)
    step = max(1, _CHUNK_ELEMENTS // max(1, n * m * t))
    for i in range(0, b, step):
        xi, yi = x[i : i + step, :, None, :], y[i : i + step, None, :, :]
        wins = (xi > yi).mean(axis=(1, 2)) + 0.5 * (xi == yi).mean(axis=(1, 2))  # [chunk, T]
        out[i : i + step] = wins.mean(axis=1)
    return out


def _paired_scores(x: np.ndarray | list, y: np.ndarray | list) -> tuple[np.ndarray, np.ndarray]:
    a, b = as_scores(x), as_scores(y)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"x and y must cover the same tasks: x has {a.shape[1]} columns, y has {b.shape[1]}")
    return a, b


def probability_of_improvement(x: np.ndarray | list, y: np.ndarray | list) -> float:
    """Probability that a run of algorithm X beats a run of algorithm Y on a task, averaged over tasks.

    Per task: ``P(X > Y) + 0.5 P(X = Y)`` over all ``n * m`` pairs of X's and Y's runs, which is the
    Mann-Whitney U statistic of X divided by ``n * m``. ``x`` is ``[n, tasks]``, ``y`` is ``[m, tasks]``
    (1-D: one task); ``n`` and ``m`` may differ. 0.5 means neither is better; it says how *often* X wins,
    not by how much.
    """
    a, b = _paired_scores(x, y)
    return float(_poi_batched(a[None], b[None])[0])


def probability_of_improvement_ci(
    x: np.ndarray | list,
    y: np.ndarray | list,
    reps: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile ``(1 - alpha)`` bootstrap CI of ``probability_of_improvement(x, y)``.

    X's and Y's runs are resampled independently of each other, each stratified by task (as ``rliable``
    does). X is better than Y with confidence ``1 - alpha`` when the interval's low end is above 0.5.
    Deterministic given ``seed``.
    """
    _check(reps, alpha)
    a, b = _paired_scores(x, y)
    rng = np.random.default_rng(seed)
    xs = _stratified_resample(a, reps, rng)
    ys = _stratified_resample(b, reps, rng)
    return _percentile_interval(_poi_batched(xs, ys), alpha)


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95% for z = 1.96); (0, 1) for n = 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct: ``1 - C(n-c, k) / C(n, k)``."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def samples_to_separate(
    a: np.ndarray | list, b: np.ndarray | list, paired: bool, confidence: float = 0.95
) -> int | None:
    """How many more samples each of two checkpoints needs before the CI of their mean difference excludes 0.

    ``a`` and ``b`` are per-sample values (one per held-out prompt or episode). Normal approximation, with
    ``z`` the two-sided ``confidence`` quantile (1.96 for 0.95), ``D = |mean(a) - mean(b)|`` and sample variances
    ``s^2`` (``ddof=1``):

    - ``paired`` (the same prompts and eval seeds for both: ``a[i]`` and ``b[i]`` share sample ``i``): with the
      differences ``a - b`` of variance ``s_d^2``, the CI excludes 0 once ``z * s_d / sqrt(n) < D``, i.e. at
      ``N = floor(z^2 s_d^2 / D^2) + 1`` samples; the answer is ``N - n``.
    - unpaired: once ``z * sqrt(s_a^2 / (n_a + m) + s_b^2 / (n_b + m)) < D``; the answer is the smallest such
      ``m`` (for ``n_a = n_b = n``: ``floor(z^2 (s_a^2 + s_b^2) / D^2) + 1 - n``).

    0 when the CI already excludes 0; None when the means are equal (no number of samples separates them).
    Assumes the observed means and variances stay as they are with more samples.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    x, y = np.asarray(a, dtype=np.float64).reshape(-1), np.asarray(b, dtype=np.float64).reshape(-1)
    if len(x) < 2 or len(y) < 2:
        raise ValueError(f"need at least 2 samples of each checkpoint, got {len(x)} and {len(y)}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("samples hold NaN or infinity; drop or replace them first")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    if paired:
        if len(x) != len(y):
            raise ValueError(f"paired samples must be as many for both checkpoints, got {len(x)} and {len(y)}")
        diff = x - y
        gap = abs(float(diff.mean()))
        if gap == 0:
            return None
        needed = math.floor(z * z * float(diff.var(ddof=1)) / gap**2) + 1
        return max(0, needed - len(x))
    gap = abs(float(x.mean() - y.mean()))
    if gap == 0:
        return None
    va, vb, na, nb = float(x.var(ddof=1)), float(y.var(ddof=1)), len(x), len(y)

    def separated(m: int) -> bool:
        return z * math.sqrt(va / (na + m) + vb / (nb + m)) < gap

    if separated(0):
        return 0
    high = 1
    while not separated(high):
        high *= 2
    low = high // 2  # not separated at low (or low == 0), separated at high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if separated(mid) else (mid, high)
    return high


def average_ranks(x: np.ndarray | list) -> np.ndarray:
    """Ranks 1..n of ``x``, ties given the mean of the ranks they span (the ranks Spearman's rho correlates)."""
    v = np.asarray(x, dtype=np.float64).reshape(-1)
    order = np.argsort(v, kind="stable")
    ranks = np.empty(len(v), dtype=np.float64)
    sorted_v = v[order]
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and sorted_v[j + 1] == sorted_v[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: np.ndarray | list, b: np.ndarray | list) -> float | None:
    """Spearman's rank correlation of paired values (the Pearson correlation of their average ranks); None with fewer
    than two pairs or when either side's ranks are all equal (no order to agree with)."""
    x, y = np.asarray(a, dtype=np.float64).reshape(-1), np.asarray(b, dtype=np.float64).reshape(-1)
    if len(x) != len(y):
        raise ValueError(f"spearman needs paired values, got {len(x)} and {len(y)}")
    if len(x) < 2:
        return None
    rx, ry = average_ranks(x) - (len(x) + 1) / 2, average_ranks(y) - (len(y) + 1) / 2
    norm = math.sqrt(float((rx * rx).sum()) * float((ry * ry).sum()))
    return None if norm == 0 else float((rx * ry).sum() / norm)
