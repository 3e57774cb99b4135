"""The Runs page's API: every run under the app's folder (the summary ``pickaxe runs`` prints) and the curves of
selected runs grouped by config (the numbers ``pickaxe compare`` prints).

Summaries are cached per run folder and recomputed only when ``config.json``, ``metrics.jsonl`` or
``status.json`` changed, so a page load over hundreds of runs reads only what moved.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse

from pickaxe.errors import PickaxeError
from pickaxe.eval.stats import finite_number
from pickaxe.exp.compare import (
    DEFAULT_METRIC,
    RunRecord,
    compare_runs,
    learning_curve,
    load_runs,
    verdict,
)
from pickaxe.runs.listing import RunSummary, find_run_dirs, live_status, summarize_run

__all__ = ["RecordCache", "SummaryCache", "clean", "eval_metrics", "resolve_run", "router", "run_id", "warm_cache"]

router = APIRouter()
"""Routes of the Runs page's API; ``create_app`` includes them."""

MAX_COMPARE = 50
"""Most runs one compare request may overlay."""


# ----------------------------------------------------------------------------------------------- paths


def run_id(root: Path, run_dir: Path) -> str:
    """The id of a run in the API and in page URLs: its path relative to the app's folder (``.`` for the folder)."""
    rel = run_dir.relative_to(root).as_posix()
    return rel or "."


def resolve_run(request: Request, run: str) -> Path:
    """The run folder of an id from a request, inside the app's folder and holding ``config.json``.

    Raises ``HTTPException`` 400 for an absolute path or one leaving the folder, 404 for no run there.
    """
    root: Path = request.app.state.runs_dir
    if not run or "\x00" in run:
        raise HTTPException(400, "run is empty; pass a run's id as listed by /api/runs")
    rel = PurePosixPath(run)
    if rel.is_absolute() or ".." in rel.parts or "\\" in run:
        raise HTTPException(400, f"run {run!r} must be a path relative to the runs folder, without '..'")
    path = (root / rel).resolve()
    if path != root and root not in path.parents:  # a symlink pointing out of the folder
        raise HTTPException(400, f"run {run!r} is outside the runs folder")
    if not (path / "config.json").is_file():
        raise HTTPException(404, f"no run {run!r} under {root} (a run folder holds config.json)")
    return path


# ----------------------------------------------------------------------------------------------- summaries


_STAMPED = ("config.json", "metrics.jsonl", "status.json", "model.safetensors", "eval/checkpoints.json")
"""The files a summary depends on (and the checkpoint evaluation the Runs page links to)."""


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


@dataclass
class _Entry:
    key: tuple[Any, ...]
    summary: RunSummary


class SummaryCache:
    """``summarize_run`` per run folder, recomputed when one of the files it reads changes; a cached "running"
    run has its state checked again each time (its process may have died without writing anything)."""

    def __init__(self) -> None:
        self._entries: dict[Path, _Entry] = {}
        self._lock = threading.Lock()
        self.misses = 0
        """Summaries computed (not served from the cache), for tests and the benchmark."""

    def summary(self, run_dir: Path) -> RunSummary:
        """The run's summary, from the cache when nothing it depends on changed."""
        return self.entry(run_dir).summary

    def entry(self, run_dir: Path) -> _Entry:
        """The cached summary with the stamps of the files it was made from."""
        base = os.fspath(run_dir) + os.sep  # plain strings: pathlib costs more than the stat calls on 200 runs
        key = tuple(_stamp(base + name) for name in _STAMPED)
        with self._lock:
            entry = self._entries.get(run_dir)
        if entry is not None and entry.key == key:
            if entry.summary.state == "running":  # its process may have died; its wall time goes on
                s = entry.summary
                s.state, s.phase, wall_s = live_status(run_dir)
                s.wall_s = wall_s if wall_s is not None else s.wall_s
            return entry
        entry = _Entry(key, summarize_run(run_dir))
        with self._lock:
            self._entries[run_dir] = entry
            self.misses += 1
        return entry


class RecordCache:
    """The last ``size`` runs loaded for a comparison (``compare.load_runs``: config and every metrics record),
    reloaded when ``config.json`` or ``metrics.jsonl`` changes: ticking runs one by one on the page parses
    each run once, not once per tick."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._entries: OrderedDict[Path, tuple[tuple[Any, ...], RunRecord]] = OrderedDict()
        self._lock = threading.Lock()

    def load(self, run_dir: Path) -> RunRecord:
        """The run's ``RunRecord``; ``PickaxeError`` (from ``load_runs``) when it has no metrics or bad files."""
        base = os.fspath(run_dir) + os.sep
        key = (_stamp(base + "config.json"), _stamp(base + "metrics.jsonl"))
        with self._lock:
            hit = self._entries.get(run_dir)
            if hit is not None and hit[0] == key:
                self._entries.move_to_end(run_dir)
                return hit[1]
        (record,) = load_runs([run_dir])
        with self._lock:
            self._entries[run_dir] = (key, record)
            self._entries.move_to_end(run_dir)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return record


def _cache(request: Request) -> SummaryCache:
    return request.app.state.summary_cache


def warm_cache(app: Any) -> int:
    """Read every run's summary into the app's cache (``serve`` runs this in a thread at start-up, so the first
    page load does not wait for every ``metrics.jsonl`` to be parsed); returns the number of runs."""
    try:
        dirs = find_run_dirs(app.state.runs_dir)
    except PickaxeError:  # the folder went away: the page will say so
        return 0
    for d in dirs:
        app.state.summary_cache.summary(d)
    return len(dirs)


