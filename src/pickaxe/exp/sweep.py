"""Sweeps: a grid of flag values x seeds, run through the job queue, then compared.

``pickaxe sweep cartpole-ppo --algo.lr 1e-3,3e-4 --algo.clip 0.1,0.2 --seeds 5 --workers 2`` expands
to 2 x 2 x 5 runs under one sweep directory (``<sweep>/<point>/seed-<s>``), queues them in the sweep's
own SQLite queue (``<sweep>/queue.db``), runs them with an in-process worker of ``--workers`` slots and
finishes with ``pickaxe compare`` on the sweep. A line per finished run (with its last evaluation) shows
progress. The default sweep directory, ``runs/sweep-<recipe>-<hash>``, is derived from the recipe, the grid,
the fixed flags and the seeds, so running the same command again finds it and continues the sweep: finished
runs are kept, interrupted ones resume from their checkpoints.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pickaxe.argparsing import parse, wants_help
from pickaxe.config_keys import ranged
from pickaxe.errors import ConfigError, PickaxeError

SWEEP_FILE = "sweep.json"
OPTION_FLAGS = ("--seeds", "--workers", "--sweep-dir", "--seed-offset")


@dataclass
class SweepOptions:
    """Run a grid of config values x seeds through a job queue, then compare the groups.

    Every other flag is a `pickaxe train` config flag: `--key v1,v2` (comma-separated) is swept, `--key v` is
    fixed for every run, e.g. `pickaxe sweep cartpole-ppo --algo.lr 3e-3,3e-4 --seeds 5 --workers 2`.
    Rerunning the same command continues the sweep (same default folder)."""

    seeds: int = ranged(3, ge=1)
    """Seeds per grid point (runs seeds seed-offset .. seed-offset + seeds - 1)."""
    workers: int | None = ranged(None, ge=1)
    """Runs at a time (default: the number of cores)."""
    sweep_dir: str | None = None
    """Sweep folder (default runs/sweep-<recipe>-<hash of recipe, grid, flags and seeds>)."""
    seed_offset: int = ranged(0, ge=0)
    """First seed."""


@dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep: a grid point (its flag values) and a seed."""

    point: str
    """Directory-safe name of the grid point, e.g. ``lr=0.001_clip=0.1``."""
    values: tuple[tuple[str, str], ...]
    """``(key, value)`` of each swept flag, keys dotted (``algo.lr``)."""
    seed: int

    def args(self) -> list[str]:
        """The point's flags for ``pickaxe train``."""
        return [a for key, value in self.values for a in (f"--{key}", value)] + ["--seed", str(self.seed)]

    def run_dir(self, sweep_dir: Path) -> Path:
        """Where this run writes."""
        return sweep_dir / self.point / f"seed-{self.seed}"


def parse_sweep_args(args: list[str]) -> tuple[dict[str, list[str]], list[str], dict[str, str]]:
    """Split ``pickaxe sweep`` flags into swept axes (comma-separated values), fixed flags, and sweep options.

    Sweep options: ``--seeds N``, ``--workers N``, ``--sweep-dir DIR``, ``--seed-offset K``.
    """
    options_with_value = set(OPTION_FLAGS)
    axes: dict[str, list[str]] = {}
    fixed: list[str] = []
    options: dict[str, str] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        flag, eq, inline = flag.partition("=")
        if not flag.startswith("--"):
            raise ConfigError(f"unexpected argument {args[i]!r}; sweep flags look like --algo.lr 1e-3,3e-4")
        if eq:
            value, i = inline, i + 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            value, i = args[i + 1], i + 2
        else:
            fixed.append(flag)  # a boolean flag
            i += 1
            continue
        if flag in options_with_value:
            options[flag[2:]] = value
        elif flag == "--seed":
            raise ConfigError("a sweep sets --seed itself; use --seeds N (runs seeds 0..N-1) or --seed-offset K")
        elif "," in value:
            key = flag[2:].replace("-", "_")
            if key in axes:
                raise ConfigError(f"--{key} is swept twice")
            axes[key] = [v.strip() for v in value.split(",") if v.strip()]
        else:
            fixed += [flag, value]
    return axes, fixed, options


def _point_name(values: tuple[tuple[str, str], ...], short: dict[str, str]) -> str:
    parts = [f"{short[k]}={v}" for k, v in values]
    return re.sub(r"[^A-Za-z0-9=._+-]", "-", "_".join(parts)) or "default"


def expand_grid(axes: dict[str, list[str]], seeds: int, seed_offset: int = 0) -> list[SweepPoint]:
    """Every combination of the axes' values, each for seeds ``seed_offset .. seed_offset + seeds - 1``.

    Point names use the last part of each key (``algo.lr`` -> ``lr``) unless two axes share it.
    """
    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    keys = list(axes)
    last = [k.rsplit(".", 1)[-1] for k in keys]
    short = {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last, strict=True)}
    points = []
    for combo in itertools.product(*(axes[k] for k in keys)):
        values = tuple(zip(keys, combo, strict=True))
        name = _point_name(values, short)
        points += [SweepPoint(name, values, seed_offset + s) for s in range(seeds)]
    return points


