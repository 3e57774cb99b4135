"""Process liveness on this machine: is a pid the same process as before, is a process group empty, kill a group.

A pid with its start time (clock ticks since boot, from ``/proc/PID/stat``) names one process: a reused pid
has another start time. ``boot_id`` tells boots apart, so a pid recorded before a reboot is never trusted.
Where ``/proc`` is missing, ``os.kill(pid, 0)`` is the fallback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

__all__ = ["boot_id", "group_alive", "kill_group", "process_alive", "process_start"]


def boot_id() -> str:
    """An id of the current boot of this machine ('' where the OS does not expose one)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time in clock ticks since boot) of ``pid`` from /proc, None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    return fields[0], int(fields[2]), int(fields[19])


def process_start(pid: int) -> int | None:
    """Start time of ``pid`` (clock ticks since boot), None if unknown; with the pid it names one process."""
    st = _stat(pid)
    return None if st is None else st[2]


def process_alive(pid: int, start: int | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, if ``start`` is given and knowable, is the same process."""
    if Path("/proc/self/stat").exists():
        st = _stat(pid)
        return st is not None and st[0] != "Z" and (start is None or st[2] == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is in process group ``pgid``."""
    if not Path("/proc/self/stat").exists():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None and st[1] == pgid and st[0] != "Z":
                return True
    return False


def kill_group(pgid: int, leader_start: int | None = None, sig: int = signal.SIGKILL, wait_s: float = 10.0) -> None:
    """Send ``sig`` to process group ``pgid`` (a job started with its own session) and wait until it is gone.

    If the group's leader pid now belongs to a different process (``leader_start`` differs), the group id was
    reused after the job's group ended, and nothing is sent.
    """
    st = _stat(pgid)
    if st is not None and leader_start is not None and st[2] != leader_start:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    deadline = time.monotonic() + wait_s
    while wait_s > 0 and group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)