@router.get("/api/runs")
def list_runs(request: Request) -> JSONResponse:
    """Every run under the folder with the columns of ``pickaxe runs``; ``checkpoints`` says whether
    ``eval/checkpoints.json`` exists. Sent as plain JSON (every value is already a JSON number, string or null):
    FastAPI's generic encoder took a third of the request's time at 1,000 runs."""
    root: Path = request.app.state.runs_dir
    try:
        dirs = find_run_dirs(root)
    except PickaxeError as e:
        raise HTTPException(404, str(e)) from None
    cache = _cache(request)
    out = []
    for d in dirs:
        entry = cache.entry(d)
        s = entry.summary
        out.append(
            {
                "id": run_id(root, d),
                "recipe": s.recipe,
                "kind": "llm" if s.metric == "eval/accuracy" else "classic",
                "state": s.state,
                "phase": s.phase,
                "step": s.step,
                "total_steps": s.total_steps,
                "metric": s.metric,
                "final_eval": finite_number(s.final_eval),
                "best_eval": finite_number(s.best_eval),
                "wall_s": finite_number(s.wall_s),
                "checkpoints": entry.key[-1] is not None,
            }
        )
    return JSONResponse({"root": str(root), "runs": out})


# ------------------------------------------------------------------------------------------------- compare


def eval_metrics(runs: list[RunRecord]) -> list[str]:
    """The eval metrics the runs logged that can be plotted (CI bounds and bookkeeping keys left out)."""
    names = set().union(*(r.metric_names() for r in runs)) if runs else set()
    skip_suffix = ("_ci_low", "_ci_high")
    skip = {"eval/phase_before", "eval/prompts", "eval/episodes"}
    return sorted(n for n in names if n.startswith("eval/") and not n.endswith(skip_suffix) and n not in skip)


def _floats(values: Any) -> list[float | None]:
    return [finite_number(float(v)) for v in values]


def clean(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None (JSON has no NaN; the pages show a gap)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean(v) for v in obj]
    return obj


@router.get("/api/runs/compare")
def compare_selected(
    request: Request,
    run: Annotated[list[str], Query(description="run ids (repeat the parameter)")],
    metric: str | None = None,
) -> dict[str, Any]:
    """The selected runs' curves of ``metric`` and, per group of runs differing only by seed, the IQM curve
    with its 95% bootstrap band and the final/best IQM and mean with CIs, the numbers ``pickaxe compare``
    prints (same grouping, statistics and bootstrap seed)."""
    if not run:
        raise HTTPException(400, "select at least one run")
    if len(run) > MAX_COMPARE:
        raise HTTPException(400, f"{len(run)} runs selected; compare at most {MAX_COMPARE} at once")
    root: Path = request.app.state.runs_dir
    paths = list(dict.fromkeys(resolve_run(request, r) for r in run))
    records: list[RunRecord] = []
    notes: list[str] = []
    loaded: RecordCache = request.app.state.record_cache
    for p in paths:
        try:
            records.append(loaded.load(p))
        except PickaxeError as e:
            notes.append(f"{run_id(root, p)}: {e}")
    if not records:
        raise HTTPException(400, notes[0] if notes else "none of the selected runs has metrics yet")
    metrics = eval_metrics(records)
    if metric is not None and metric not in metrics and metrics:
        notes.append(f"no selected run logged {metric}; showing the default metric instead")
        metric = None
    if metric is None:
        kinds = {r.config.get("kind") for r in records}
        preferred = "eval/accuracy" if kinds == {"llm"} else DEFAULT_METRIC
        metric = preferred if preferred in metrics else (metrics[0] if metrics else preferred)
    try:
        comparison, groups = compare_runs(records, metric)
    except PickaxeError as e:
        raise HTTPException(400, str(e)) from None
    ids = {str(r.path): run_id(root, r.path) for r in records}
    group_of = {str(r.path): g.label for g in groups for r in g.runs}
    summaries = {s.label: s for s in comparison.groups}
    out_runs = []
    for r in records:
        steps, values = r.series(metric)
        out_runs.append(
            {
                "id": ids[str(r.path)],
                "seed": r.seed,
                "group": group_of.get(str(r.path)),
                "step": [int(s) for s in steps],
                "value": _floats(values),
            }
        )
    out_groups = []
    for g in groups:
        s = summaries[g.label]
        curve = None
        if s.n_runs > 1:  # one run has no band: its own line is the curve
            c = learning_curve(g.runs, metric, reps=comparison.reps, alpha=comparison.alpha, seed=comparison.seed)
            curve = {k: _floats(v) for k, v in c.items()}
        out_groups.append({**s.to_dict(), "run_ids": [ids[str(r.path)] for r in g.runs], "curve": curve})
    result = comparison.to_dict()
    return clean(
        {
            "metric": metric,
            "metrics": metrics,
            "confidence": result["confidence"],
            "runs": out_runs,
            "groups": out_groups,
            "varying": sorted({k for g in groups for k in g.varying}),
            "comparisons": result["comparisons"],
            "best": comparison.best,
            "winner": comparison.winner,
            "verdict": verdict(comparison),
            "notes": notes + comparison.notes,
        }
    )
