"""``pickaxe runs [DIR]``: every run folder under a directory with its state, progress and eval results.

Torch-free (reads ``config.json``, ``status.json`` and ``metrics.jsonl`` as JSON), so listing starts at once.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pickaxe.errors import PickaxeError
from pickaxe.runs.status import read_status, run_state, status_wall_s
from pickaxe.runs.tracking import read_metrics

SKIP_DIRS = {"checkpoints", "tensorboard", "control", "wandb", "mlruns", "engine_model", "__pycache__"}
"""Folders inside a run or sweep that never hold runs of their own."""


@dataclass
class RunSummary:
    """One run folder as ``pickaxe runs`` shows it."""

    path: Path
    recipe: str
    state: str
    """running, finished, interrupted, crashed or stopped (see :func:`pickaxe.runs.status.run_state`)."""
    step: int | None
    """Env steps done (the status's step, else the last logged step)."""
    total_steps: int | None
    metric: str
    """The eval metric shown: ``eval/return_mean``, or ``eval/accuracy`` for LLM runs."""
    final_eval: float | None
    best_eval: float | None
    wall_s: float | None
    """Wall time of the run, summed over its resumed segments, loading and warm start included (``status.json``'s;
    for a run written by an older pickaxe, the training time its metrics logged)."""
    phase: str | None = None
    """What a running run is doing (loading, warm_start, training, evaluating, ...; see
    :data:`pickaxe.runs.status.PHASES`); None for a run that is not running."""


def list_runs(root: str | Path) -> list[RunSummary]:
    """Every run folder (a folder with ``config.json``) at or under ``root``, e.g. inside sweep folders, by path."""
    return [summarize_run(p) for p in find_run_dirs(root)]


def find_run_dirs(root: str | Path) -> list[Path]:
    """The run folders ``list_runs`` lists (``root`` itself if it holds ``config.json``), sorted, without reading
    them: cheap enough to call on every page load of ``pickaxe ui``."""
    root = Path(root)
    if not root.is_dir():
        raise PickaxeError(f"{root} is not a folder; `pickaxe runs DIR` lists the runs under DIR (default runs/)")
    if (root / "config.json").is_file():
        return [root]
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        if "config.json" in files and Path(folder) != root:
            found.append(Path(folder))
            dirs[:] = []  # a run's own subfolders hold no runs
            continue
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
    return sorted(found)


def summarize_run(run_dir: str | Path) -> RunSummary:
    """The ``RunSummary`` of one run folder; unreadable files give empty fields, never an error."""
    run_dir = Path(run_dir)
    config = _read_json(run_dir / "config.json")
    trainer = config.get("trainer") if isinstance(config.get("trainer"), dict) else {}
    total = trainer.get("total_steps")
    metric = "eval/accuracy" if config.get("kind") == "llm" else "eval/return_mean"
    try:
        records = read_metrics(run_dir)
    except OSError:
        records = []
    evals = [
        float(r[metric])
        for r in records
        if _is_number(r.get(metric)) and not r.get("eval/phase_before")  # the LLM "before training" evaluation
    ]
    status = read_status(run_dir) or {}
    step = status.get("step") if type(status.get("step")) is int else None
    if step is None and records and type(records[-1].get("step")) is int:
        step = records[-1]["step"]
    state, phase, wall_s = live_status(run_dir, status)
    return RunSummary(
        path=run_dir,
        recipe=str(config.get("recipe", "?")),
        state=state,
        step=step,
        total_steps=total if type(total) is int else None,
        metric=metric,
        final_eval=evals[-1] if evals else None,
        best_eval=max(evals) if evals else None,
        wall_s=wall_s if wall_s is not None else _wall_time(records),
        phase=phase,
    )


def live_status(run_dir: str | Path, status: dict[str, Any] | None = None) -> tuple[str, str | None, float | None]:
    """The run's state, its phase while running (else None) and its wall time so far (None when ``status.json``
    does not record it), from ``status`` (read from ``run_dir`` when not given). Reads ``status.json`` only, so a
    cached summary of a running run is brought up to date cheaply."""
    if status is None:
        status = read_status(run_dir) or {}
    state = run_state(run_dir)
    phase = status.get("phase") if state == "running" and isinstance(status.get("phase"), str) else None
    if state == "running" and not status:
        phase = "loading"  # its folder is made, its first status not written yet
    return state, phase, status_wall_s(status, state)


def state_text(summary: RunSummary) -> str:
    """The state as ``pickaxe runs`` prints it: ``running (warm start)`` while a phase is known."""
    return f"{summary.state} ({summary.phase.replace('_', ' ')})" if summary.phase else summary.state


def format_runs(summaries: list[RunSummary]) -> str:
    """A plain-text table, one run per line; paths are printed whole (last column)."""
    if not summaries:
        return "no runs found (a run folder holds config.json)"
    header = ("recipe", "state", "env steps", "final eval", "best eval", "wall", "run")
    rows = [
        (
            s.recipe,
            state_text(s),
            f"{_count(s.step)}/{_count(s.total_steps)}",
            _eval(s.final_eval, s.metric),
            _eval(s.best_eval, s.metric),
            _duration(s.wall_s),
            str(s.path),
        )
        for s in summaries
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header) - 1)]
    right = {2, 3, 4, 5}
    lines = []
    for r in (header, *rows):
        cells = [r[i].rjust(w) if i in right else r[i].ljust(w) for i, w in enumerate(widths)]
        lines.append("  ".join([*cells, r[-1]]))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- helpers


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _wall_time(records: list[dict[str, Any]]) -> float | None:
    """Sum of each training segment's last ``time/elapsed_s``; a resume restarts the clock, so a drop starts a
    new segment."""
    total, last = 0.0, None
    for r in records:
        elapsed = r.get("time/elapsed_s")
        if not _is_number(elapsed):
            continue
        if last is not None and elapsed < last:
            total += last
        last = elapsed
    return None if last is None else total + last


def _count(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def _eval(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if metric == "eval/accuracy" else f"{value:.1f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