def sweep_spec(recipe: str, axes: dict[str, list[str]], fixed: list[str], seeds: int, offset: int) -> dict[str, Any]:
    """What decides a sweep's runs (saved as ``sweep.json``; its hash names the default sweep folder)."""
    return {"recipe": recipe, "axes": axes, "fixed": fixed, "seeds": seeds, "seed_offset": offset}


def default_sweep_dir(spec: dict[str, Any], root: str | Path = "runs") -> Path:
    """``runs/sweep-<recipe>-<8 hex digits>``: the same recipe, grid, flags and seeds give the same folder."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]
    return Path(root) / f"sweep-{spec['recipe']}-{digest}"


def main_sweep(args: list[str]) -> int:
    """``pickaxe sweep RECIPE [--key v1,v2 ...] [--seeds N] [--workers N] [--sweep-dir DIR] [--seed-offset K]``."""
    if wants_help(args):
        parse(SweepOptions, ["--help"], "pickaxe sweep RECIPE [--key v1,v2 ...]")
    if not args or args[0].startswith("-"):
        raise PickaxeError(
            "usage: pickaxe sweep RECIPE --algo.lr 1e-3,3e-4 [--seeds N] [--workers N] [--sweep-dir DIR]"
        )
    return run_sweep(args[0], args[1:])


def _last_eval(run_dir: str | None) -> str:
    """``, eval/return_mean 187.2`` for a run's last evaluation ('' when it has none)."""
    from pickaxe.runs.listing import summarize_run

    summary = summarize_run(run_dir) if run_dir else None
    if summary is None or summary.final_eval is None:
        return ""
    return f", {summary.metric} {summary.final_eval:.4g}"


def run_sweep(recipe: str, args: list[str]) -> int:
    """Expand, validate, queue and run the sweep, then compare it; returns the exit status (1 if a run failed)."""
    from pickaxe.exp.compare import compare
    from pickaxe.exp.queue_store import JobQueue
    from pickaxe.exp.worker import run_jobs
    from pickaxe.recipes.args import parse_train

    axes, fixed, option_values = parse_sweep_args(args)
    opts = parse(
        SweepOptions,
        [a for k, v in option_values.items() for a in (f"--{k}", v)],
        f"pickaxe sweep {recipe}",
    )
    workers = opts.workers or os.cpu_count() or 1
    points = expand_grid(axes, opts.seeds, opts.seed_offset)
    for p in points:  # every run's flags are checked before anything is queued
        parse_train(recipe, [*fixed, *p.args()])
    spec = sweep_spec(recipe, axes, fixed, opts.seeds, opts.seed_offset)
    sweep_dir = Path(opts.sweep_dir) if opts.sweep_dir else default_sweep_dir(spec)
    spec_path = sweep_dir / SWEEP_FILE
    if spec_path.exists() and json.loads(spec_path.read_text()) != spec:
        raise PickaxeError(f"{sweep_dir} holds a different sweep ({spec_path}); use another --sweep-dir")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    queue = JobQueue(sweep_dir / "queue.db")
    if spec_path.exists():  # continuing: the same spec was asked for
        ids = [job.id for job in queue.list()]
    else:
        ids = [
            queue.add(
                [sys.executable, "-m", "pickaxe.cli", "train", recipe, *fixed, *p.args(),
                 "--run-dir", str(p.run_dir(sweep_dir)), "--no-progress"],
                name=f"{p.point}/seed-{p.seed}", run_dir=p.run_dir(sweep_dir),
            )
            for p in points
        ]  # fmt: skip
        spec_path.write_text(json.dumps(spec, indent=2) + "\n")
    done = sum(queue.get(i).state == "succeeded" for i in ids)
    print(
        f"pickaxe: sweep of {len(points)} runs ({len(points) // opts.seeds} points x {opts.seeds} seeds) in "
        f"{sweep_dir}, {workers} workers" + (f"; {done} already finished" if done else ""),
        file=sys.stderr,
    )
    finished = [done]

    def report(job: Any) -> None:
        finished[0] += 1
        took = f" in {job.wall_s:.1f} s" if job.wall_s is not None else ""
        print(
            f"pickaxe: [{finished[0]}/{len(ids)}] {job.name} {job.state}{took}{_last_eval(job.run_dir)}",
            file=sys.stderr,
            flush=True,
        )

    start = time.perf_counter()
    statuses = run_jobs(queue, ids, slots=workers, on_finish=report)
    wall = time.perf_counter() - start
    failed = [queue.get(i) for i, status in statuses.items() if status != 0]
    timing = queue.timing(ids)
    busy = timing.job_s / max(workers * wall, 1e-9)
    summary = {
        "runs": len(ids),
        "failed": len(failed),
        "wall_s": round(wall, 2),
        "job_s": round(timing.job_s, 2),
        "slot_busy_fraction": round(busy, 4),
    }
    (sweep_dir / "sweep_timing.json").write_text(json.dumps(summary, indent=2) + "\n")
    for job in failed:
        print(
            f"pickaxe: run {job.name} failed (exit {job.exit_status}); log: {job.log_path}; "
            f"`pickaxe queue retry {job.id} --db {sweep_dir / 'queue.db'}` reruns it",
            file=sys.stderr,
        )
    if len(failed) == len(ids):
        raise PickaxeError(f"every run of the sweep failed; see the logs above ({sweep_dir})")
    compare([sweep_dir], out_dir=sweep_dir / "compare")
    return 1 if failed else 0
