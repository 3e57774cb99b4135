"""The job queue's records: a job, one attempt to run it, where a set of jobs' time went, and the rules that read a
job's command line (its run folder, its default name) and its states. :mod:`pickaxe.exp.queue_store` keeps them in
SQLite."""

from __future__ import annotations

import difflib
import json
import os
import shlex
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pickaxe.errors import PickaxeError

__all__ = [
    "STATES",
    "Attempt",
    "Job",
    "Timing",
    "attempt_from_row",
    "check_states",
    "default_job_name",
    "exit_text",
    "train_run_dir",
]

STATES = ("queued", "running", "succeeded", "failed", "cancelled", "blocked")


@dataclass
class Job:
    """One queued command and its current state (a snapshot; call ``JobQueue.get`` for a fresh one)."""

    id: int
    name: str
    argv: list[str]
    cwd: str
    run_dir: str | None
    priority: int
    depends_on: tuple[int, ...]
    cpus: int
    gpus: int
    state: str
    reason: str | None
    attempts: int
    exit_status: int | None
    cancel_requested: bool
    worker_id: str | None
    pid: int | None
    gpu_ids: tuple[str, ...]
    created: float
    started: float | None
    finished: float | None
    log_path: str | None = None

    @property
    def wall_s(self) -> float | None:
        """Seconds from the start of the latest attempt to the end of the job (or now while running)."""
        if self.started is None or self.state in ("queued", "blocked"):
            return None
        return (self.finished if self.finished is not None else time.time()) - self.started

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass
class Attempt:
    """One run of a job: the command actually run, its process, log, times and outcome."""

    job_id: int
    attempt: int
    worker_id: str
    argv: list[str] | None
    log_path: str
    pid: int | None
    pid_start: int | None
    started: float
    ended: float | None
    exit_status: int | None
    outcome: str  # running, succeeded, failed, cancelled, lost (worker died), interrupted (worker stopped)

    @property
    def wall_s(self) -> float | None:
        """Seconds the attempt's process ran, None while it runs."""
        return None if self.ended is None else self.ended - self.started


@dataclass
class Timing:
    """Where the wall time of a set of jobs went (for measuring the queue's own overhead).

    ``job_s`` sums the wall time of every attempt's process; ``span_s`` runs from the earliest ``created``
    to the last attempt's end; ``run_span_s`` from the first attempt's start to the last one's end.
    """

    jobs: int
    attempts: int
    job_s: float
    span_s: float
    run_span_s: float
    per_job: dict[int, float] = field(default_factory=dict)


def attempt_from_row(r: Any) -> Attempt:
    """An :class:`Attempt` from its ``attempts`` table row."""
    return Attempt(
        job_id=r["job_id"],
        attempt=r["attempt"],
        worker_id=r["worker_id"],
        argv=json.loads(r["argv"]) if r["argv"] else None,
        log_path=r["log_path"],
        pid=r["pid"],
        pid_start=r["pid_start"],
        started=r["started"],
        ended=r["ended"],
        exit_status=r["exit_status"],
        outcome=r["outcome"],
    )


def exit_text(status: int) -> str:
    """How a process ended, in words: ``exit status N`` or ``killed by SIGNAME``."""
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


def train_run_dir(argv: list[str]) -> str | None:
    """The ``--run-dir`` of a ``pickaxe train`` command line, else None."""
    is_pickaxe = os.path.basename(argv[0]) == "pickaxe" or "pickaxe.cli" in argv
    if not is_pickaxe or "train" not in argv:
        return None
    for i, arg in enumerate(argv):
        if arg == "--run-dir" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--run-dir="):
            return arg.split("=", 1)[1]
    return None


def default_job_name(argv: list[str]) -> str:
    """A job's name from its command line: the command without the interpreter, the middle cut past 64 characters."""
    words = [os.path.basename(argv[0]), *argv[1:]]
    if len(argv) >= 3 and argv[1] == "-m":
        words = [argv[2].rsplit(".", 1)[0] if argv[2].endswith(".cli") else argv[2], *argv[3:]]
    text = shlex.join(words)
    return text if len(text) <= 64 else text[:30] + "…" + text[-33:]  # the end (seed, run dir) stays visible


def check_states(states: Iterable[str] | None) -> list[str] | None:
    """``states`` (names, or comma-separated lists of them) as a list; an unknown one is a one-line ``PickaxeError``
    naming the closest; None stays None."""
    if states is None:
        return None
    out = []
    for s in states:
        for part in str(s).split(","):
            part = part.strip()
            if part not in STATES:
                close = difflib.get_close_matches(part, STATES, n=1, cutoff=0.0)
                raise PickaxeError(
                    f"unknown job state {part!r}; did you mean {close[0]!r}? (states: {', '.join(STATES)})"
                )
            out.append(part)
    return out
