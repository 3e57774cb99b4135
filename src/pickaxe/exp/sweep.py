"""Sweeps: a grid of flag values x seeds, run through the job queue, then compared.

``pickaxe sweep cartpole-ppo --algo.lr 1e-3,3e-4 --algo.clip 0.1,0.2 --seeds 5 --workers 2`` expands
to 2 x 2 x 5 runs under one sweep directory (``<sweep>/<point>/seed-<s>``), queues them in the sweep's
own SQLite queue (``<sweep>/queue.db``), runs them with an in-process worker of ``--workers`` slots and
finishes with ``pickaxe compare`` on the sweep. A line per finished run (with its last evaluation) shows
progress. With ``--backend ray`` each run is a Ray task instead (:mod:`pickaxe.dist.jobs`) asking for
``--job-cpus``/``--job-gpus``, on this machine or the cluster at ``--address``; the sweep's queue still
records every job and attempt, so the folders, the resume rules, the progress lines and the comparison are
the same (and a sweep begun on one backend can be continued on the other).

The default sweep directory, ``runs/sweep-<recipe>-<hash>``, is derived from the recipe, the grid, the fixed
flags and the seeds (not the backend), so running the same command again finds it and continues the sweep:
finished runs are kept, interrupted ones resume from their checkpoints.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import itertools
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from secrets import token_hex
from typing import Any, Literal

from pickaxe.argparsing import parse, wants_help
from pickaxe.config_keys import ranged
from pickaxe.errors import ConfigError, PickaxeError

SWEEP_FILE = "sweep.json"
OPTION_FLAGS = (
    "--seeds", "--workers", "--sweep-dir", "--seed-offset", "--backend", "--address", "--job-cpus", "--job-gpus",
)  # fmt: skip
BACKENDS = ("queue", "ray")
LOST_RETRIES = 3
"""Times a Ray-backed run whose Ray worker or node died is run again (resuming) in one sweep invocation."""


@dataclass
class SweepOptions:
    """Run a grid of config values x seeds through a job queue, then compare the groups.

    Every other flag is a `pickaxe train` config flag: `--key v1,v2` (comma-separated) is swept, `--key v` is
    fixed for every run, e.g. `pickaxe sweep cartpole-ppo --algo.lr 3e-3,3e-4 --seeds 5 --workers 2`.
    Rerunning the same command continues the sweep (same default folder).

    Retries: `--max-restarts N` (a train flag) restarts a crashed run from its checkpoint, on either backend."""

    seeds: int = ranged(3, ge=1)
    """Seeds per grid point (runs seeds seed-offset .. seed-offset + seeds - 1)."""
    workers: int | None = ranged(None, ge=1)
    """Runs at a time (default: the number of cores; with --backend ray, as many as the Ray cluster holds)."""
    sweep_dir: str | None = None
    """Sweep folder (default runs/sweep-<recipe>-<hash of recipe, grid, flags and seeds>)."""
    seed_offset: int = ranged(0, ge=0)
    """First seed."""
    backend: Literal["queue", "ray"] = "queue"
    """queue: this machine's worker slots; ray: each run a Ray task (cluster: a shared filesystem, same paths)."""
    address: str | None = None
    """With --backend ray: the Ray cluster to join (auto, host:port); default: start Ray on this machine."""
    job_cpus: int = ranged(1, ge=1)
    """Cpus each run asks for."""
    job_gpus: int = ranged(0, ge=0)
    """GPUs each run asks for."""


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

    Sweep options: ``--seeds N``, ``--workers N``, ``--sweep-dir DIR``, ``--seed-offset K``, ``--backend B``,
    ``--address A``, ``--job-cpus N``, ``--job-gpus N``.
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
    """``pickaxe sweep RECIPE [--key v1,v2 ...] [--seeds N] [--workers N] [--sweep-dir DIR] [--seed-offset K]
    [--backend queue|ray] [--address A] [--job-cpus N] [--job-gpus N]``."""
    if wants_help(args):
        parse(SweepOptions, ["--help"], "pickaxe sweep RECIPE [--key v1,v2 ...]")
    if not args or args[0].startswith("-"):
        raise PickaxeError(
            "usage: pickaxe sweep RECIPE --algo.lr 1e-3,3e-4 [--seeds N] [--workers N] [--sweep-dir DIR] "
            "[--backend queue|ray]"
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
    backend = option_values.get("backend", "queue")
    if backend not in BACKENDS:
        close = difflib.get_close_matches(backend, BACKENDS, n=1, cutoff=0.0)
        raise ConfigError(f"unknown --backend {backend!r}; did you mean {close[0]!r}? (backends: queue, ray)")
    opts = parse(
        SweepOptions,
        [a for k, v in option_values.items() for a in (f"--{k}", v)],
        f"pickaxe sweep {recipe}",
    )
    if opts.address is not None and opts.backend != "ray":
        raise ConfigError("--address is the Ray cluster of --backend ray; add --backend ray or drop --address")
    if opts.address is not None:
        from pickaxe.train.config import check_ray_address

        check_ray_address(opts.address, "--address")  # seconds, not the minutes Ray waits for an absent cluster
    on_ray = opts.backend == "ray"
    workers = opts.workers or os.cpu_count() or 1
    points = expand_grid(axes, opts.seeds, opts.seed_offset)
    # every run's flags are checked before anything is queued: each grid point once, and the largest seed (the
    # seeds of a point differ only in --seed; a check costs ~0.1 s, a tenth of a 2 x 5 sweep's runs' start-up)
    checked: set[tuple[tuple[str, str], ...]] = set()
    for i, p in enumerate(points):
        if p.values not in checked or i == len(points) - 1:
            parse_train(recipe, [*fixed, *p.args()])
            checked.add(p.values)
    spec = sweep_spec(recipe, axes, fixed, opts.seeds, opts.seed_offset)
    sweep_dir = Path(opts.sweep_dir) if opts.sweep_dir else default_sweep_dir(spec)
    spec_path = sweep_dir / SWEEP_FILE
    if spec_path.exists() and json.loads(spec_path.read_text()) != spec:
        raise PickaxeError(f"{sweep_dir} holds a different sweep ({spec_path}); use another --sweep-dir")
    ray = None
    if on_ray:  # before anything is written: a missing extra or an unreachable cluster leaves no folder
        from pickaxe.dist.jobs import capacity
        from pickaxe.dist.runtime import ensure_ray

        ray = ensure_ray(opts.address)
        capacity(ray, opts.job_cpus, opts.job_gpus)  # not even one run fits: say so now
    sweep_dir.mkdir(parents=True, exist_ok=True)
    queue = JobQueue(sweep_dir / "queue.db")
    if spec_path.exists():  # continuing: the same spec was asked for
        ids = [job.id for job in queue.list()]
    else:
        ids = [
            queue.add(
                [sys.executable, "-m", "pickaxe.cli", "train", recipe, *fixed, *p.args(),
                 "--run-dir", str(p.run_dir(sweep_dir)), "--no-progress"],
                name=f"{p.point}/seed-{p.seed}", run_dir=p.run_dir(sweep_dir), cpus=opts.job_cpus, gpus=opts.job_gpus,
            )
            for p in points
        ]  # fmt: skip
        spec_path.write_text(json.dumps(spec, indent=2) + "\n")
    done = sum(queue.get(i).state == "succeeded" for i in ids)
    where = f"on Ray ({_ray_where(ray, opts.workers)})" if on_ray else f"{workers} workers"
    print(
        f"pickaxe: sweep of {len(points)} runs ({len(points) // opts.seeds} points x {opts.seeds} seeds) in "
        f"{sweep_dir}, {where}" + (f"; {done} already finished" if done else ""),
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
    if on_ray:
        statuses = run_on_ray(queue, ids, ray, opts, on_finish=report)
    else:
        # --workers counts runs; the worker's slots count cpus (a run takes --job-cpus of them)
        cpu_slots = opts.workers * opts.job_cpus if opts.workers else workers
        # warm: runs are forked from this process with pickaxe imported (seconds saved per run, same numbers);
        # PICKAXE_SWEEP_FORK=0 starts each in a fresh interpreter instead (benchmarks/sweep.py compares the two)
        warm = os.environ.get("PICKAXE_SWEEP_FORK", "1") != "0"
        statuses = run_jobs(queue, ids, slots=cpu_slots, on_finish=report, warm=warm)
    wall = time.perf_counter() - start
    failed = [queue.get(i) for i, status in statuses.items() if status != 0]
    timing = queue.timing(ids)
    slots = opts.workers or (_ray_slots(ray, opts) if on_ray else max(1, workers // opts.job_cpus))
    busy = timing.job_s / max(slots * wall, 1e-9)
    summary: dict[str, Any] = {
        "runs": len(ids),
        "failed": len(failed),
        "wall_s": round(wall, 2),
        "job_s": round(timing.job_s, 2),
        "slot_busy_fraction": round(busy, 4),
        "backend": opts.backend,
    }
    if on_ray:
        summary.update(ray_address=opts.address or "local", job_cpus=opts.job_cpus, job_gpus=opts.job_gpus)
    (sweep_dir / "sweep_timing.json").write_text(json.dumps(summary, indent=2) + "\n")
    for job in failed:
        again = ", then this sweep command again" if on_ray else ""
        print(
            f"pickaxe: run {job.name} failed (exit {job.exit_status}); log: {job.log_path}; "
            f"`pickaxe queue retry {job.id} --db {sweep_dir / 'queue.db'}`{again} reruns it",
            file=sys.stderr,
        )
    if len(failed) == len(ids):
        raise PickaxeError(f"every run of the sweep failed; see the logs above ({sweep_dir})")
    compare([sweep_dir], out_dir=sweep_dir / "compare")
    return 1 if failed else 0


def _ray_slots(ray: Any, opts: SweepOptions) -> int:
    """Runs of ``opts``' size the Ray cluster holds at once (``--workers`` caps it)."""
    from pickaxe.dist.jobs import capacity

    fits = capacity(ray, opts.job_cpus, opts.job_gpus)
    return min(fits, opts.workers) if opts.workers else fits


def _ray_where(ray: Any, workers: int | None) -> str:
    """``local, 4 cpus, 0 GPUs, at most 2 runs at a time`` for the start line."""
    total = ray.cluster_resources()
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    cap = f", at most {workers} runs at a time" if workers else ""
    return f"{nodes} node{'s' * (nodes != 1)}, {total.get('CPU', 0):g} cpus, {total.get('GPU', 0):g} GPUs{cap}"


def run_on_ray(
    queue: Any, ids: list[int], ray: Any, opts: SweepOptions, on_finish: Callable[[Any], None] | None = None
) -> dict[int, int | None]:
    """Run the queued jobs ``ids`` of ``queue`` as Ray tasks until they have all ended; returns each job's exit
    status (None for a job that never ran), like :func:`pickaxe.exp.worker.run_jobs`.

    This process acts as the queue's worker (id ``ray:HOST:PID:...``): it claims a job, runs its command (or,
    on a later attempt of a job whose run exists, ``pickaxe resume RUN_DIR --restart``) as a Ray task asking for
    ``opts.job_cpus``/``opts.job_gpus``, and records its end. At most ``opts.workers`` run at once (default:
    as many as the cluster's resources hold now). A run whose Ray worker or node died is requeued and resumed,
    up to ``LOST_RETRIES`` times. A ``pickaxe queue cancel`` of a running job stops its task. Ctrl-C stops every
    task (each run checkpoints; Ctrl-C again kills them), requeues their jobs and raises ``KeyboardInterrupt``.
    """
    from pickaxe.dist.jobs import RayJobs
    from pickaxe.exp.queue_store import HOST
    from pickaxe.exp.worker import resume_command

    jobs = RayJobs(ray)
    worker_id = f"ray:{HOST}:{os.getpid()}:{token_hex(3)}"
    queue.register_worker(worker_id, opts.workers, ())
    queue.recover(worker_id)  # jobs left running by a sweep that died: requeued, they resume
    env = {k: v for k, v in os.environ.items() if k.startswith("PICKAXE_") and not k.startswith("PICKAXE_JOB_")}
    attempts: dict[int, int] = {}  # running job id -> its attempt
    cancelling: set[int] = set()
    lost: dict[int, int] = {}

    def say(line: str) -> None:
        print(f"pickaxe: {line}", file=sys.stderr, flush=True)

    def ended(job_id: int) -> None:
        if on_finish is not None:
            on_finish(queue.get(job_id))

    def settle(job_id: int, status: int | None, why: str | None) -> None:
        """Record how an attempt ended: its exit status, else (its task lost) requeue it to resume."""
        attempt = attempts.pop(job_id)
        was_cancelled = job_id in cancelling
        cancelling.discard(job_id)
        if status is not None:
            if queue.finish(job_id, status, attempt=attempt, worker_id=worker_id):
                ended(job_id)
            return
        name = queue.get(job_id).name
        if not was_cancelled and lost.get(job_id, 0) >= LOST_RETRIES:
            say(f"run {name}: {why}; {LOST_RETRIES} reruns are used up")
            if queue.finish(job_id, 1, attempt=attempt, worker_id=worker_id):
                ended(job_id)
        elif queue.release(job_id, attempt, worker_id, outcome="lost"):
            if queue.get(job_id).state == "queued":
                lost[job_id] = lost.get(job_id, 0) + 1
                say(f"run {name}: {why}; requeued ({lost[job_id]}/{LOST_RETRIES}), it resumes from its checkpoint")
            else:  # cancelled by `pickaxe queue cancel`
                ended(job_id)

    def stopped(job_id: int) -> None:
        """After Ctrl-C: the job goes back in the queue (the next sweep resumes it)."""
        queue.release(job_id, attempts.pop(job_id), worker_id, outcome="interrupted")

    def submit(job: Any) -> None:
        resumed = resume_command(job)
        argv = resumed or job.argv
        how = " (resuming its run)" if resumed else ""
        log = job.log_path or str(queue.log_path_for(job.id, job.attempts, job.run_dir))
        attempts[job.id] = job.attempts
        jobs.submit(
            job.id, argv, job.cwd, log, cpus=opts.job_cpus, gpus=opts.job_gpus, env=env,
            header=f"pickaxe job {job.id} attempt {job.attempts}{how}",
        )  # fmt: skip

    last_beat = time.monotonic()
    previous_term = _sigterm_interrupts()
    try:
        while True:
            current = {i: queue.get(i) for i in ids}
            for i in attempts:
                if current[i].cancel_requested and i not in cancelling:
                    jobs.cancel_one(i)
                    cancelling.add(i)
            try:
                limit = _ray_slots(ray, opts)
            except PickaxeError:  # the cluster shrank below one run's size: wait for the running ones
                if not attempts:
                    raise
                limit = len(attempts)
            for i, job in current.items():
                if len(attempts) >= limit:
                    break
                if i in attempts or job.state != "queued":
                    continue
                claimed = queue.claim(worker_id, 1 << 30, ["ray"] * job.gpus, only=[i])
                if claimed is not None:
                    submit(claimed)
            if not attempts and not any(job.state == "queued" for job in current.values()):
                break  # the rest runs elsewhere (another worker of this queue) or is blocked
            for out in jobs.wait(0.5):
                settle(out.key, out.exit_status, out.lost)
            if time.monotonic() - last_beat > 5:
                queue.heartbeat(worker_id)
                last_beat = time.monotonic()
    except BaseException as e:  # Ctrl-C, SIGTERM, or an error here: stop the runs, put their jobs back
        if attempts:
            why = "interrupted" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}"
            say(f"{why}: stopping the runs; each checkpoints (Ctrl-C again kills them at once)")
        try:
            outs = jobs.cancel()
        except KeyboardInterrupt:
            outs = jobs.cancel(timeout=10, force=True)
        for out in outs:
            if out.exit_status is not None:  # it ended by itself before the cancel
                settle(out.key, out.exit_status, None)
            else:
                stopped(out.key)
        for i in list(attempts):
            stopped(i)
        raise
    finally:
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
        with contextlib.suppress(Exception):
            queue.stop_worker(worker_id)
    return {i: queue.get(i).exit_status for i in ids}


def _sigterm_interrupts() -> Any:
    """Make SIGTERM stop a Ray-backed sweep like Ctrl-C (runs checkpoint, jobs requeued) instead of Ray's handler,
    which ends the process at once; returns the handler to restore (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")

    return signal.signal(signal.SIGTERM, interrupt)
