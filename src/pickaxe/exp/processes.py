"""Process liveness on this machine: is a pid the same process as before, is a process group empty, kill a group.

A pid with its start time (clock ticks since boot, from ``/proc/PID/stat``) names one process: a reused pid
has another start time. ``boot_id`` tells boots apart, so a pid recorded before a reboot is never trusted.
Where ``/proc`` is missing, ``os.kill(pid, 0)`` is the fallback. ``fork_module`` starts a ``python -m`` command as a
forked child of an interpreter that has already imported pickaxe (the queue worker's warm start).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from pickaxe.train.runtime import freeze_long_lived

__all__ = [
    "ForkedProcess",
    "boot_id",
    "fork_module",
    "group_alive",
    "kill_group",
    "preload_pickaxe",
    "process_alive",
    "process_start",
]


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


class ForkedProcess:
    """A job started by ``fork_module`` with the ``subprocess.Popen`` surface the worker uses: ``pid``,
    ``poll()``, ``wait()`` and ``returncode`` (negative: the signal that ended it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status if the child has ended (reaping it), else None."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to end; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.005)
        return self.returncode  # type: ignore[return-value]


def preload_pickaxe() -> None:
    """Import what a ``pickaxe.cli train``/``resume`` job imports (config parsing, torch, the trainer, the classic
    algorithms, gymnasium's classic-control envs), so forked jobs start with that done."""
    import importlib

    import pickaxe.recipes.args
    import pickaxe.train.build

    for module in [
        "gymnasium.envs.classic_control",
        "pickaxe.envs.vector",
        "pickaxe.subprocesses",
        "torch.utils.tensorboard",  # every run's TensorBoard writer: ~0.2 s of imports (tensorboard, protobuf)
        *(m.partition(":")[0] for m in pickaxe.train.build.ALGORITHMS.values()),
    ]:
        with contextlib.suppress(Exception):  # a job that needs a broken module still gets its own error
            importlib.import_module(module)


def fork_module(
    module: str,
    args: list[str],
    cwd: str | None,
    env: dict[str, str],
    log_fd: int,
    threads: int,
    setup: Callable[[], None] | None,
) -> ForkedProcess:
    """Run ``python -m MODULE ARGS`` in a forked child of this process (``runpy``, as the interpreter would): its
    own session, ``env`` as its environment, ``cwd``, stdin from /dev/null, stdout and stderr to ``log_fd``,
    ``threads`` torch threads; ``setup`` runs first (the worker's parent-death signal).

    The child skips the interpreter start and the imports this process has done (``preload_pickaxe``): with runs
    of a few seconds those were most of a sweep's wall time. The caller must be single-threaded when it forks, and
    the job must use one torch thread (an OpenMP pool the caller started does not survive a fork).
    """
    for stream in (sys.stdout, sys.stderr):  # nothing buffered here is written twice by the child
        with contextlib.suppress(Exception):
            stream.flush()
    # the worker's objects (imports), frozen once before its first fork: the children's collections skip them (no
    # full pass, ~0.3 s each, no copy-on-write of their pages) and a run's settle_for_training finds them frozen
    freeze_long_lived()
    pid = os.fork()
    if pid:
        return ForkedProcess(pid)
    code = 1
    try:  # the child: never returns into the caller's code
        atexit._clear()  # the caller's exit handlers are not the job's; the job's own run at its end
        os.setsid()
        if setup is not None:
            setup()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        # the caller's sys.stdout/stderr may not be fds 1 and 2 (a test's capture): write to the log itself
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
        if cwd:
            os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [sys.argv[0], *args]
        if "torch" in sys.modules:  # OMP_NUM_THREADS was read when this process imported torch
            sys.modules["torch"].set_num_threads(max(1, threads))
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0  # a module that returns without SystemExit exits 0, as under python -m
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()  # as interpreter exit would (trackers, writers)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
