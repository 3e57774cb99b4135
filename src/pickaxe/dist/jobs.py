"""Command lines as Ray tasks: what ``pickaxe sweep --backend ray`` runs each sweep point with.

A job is one command line (a ``pickaxe train`` or ``pickaxe resume``) run by :func:`run_command` inside a Ray
task that requests the job's cpus and GPUs. The task starts the command as a subprocess in its own process
group, in the driver's working directory, with stdout and stderr appended to the job's log file: a cluster
needs a filesystem shared by every node at the same path (the sweep folder, the working directory) and
pickaxe installed in the Python that runs the Ray workers (``python -m pickaxe.cli`` runs with that Python).

Stopping: ``ray.cancel`` raises ``KeyboardInterrupt`` in the task, which sends SIGTERM to the command (its
own process only: ``pickaxe train`` checkpoints at its next iteration boundary and exits 130; a supervising
``--max-restarts`` parent forwards it), waits up to ``kill_grace`` seconds, then SIGKILLs the whole group.
If the Ray worker itself dies (killed, its node lost), the command is killed with it (SIGKILL from the
kernel, ``PR_SET_PDEATHSIG``, as a queue worker's jobs are): a checkpoint on the way out could overlap the
next attempt resuming the same run folder, so that attempt resumes from the last checkpoint instead. Ray
never re-executes a job by itself (``max_retries=0``): the caller decides, from a :class:`JobOutcome`,
whether and how to run it again.

Ray is imported only through :func:`pickaxe.dist.runtime.import_ray`, when a :class:`RayJobs` is made.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from pickaxe.subprocesses import parent_death_signal

__all__ = ["JobOutcome", "RayJobs", "capacity", "run_command"]

RAY_WORKER_VARIABLES = ("RAY_JOB_ID", "RAY_RAYLET_PID", "RAY_OVERRIDE_NODE_ID_FOR_TESTING")
"""What a Ray worker's environment holds for that worker only (Ray strips the same from submitted jobs): a
command that starts or joins Ray itself (a ``--dist.*`` run) must not inherit them."""

KILL_GRACE_S = 60.0
"""Seconds a stopped command gets to checkpoint and exit before it is killed."""


def _local_python(argv: Sequence[str]) -> list[str]:
    """``argv`` with a ``python -m pickaxe.cli ...`` run by this process's Python (a node's own install)."""
    out = [str(a) for a in argv]
    if len(out) > 2 and out[1:3] == ["-m", "pickaxe.cli"]:
        out[0] = sys.executable
    return out


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _accept_interrupts() -> None:
    """Let a cancel interrupt this thread. ``ray.cancel`` raises ``KeyboardInterrupt`` through
    ``_thread.interrupt_main``, which does nothing while SIGINT is ignored, and a Ray worker inherits an ignored
    SIGINT from whatever started Ray (a non-interactive shell starts background commands with it ignored)."""
    import threading

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) in (
        signal.SIG_IGN,
        signal.SIG_DFL,
    ):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run_command(
    argv: Sequence[str],
    cwd: str,
    log_path: str,
    env: dict[str, str] | None = None,
    header: str = "",
    kill_grace: float = KILL_GRACE_S,
) -> dict[str, Any]:
    """Run ``argv`` in ``cwd`` with stdout+stderr appended to ``log_path``; returns ``exit_status`` (negative:
    the signal that ended it), ``host``, ``pid`` and ``wall_s``.

    ``env`` is added to this process's environment; ``header`` is written to the log first, with the host,
    pid and command. A ``KeyboardInterrupt`` while it runs (``ray.cancel``) stops the command as the module
    docstring says, then propagates. A command that cannot be started gives exit status 127.
    """
    argv = _local_python(argv)
    _accept_interrupts()
    host = socket.gethostname()
    child_env = {k: v for k, v in os.environ.items() if k not in RAY_WORKER_VARIABLES}
    child_env.update(env or {})
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    start = time.time()
    f: IO[bytes]
    with open(log_path, "ab") as f:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        f.write(f"### {header} on ray:{host}:{os.getpid()} at {stamp}: {shlex.join(argv)}\n".encode())
        f.flush()
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=child_env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=parent_death_signal(signal.SIGKILL),
            )  # fmt: skip
        except OSError as e:
            f.write(f"### cannot start the command: {e}\n".encode())
            return {"exit_status": 127, "host": host, "pid": None, "wall_s": time.time() - start}
    try:
        while True:  # a short timeout so that a cancel is seen however Ray delivers it
            try:
                status = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                continue
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)  # the command only: a second SIGTERM would abort its checkpoint
        deadline = time.monotonic() + kill_grace
        while proc.poll() is None and time.monotonic() < deadline:
            try:  # a repeated cancel (RayJobs.cancel re-sends it) must not cut the command's checkpoint short
                proc.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                continue
        _kill_group(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    _kill_group(proc.pid, signal.SIGKILL)  # anything the command left behind in its group
    return {"exit_status": status, "host": host, "pid": proc.pid, "wall_s": time.time() - start}


def _ray_job(argv: Sequence[str], cwd: str, log_path: str, env: dict[str, str], header: str) -> dict[str, Any]:
    """The Ray task: :func:`run_command` with the GPUs Ray gave the task (none: ``CUDA_VISIBLE_DEVICES=""``)
    and ``OMP_NUM_THREADS`` set to its cpus, as a queue worker sets them."""
    import ray

    ctx = ray.get_runtime_context()
    cpus = ctx.get_assigned_resources().get("CPU", 1)
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in ray.get_gpu_ids()),
        "OMP_NUM_THREADS": str(max(1, int(cpus))),
        **env,
    }
    return run_command(argv, cwd, log_path, env, header)


def capacity(ray: Any, cpus: float, gpus: float) -> int:
    """How many jobs of ``cpus`` cpus and ``gpus`` GPUs the Ray cluster's resources hold at once (>= 1).

    Raises ``PickaxeError`` when not even one fits."""
    from pickaxe.errors import PickaxeError

    total = ray.cluster_resources()
    have_cpus, have_gpus = float(total.get("CPU", 0)), float(total.get("GPU", 0))
    if cpus > have_cpus or gpus > have_gpus:
        raise PickaxeError(
            f"a job asks for {cpus:g} cpus and {gpus:g} GPUs but the Ray cluster has {have_cpus:g} cpus and "
            f"{have_gpus:g} GPUs; lower --job-cpus/--job-gpus or add nodes"
        )
    fits = [have_cpus / cpus] if cpus > 0 else []
    fits += [have_gpus / gpus] if gpus > 0 else []
    return max(1, int(min(fits))) if fits else 1 << 30


@dataclass
class JobOutcome:
    """How one submitted job ended."""

    key: int
    """The caller's key for the job (the sweep uses the queue job id)."""
    exit_status: int | None
    """The command's exit status; None when there is none (see ``lost``)."""
    lost: str | None = None
    """Why the job has no exit status: its Ray worker or node died, or Ray failed to run the task."""
    host: str | None = None
    """The node that ran it."""
    wall_s: float | None = None
    """Seconds the command ran."""


