"""The persistent job queue (``pickaxe queue``, ``pickaxe worker``), gathered in one import.

It lives in four modules: :mod:`pickaxe.exp.queue_store` (the SQLite storage: ``JobQueue``, ``Job``),
:mod:`pickaxe.exp.processes` (process liveness) and :mod:`pickaxe.exp.worker` (running jobs); the command
line is :mod:`pickaxe.exp.queue_cli` (``pickaxe queue ...``, ``pickaxe worker ...``). This module re-exports
the storage and liveness names. Nothing under ``pickaxe.exp`` imports ``pickaxe.cli``.
"""

from __future__ import annotations

from pickaxe.exp.processes import boot_id, group_alive, kill_group, process_alive, process_start
from pickaxe.exp.queue_jobs import STATES, Attempt, Job, Timing
from pickaxe.exp.queue_store import JobQueue, NoQueueError, default_db_path

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
    "process_alive",
    "process_start",
]
