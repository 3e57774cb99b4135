"""``pickaxe queue add|list|cancel|retry`` and ``pickaxe worker``: the job queue's command line (tyro).

Reading commands never create the database: ``queue list`` on a machine without a queue says so.
``queue add`` checks a ``pickaxe train`` command the way ``pickaxe train`` would before queueing it.
"""

from __future__ import annotations

import difflib
import json
import sys
from dataclasses import dataclass
from typing import Annotated

import tyro

from pickaxe.argparsing import merge_repeated, parse, wants_help
from pickaxe.config_keys import ranged
from pickaxe.errors import PickaxeError
from pickaxe.exp.queue_store import JobQueue, NoQueueError

__all__ = ["main_queue", "main_worker"]

QUEUE_USAGE = """usage: pickaxe queue COMMAND [--db PATH] ...   (pickaxe queue COMMAND --help for its options)

commands:
  add [--priority P] [--after ID ...] [--cpus N] [--gpus N] [--name NAME] [--run-dir DIR] -- COMMAND...
                          queue a command; prints its job id (a `pickaxe train` command is checked first)
  list [--state S ...] [--json]
                          the jobs (states: queued running succeeded failed cancelled blocked)
  cancel ID               cancel a queued or blocked job; a running one is killed by its worker
  retry ID                queue a failed, cancelled or blocked job again (a run with --run-dir resumes)

The queue is ~/.pickaxe/queue.db unless PICKAXE_QUEUE or --db names another file.
Run jobs with `pickaxe worker [--slots N] [--until-empty]`."""

QUEUE_COMMANDS = ("add", "list", "cancel", "retry")


@dataclass
class AddArgs:
    """Queue the command after `--`; prints its job id. A `pickaxe train` command is checked before it is queued."""

    priority: int = 0
    """Higher runs first; first in, first out within a priority."""
    after: tuple[int, ...] = ()
    """Job ids that must succeed first (repeatable)."""
    cpus: int = ranged(1, ge=1)
    """Worker slots the job takes (and its OMP_NUM_THREADS)."""
    gpus: int = ranged(0, ge=0)
    """GPU ids the job takes (its CUDA_VISIBLE_DEVICES)."""
    name: str | None = None
    """Name shown by `queue list` (default: the command line)."""
    run_dir: str | None = None
    """The pickaxe run the command writes, resumed by later attempts (default: a train command's --run-dir)."""
    db: str | None = None
    """Queue database (default $PICKAXE_QUEUE or ~/.pickaxe/queue.db)."""


@dataclass
class ListArgs:
    """The jobs in the queue, oldest first."""

    state: tuple[str, ...] | None = None
    """Only jobs in these states (queued running succeeded failed cancelled blocked; repeatable)."""
    json: Annotated[bool, tyro.conf.FlagCreatePairsOff] = False
    """One JSON object per line instead of a table."""
    db: str | None = None
    """Queue database (default $PICKAXE_QUEUE or ~/.pickaxe/queue.db)."""


@dataclass
class JobArgs:
    """Act on one job."""

    id: tyro.conf.Positional[int]
    """The job id (`pickaxe queue list` shows them)."""
    db: str | None = None
    """Queue database (default $PICKAXE_QUEUE or ~/.pickaxe/queue.db)."""


