"""Learning curves of ``pickaxe compare``: the IQM across a group's runs at each env step with its bootstrap band
(:func:`learning_curve`, also what the web app's Runs page draws) and ``curves.png`` (:func:`write_curves`), where
every point is marked so a group evaluated once still shows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pickaxe.eval.stats import iqm, stratified_bootstrap_ci

__all__ = ["CURVE_POINTS", "curves_figure", "learning_curve", "write_curves"]

CURVE_POINTS = 100
"""Most grid points of a learning curve (the union of the runs' steps is thinned to this many)."""


def learning_curve(
    runs: Sequence[Any], metric: str, reps: int = 2000, alpha: float = 0.05, seed: int = 0
) -> dict[str, np.ndarray]:
    """IQM across runs of ``metric`` against env step, with a bootstrap CI band.

    Each run's values are linearly interpolated onto a common grid (the union of the runs' logged steps,
    at most ``CURVE_POINTS`` points); a run counts at a grid step only within its own first..last logged
    step (no extrapolation). Returns ``step``, ``iqm``, ``low``, ``high`` and ``n`` (runs covering each
    step); steps no run covers are dropped.
    """
    series = [s for s in (r.series(metric) for r in runs) if len(s[0])]
    if not series:
        return {k: np.array([]) for k in ("step", "iqm", "low", "high", "n")}
    grid = np.unique(np.concatenate([s for s, _ in series]))
    if len(grid) > CURVE_POINTS:
        grid = np.unique(np.linspace(grid[0], grid[-1], CURVE_POINTS).round().astype(np.int64))
    values = np.full((len(series), len(grid)), np.nan)
    for i, (s, v) in enumerate(series):
        inside = (grid >= s[0]) & (grid <= s[-1])
        values[i, inside] = np.interp(grid[inside], s, v)
    out: dict[str, list[float]] = {k: [] for k in ("step", "iqm", "low", "high", "n")}
    for j, step in enumerate(grid):
        col = values[:, j][~np.isnan(values[:, j])]
        if len(col) == 0:
            continue
        low, high = stratified_bootstrap_ci(col, iqm, reps=reps, alpha=alpha, seed=seed)
        for k, x in zip(("step", "iqm", "low", "high", "n"), (step, iqm(col), low, high, len(col)), strict=True):
            out[k].append(float(x))
    return {k: np.array(v) for k, v in out.items()}


def curves_figure(groups: Sequence[Any], metric: str, reps: int, alpha: float, seed: int) -> Any:
    """The figure of ``curves.png``: each group's IQM curve with its bootstrap band, a marker on every point (a group
    evaluated once has no line, only its point, with its CI as an error bar). None without matplotlib."""
    try:  # the Agg canvas directly: no pyplot, no global backend switch
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(8, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for g in groups:
        c = learning_curve(g.runs, metric, reps=reps, alpha=alpha, seed=seed)
        if not len(c["step"]):
            continue
        (line,) = ax.plot(c["step"], c["iqm"], marker="o", markersize=4, label=f"{g.label} (n={int(c['n'].max())})")
        ax.fill_between(c["step"], c["low"], c["high"], color=line.get_color(), alpha=0.2, linewidth=0)
        if len(c["step"]) == 1:  # a band of one point is invisible: its CI as an error bar
            err = [[c["iqm"][0] - c["low"][0]], [c["high"][0] - c["iqm"][0]]]
            ax.errorbar(c["step"], c["iqm"], yerr=err, color=line.get_color(), capsize=4, linewidth=1)
    ax.set_xlabel("env steps")
    ax.set_ylabel(metric)
    ax.set_title(f"IQM across seeds, {1 - alpha:.0%} bootstrap CI")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def write_curves(groups: Sequence[Any], metric: str, path: Path, reps: int, alpha: float, seed: int) -> Path | None:
    """Write :func:`curves_figure` to ``path`` (PNG); None, writing nothing, without matplotlib."""
    fig = curves_figure(groups, metric, reps, alpha, seed)
    if fig is None:
        return None
    fig.savefig(path, dpi=120)
    return path