class RayJobs:
    """Submit command lines as Ray tasks and collect how they end.

    ``ray`` is an initialised Ray module (:func:`pickaxe.dist.runtime.ensure_ray`). One object is used
    from one thread.
    """

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self._task = ray.remote(max_retries=0)(_ray_job)
        self._refs: dict[Any, int] = {}

    @property
    def running(self) -> list[int]:
        """Keys of the jobs submitted and not yet collected."""
        return list(self._refs.values())

    def submit(
        self,
        key: int,
        argv: Sequence[str],
        cwd: str,
        log_path: str,
        *,
        cpus: float = 1,
        gpus: float = 0,
        env: dict[str, str] | None = None,
        header: str = "",
    ) -> None:
        """Start ``argv`` as a Ray task asking for ``cpus`` and ``gpus`` (see :func:`run_command`)."""
        task = self._task.options(num_cpus=cpus, num_gpus=gpus, name=header or None)
        ref = task.remote(list(argv), cwd, log_path, dict(env or {}), header)
        self._refs[ref] = key

    def cancel_one(self, key: int) -> None:
        """Stop the job ``key`` (it checkpoints); its outcome comes from :meth:`wait` when it has ended."""
        for ref, k in self._refs.items():
            if k == key:
                with contextlib.suppress(Exception):
                    self.ray.cancel(ref)

    def wait(self, timeout: float) -> list[JobOutcome]:
        """The jobs that ended within ``timeout`` seconds (all that have ended once one has)."""
        if not self._refs:
            time.sleep(timeout)
            return []
        ready, _ = self.ray.wait(list(self._refs), num_returns=len(self._refs), timeout=timeout, fetch_local=True)
        if not ready:
            return []
        return [self._collect(ref) for ref in ready]

    def _collect(self, ref: Any) -> JobOutcome:
        key = self._refs.pop(ref)
        try:
            result = self.ray.get(ref)
        except self.ray.exceptions.TaskCancelledError:
            return JobOutcome(key, None, lost="cancelled")
        except self.ray.exceptions.RayTaskError as e:  # run_command raised: a bug or a broken log path
            return JobOutcome(key, None, lost=f"the task failed: {str(e).strip().splitlines()[-1]}")
        except self.ray.exceptions.RayError as e:  # the worker or its node died, or the task was not run
            return JobOutcome(key, None, lost=f"{type(e).__name__}: {str(e).strip().splitlines()[0]}")
        return JobOutcome(key, int(result["exit_status"]), host=result["host"], wall_s=result["wall_s"])

    def cancel(self, timeout: float = KILL_GRACE_S + 10, force: bool = False) -> list[JobOutcome]:
        """Stop every running job (each checkpoints, see the module docstring; ``force`` kills the Ray workers at
        once) and wait up to ``timeout`` seconds for them to end; returns the outcomes collected."""
        out: list[JobOutcome] = []
        deadline = time.monotonic() + timeout
        resend = 0.0
        while self._refs and time.monotonic() < deadline:
            if time.monotonic() >= resend:  # again every few seconds: a cancel that reaches a task as it starts is lost
                for ref in self._refs:
                    with contextlib.suppress(Exception):
                        self.ray.cancel(ref, force=force)
                resend = time.monotonic() + 3.0
            out += self.wait(min(1.0, max(0.0, deadline - time.monotonic())))
        return out