def main_queue(argv: list[str]) -> int:
    """``pickaxe queue add|list|cancel|retry ...``; returns the exit status, raises ``PickaxeError`` on user errors."""
    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(QUEUE_USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "add":
        return _add(rest)
    if command == "list":
        return _list(rest)
    if command in ("cancel", "retry"):
        prog = f"pickaxe queue {command}"
        if not wants_help(rest):
            _job_id_words(rest, prog)
        args = parse(JobArgs, rest, prog, description="Cancel a job." if command == "cancel" else "Retry a job.")
        with JobQueue(args.db, create=False) as q:
            job = q.cancel(args.id) if command == "cancel" else q.retry(args.id)
        if command == "cancel" and job.state == "running":
            print(f"job {job.id} is running on worker {job.worker_id}; it will stop and be marked cancelled")
        else:
            print(f"job {job.id} {job.state}" + (f" ({job.reason})" if job.reason and job.state != "cancelled" else ""))
        return 0
    close = difflib.get_close_matches(command, QUEUE_COMMANDS, n=1, cutoff=0.0)
    raise PickaxeError(f"unknown queue command {command!r}; did you mean {close[0]!r}? (pickaxe queue --help)")


def _job_id_words(args: list[str], prog: str) -> None:
    """Job ids are integers: one line naming the bad one (tyro's own message is less direct)."""
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--db":
            skip = True
        elif not a.startswith("-"):
            try:
                int(a)
            except ValueError:
                raise PickaxeError(f"{prog}: job ids are integers, got {a!r}") from None


def _add(rest: list[str]) -> int:
    if "--" not in rest:
        if wants_help(rest):
            parse(AddArgs, ["--help"], "pickaxe queue add [OPTIONS] -- COMMAND...")
        raise PickaxeError(
            "pickaxe queue add needs the command after --, e.g. `pickaxe queue add -- pickaxe train cartpole-ppo`"
        )
    split = rest.index("--")
    options, command = rest[:split], rest[split + 1 :]
    args = parse(AddArgs, merge_repeated(options, "--after"), "pickaxe queue add")
    if not command:
        raise PickaxeError("pickaxe queue add: the command after -- is empty")
    from pickaxe.recipes.args import check_train_command

    check_train_command(command)  # a bad `pickaxe train` command fails now, not in a worker later
    with JobQueue(args.db) as q:
        job_id = q.add(
            command, name=args.name, priority=args.priority, depends_on=args.after, cpus=args.cpus, gpus=args.gpus,
            run_dir=args.run_dir,
        )  # fmt: skip
    print(job_id)
    return 0


def _list(rest: list[str]) -> int:
    args = parse(ListArgs, merge_repeated(rest, "--state"), "pickaxe queue list")
    try:
        q = JobQueue(args.db, create=False)
    except NoQueueError as e:
        print(f"pickaxe: {e}", file=sys.stderr)
        return 0
    with q:
        jobs = q.list(args.state)
        path = q.path
    if args.json:
        for job in jobs:
            print(json.dumps(job.to_dict()))
        return 0
    from rich.console import Console
    from rich.table import Table

    colours = {"queued": "cyan", "running": "yellow", "succeeded": "green", "failed": "red", "cancelled": "magenta",
               "blocked": "red"}  # fmt: skip
    table = Table(title=f"jobs in {path}", title_justify="left")
    columns = ("id", "name", "state", "prio", "after", "cpu", "gpu", "tries", "exit", "time", "note")
    for col in columns:
        # names are never cut: a sweep's names end with the seed, which tells its runs apart
        table.add_column(
            col,
            justify="right" if col in ("id", "prio", "cpu", "gpu", "tries", "exit") else "left",
            no_wrap=col == "name",
            overflow="fold",
        )
    rows = []
    for job in jobs:
        wall = job.wall_s
        note = job.reason or ""
        if job.state == "failed" and job.log_path:
            note = f"{note}; log {job.log_path}"
        elif job.state == "running":
            note = "cancelling" if job.cancel_requested else (f"log {job.log_path}" if job.log_path else "")
        rows.append((
            str(job.id),
            job.name,
            f"[{colours[job.state]}]{job.state}[/]",
            str(job.priority),
            ",".join(map(str, job.depends_on)),
            str(job.cpus),
            str(job.gpus) + (f" ({','.join(job.gpu_ids)})" if job.gpu_ids and job.state == "running" else ""),
            str(job.attempts),
            "" if job.exit_status is None else str(job.exit_status),
            "" if wall is None else _duration(wall),
            note,
        ))  # fmt: skip
    for row in rows:
        table.add_row(*row)
    console = Console()
    if not console.is_terminal:  # a pipe or a file: as wide as the widest cells, so nothing is cut or wrapped
        widths = [max(len(cell) for cell in cells) for cells in zip(columns, *rows, strict=True)]
        console = Console(width=max(80, sum(widths) + 3 * len(widths) + 1))
    console.print(table)
    return 0


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, s = divmod(int(seconds), 60)
    return f"{minutes}m{s:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


# ------------------------------------------------------------------------------------------------ worker
@dataclass
class WorkerArgs:
    """Run queued jobs (pickaxe queue add ...) until stopped, or with --until-empty until none is left.

    Ctrl-C or SIGTERM stops the running jobs and puts them back in the queue."""

    slots: int | None = ranged(None, ge=1)
    """CPUs to fill (default: all of this machine's); a job takes --cpus of them."""
    gpus: str | None = None
    """GPU ids to hand out, comma-separated, or 'none' (default: CUDA_VISIBLE_DEVICES or nvidia-smi -L)."""
    until_empty: Annotated[bool, tyro.conf.FlagCreatePairsOff] = False
    """Return once no queued job is left that this worker could run."""
    poll: float = ranged(0.2, gt=0)
    """Longest wait between looks at the queue, in seconds."""
    db: str | None = None
    """Queue database (default $PICKAXE_QUEUE or ~/.pickaxe/queue.db)."""


def main_worker(argv: list[str]) -> int:
    """``pickaxe worker ...``; returns the exit status, raises ``PickaxeError`` on user errors."""
    from pickaxe.exp.worker import Worker

    args = parse(WorkerArgs, list(argv), "pickaxe worker")
    gpus = None
    if args.gpus is not None:
        gpus = [] if args.gpus.strip().lower() in ("", "none") else [g.strip() for g in args.gpus.split(",")]
    queue = JobQueue(args.db)
    worker = Worker(queue, slots=args.slots, gpus=gpus, poll=args.poll, echo=lambda s: print(s, file=sys.stderr))
    print(
        f"pickaxe worker: {worker.id} on {queue.path}: {worker.slots} slots, gpus {list(worker.gpus) or 'none'}",
        file=sys.stderr,
    )

    try:
        worker.run(until_empty=args.until_empty)  # takes SIGINT and SIGTERM while it runs
    finally:
        queue.close()
    return 0
