"""The persistent job queue (``pickaxe queue``, ``pickaxe worker``), gathered in one import.

It lives in three modules: :mod:`pickaxe.exp.queue_store` (the SQLite storage: ``JobQueue``, ``Job``),
:mod:`pickaxe.exp.processes` (process liveness) and :mod:`pickaxe.exp.worker` (running jobs); the command
line is :mod:`pickaxe.exp.queue_cli`. ``python -m pickaxe.exp.queue ...`` is ``pickaxe queue ...``
(``... worker ...`` is ``pickaxe worker ...``).
"""

from __future__ import annotations

import sys

from pickaxe.exp.processes import boot_id, group_alive, kill_group, process_alive, process_start
from pickaxe.exp.queue_store import STATES, Attempt, Job, JobQueue, NoQueueError, Timing, default_db_path

__all__ = [
    "STATES",
    "Attempt",
    "Job",
    "JobQueue",
    "NoQueueError",
    "Timing",
    "boot_id",
    "default_db_path",
    "group_alive",
    "kill_group",
    "main",
    "process_alive",
    "process_start",
]


def main(argv: list[str] | None = None) -> int:
    """``python -m pickaxe.exp.queue [queue] add|list|cancel|retry ...`` or ``... worker ...``: the same as
    ``pickaxe queue ...`` / ``pickaxe worker ...`` (one place turns user errors into exit status 2)."""
    from pickaxe.cli import main as cli_main

    argv = sys.argv[1:] if argv is None else list(argv)
    return cli_main(argv if argv and argv[0] in ("queue", "worker") else ["queue", *argv])


if __name__ == "__main__":
    raise SystemExit(main())
