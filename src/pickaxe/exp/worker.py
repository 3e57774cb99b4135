"""Running the queue's jobs: a ``Worker`` runs queued jobs as subprocesses (``pickaxe worker``; its command
line is in :mod:`pickaxe.exp.queue_cli`).

Each job runs in its own session (process group), with ``CUDA_VISIBLE_DEVICES`` set to the GPU ids the
worker gave it, stdout and stderr appended to its log file, and (on Linux) a parent-death signal so it
does not outlive a killed worker. The worker never runs more jobs than fit its cpu slots and GPUs.

Nothing is lost when a worker dies (SIGKILL, OOM-kill, reboot): the next worker to start (and every
running worker, every few seconds) finds the jobs left ``running`` by a dead worker, kills whatever is
left of their process groups and requeues them. An attempt after the first of a job whose ``run_dir``
holds a pickaxe run (``config.json``) runs ``python -m pickaxe.cli resume RUN_DIR --restart`` instead of the
original command, so training continues from its newest good checkpoint (from step 0 if it has none, which it says
in its log and its ``events.jsonl``).
A worker stopped with Ctrl-C or SIGTERM stops its jobs and puts them back in the queue the same way. The signal
only sets a flag, which the worker's loop reads between its queue transactions: a ``KeyboardInterrupt`` raised inside
one (as Python's default handler does) could leave the transaction open and the job's release to the queue failing,
so the job stayed ``running`` until another worker noticed. A second signal stops the worker at once.
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from secrets import token_hex
from types import FrameType
from typing import IO

from pickaxe.errors import PickaxeError
from pickaxe.exp.processes import ForkedProcess, fork_module, kill_group, preload_pickaxe, process_start
from pickaxe.exp.queue_jobs import Job
from pickaxe.exp.queue_store import HOST, TERMINAL, JobQueue
from pickaxe.subprocesses import parent_death_signal

__all__ = ["Worker", "detect_gpus", "resume_command", "run_jobs"]


def detect_gpus() -> tuple[str, ...]:
    """GPU ids this machine offers: ``CUDA_VISIBLE_DEVICES`` if set, else one per line of ``nvidia-smi -L``."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        out = []
        for part in visible.split(","):
            part = part.strip()
            if not part or part.startswith("-"):
                break  # CUDA stops at the first invalid id
            out.append(part)
        return tuple(out)
    try:
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ()
    if proc.returncode != 0:
        return ()
    return tuple(str(i) for i, _ in enumerate(ln for ln in proc.stdout.splitlines() if ln.startswith("GPU ")))


def resume_command(job: Job) -> list[str] | None:
    """``python -m pickaxe.cli resume RUN_DIR --restart --no-progress`` if this attempt of ``job`` should resume its
    run: it is not the first attempt and ``run_dir`` holds a pickaxe run. ``--restart``: a run killed before its first
    checkpoint starts again from step 0 (and says so) instead of failing every retry. None otherwise."""
    if job.attempts <= 1 or not job.run_dir or not (Path(job.run_dir) / "config.json").is_file():
        return None
    return [sys.executable, "-m", "pickaxe.cli", "resume", job.run_dir, "--restart", "--no-progress"]


@dataclass
class _Running:
    job: Job
    attempt: int
    proc: subprocess.Popen | ForkedProcess
    pid_start: int | None
    pidfd: int | None
    stop_sent: float | None = None  # monotonic time SIGTERM went to the group (cancel)


class Worker:
    """Runs queued jobs as subprocesses within ``slots`` cpus and the ``gpus`` ids.

    ``slots`` defaults to ``os.cpu_count()``, ``gpus`` to :func:`detect_gpus`. ``poll`` is the longest the
    worker waits between looks at the queue (a finished job wakes it at once). ``echo`` receives one line
    per job start and end (e.g. ``print``); ``on_finish`` gets each job this worker finished. One ``Worker``
    object runs in one thread at a time.

    With ``warm`` the worker imports pickaxe and torch once and starts each CPU job whose command is
    ``python -m pickaxe.cli ...`` (this interpreter) as a forked child instead of a fresh interpreter: the same
    session, log, environment, parent-death signal and queue records, without the seconds of interpreter start
    and imports per job. Other commands, and jobs given GPUs, start as subprocesses. Only for a worker whose
    process runs no other threads (``pickaxe sweep``'s in-process worker).
    """

    def __init__(
        self,
        queue: JobQueue,
        slots: int | None = None,
        gpus: Sequence[str | int] | None = None,
        poll: float = 0.2,
        *,
        worker_id: str | None = None,
        heartbeat: float = 2.0,
        recover_every: float = 5.0,
        kill_grace: float = 5.0,
        echo: Callable[[str], None] | None = None,
        on_finish: Callable[[Job], None] | None = None,
        warm: bool = False,
    ) -> None:
        self.queue = queue
        self.slots = int(slots if slots is not None else (os.cpu_count() or 1))
        if self.slots < 1:
            raise PickaxeError(f"a worker needs at least 1 slot, got {self.slots}")
        self.gpus = tuple(str(g) for g in (detect_gpus() if gpus is None else gpus))
        self.poll = float(poll)
        self.id = worker_id or f"{HOST}:{os.getpid()}:{token_hex(3)}"
        self.heartbeat, self.recover_every, self.kill_grace = heartbeat, recover_every, kill_grace
        self.echo = echo
        self.on_finish = on_finish
        self._running: dict[int, _Running] = {}
        self._stop_signal: int | None = None  # the SIGINT / SIGTERM that asked this worker to stop
        self._child_setup = parent_death_signal(signal.SIGKILL)
        self.warm = warm and hasattr(os, "fork")
        if self.warm:
            preload_pickaxe()

    # --------------------------------------------------------------------------------------------- loop
    def run(self, until_empty: bool = True, jobs: Iterable[int] | None = None) -> dict[int, int]:
        """Run jobs; returns ``{job id: exit status}`` of the jobs this worker finished.

        With ``until_empty`` it returns once it is idle and no queued job it could run is left (or none can
        become runnable because nothing runs anywhere); otherwise it runs until interrupted. With ``jobs``
        it runs only those jobs and the jobs they depend on, and returns when all of ``jobs`` have ended.
        A ``KeyboardInterrupt`` (or any exception) stops the running jobs, puts them back in the queue and
        propagates. Run in the main thread, it takes SIGINT and SIGTERM for the call: either raises
        ``KeyboardInterrupt`` at the top of the loop, outside any queue transaction (a second one at once).
        """
        with self._stop_on_signals():
            return self._run(until_empty, jobs)

    @contextlib.contextmanager
    def _stop_on_signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM set ``_stop_signal`` for the duration (main thread only), then the old handlers."""
        self._stop_signal = None
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if self._stop_signal is not None:
                raise KeyboardInterrupt  # asked twice: stop now, wherever the worker is
            self._stop_signal = signum

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self, until_empty: bool, jobs: Iterable[int] | None) -> dict[int, int]:
        targets = None if jobs is None else {int(j) for j in jobs}
        only = None if targets is None else self.queue.dependency_closure(targets)
        results: dict[int, int] = {}
        self.queue.register_worker(self.id, self.slots, self.gpus)
        self.queue.recover(self.id)
        last_beat = last_recover = time.monotonic()
        try:
            while True:
                if self._stop_signal is not None:
                    self._say(f"{signal.Signals(self._stop_signal).name}: stopping the running jobs")
                    raise KeyboardInterrupt
                self._reap(results)
                self._check_running()
                now = time.monotonic()
                if now - last_beat >= self.heartbeat:
                    self.queue.heartbeat(self.id)
                    last_beat = now
                if now - last_recover >= self.recover_every:
                    self.queue.recover(self.id)
                    last_recover = now
                started = self._fill(only)
                if not self._running and not started and self._done(until_empty, targets, only):
                    break
                self._wait(self.poll)
        except BaseException:
            self._abort()
            raise
        finally:
            with contextlib.suppress(Exception):
                self.queue.stop_worker(self.id)
        return results

    def _done(self, until_empty: bool, targets: set[int] | None, only: set[int] | None) -> bool:
        """Called when idle and nothing could be claimed."""
        if targets is not None:
            states = {j: self.queue.get(j).state for j in only or ()}
            if all(states[j] in TERMINAL for j in targets):
                return True
            if not any(s == "running" for s in states.values()):
                waiting = sorted(j for j in targets if states[j] not in TERMINAL)
                raise PickaxeError(f"jobs {waiting} cannot run on this worker ({self.slots} slots, gpus {self.gpus})")
            return False
        if not until_empty:
            return False
        queued, running = self.queue.counts(self.slots, len(self.gpus))
        return queued == 0 or running == 0

    def _fill(self, only: set[int] | None) -> int:
        started = 0
        while True:
            used_cpus = sum(r.job.cpus for r in self._running.values())
            used_gpus = {g for r in self._running.values() for g in r.job.gpu_ids}
            free_cpus = self.slots - used_cpus
            if free_cpus <= 0:
                return started
            free_gpus = [g for g in self.gpus if g not in used_gpus]
            job = self.queue.claim(
                self.id, free_cpus, free_gpus, max_cpus=self.slots, max_gpus=len(self.gpus), only=only
            )
            if job is None:
                return started
            self._start(job)
            started += 1

    def _start(self, job: Job) -> None:
        attempt = job.attempts
        resumed = resume_command(job)
        argv = resumed or job.argv
        log = Path(job.log_path or self.queue.log_path_for(job.id, attempt, job.run_dir))
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(job.gpu_ids)
        env["PICKAXE_JOB_ID"], env["PICKAXE_JOB_ATTEMPT"] = str(job.id), str(attempt)
        env["OMP_NUM_THREADS"] = str(job.cpus)  # the job's share of the slots, whatever the worker inherited
        how = " (resuming its run)" if resumed else ""
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            f: IO[bytes] = open(log, "ab")  # noqa: SIM115 - handed to the child, closed below
        except OSError as e:
            self._say(f"job {job.id}: cannot open log {log}: {e}")
            self.queue.finish(job.id, 127, attempt=attempt, worker_id=self.id)
            return
        with f:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            f.write(f"### pickaxe job {job.id} attempt {attempt} on {self.id} at {stamp}{how}: "
                    f"{shlex.join(argv)}\n".encode())  # fmt: skip
            f.flush()
            try:
                proc: subprocess.Popen | ForkedProcess
                if self._forkable(argv, job, env):
                    proc = fork_module(argv[2], argv[3:], job.cwd, env, f.fileno(), job.cpus, self._child_setup)
                else:
                    proc = subprocess.Popen(
                        argv, cwd=job.cwd, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                        start_new_session=True, preexec_fn=self._child_setup,
                    )  # fmt: skip
            except OSError as e:
                f.write(f"### cannot start the command: {e}\n".encode())
                self._say(f"job {job.id}: cannot start {argv[0]!r}: {e}")
                self.queue.finish(job.id, 127, attempt=attempt, worker_id=self.id)
                return
        pidfd = None
        with contextlib.suppress(AttributeError, OSError):
            pidfd = os.pidfd_open(proc.pid)
        running = _Running(job, attempt, proc, process_start(proc.pid), pidfd)
        self._running[job.id] = running
        if not self.queue.set_process(job.id, attempt, self.id, proc.pid, running.pid_start, argv):
            self._drop(running, "was taken over by another worker")
            return
        self._say(f"job {job.id} started (attempt {attempt}{how}): {shlex.join(argv)}")

    def _forkable(self, argv: list[str], job: Job, env: dict[str, str]) -> bool:
        """Whether ``warm`` starts this job as a forked child: ``python -m pickaxe.cli ...`` of this interpreter
        (a train, resume, ... command) on one cpu and no GPU (CUDA must not be set up before the child's own
        devices), while this process runs no other thread, and every PYTHONPATH folder of the job is on this
        process's ``sys.path`` (PYTHONPATH is read at interpreter start: a worker whose environment gained a folder
        later, for a ``module:EnvId`` env, starts such jobs in a fresh interpreter)."""
        return (
            self.warm
            and not job.gpu_ids
            and job.cpus == 1  # one torch thread: an OpenMP pool of this process would not survive the fork
            and threading.active_count() == 1
            and argv[:3] == [sys.executable, "-m", "pickaxe.cli"]
            and _on_sys_path(env.get("PYTHONPATH", ""))
        )

    def _reap(self, results: dict[int, int]) -> None:
        for job_id, r in list(self._running.items()):
            status = r.proc.poll()
            if status is None:
                continue
            del self._running[job_id]
            self._close(r)
            kill_group(r.proc.pid, r.pid_start, wait_s=0)  # anything the job left behind in its group
            if self.queue.finish(job_id, status, attempt=r.attempt, worker_id=self.id):
                results[job_id] = status
                job = self.queue.get(job_id)
                self._say(f"job {job_id} {job.state} ({job.reason or 'exit status 0'}); log {job.log_path}")
                if self.on_finish is not None:
                    self.on_finish(job)

    def _check_running(self) -> None:
        """Honour cancellations and give up attempts that are no longer this worker's."""
        for job_id, r in list(self._running.items()):
            job = self.queue.get(job_id)
            if job.state != "running" or job.worker_id != self.id or job.attempts != r.attempt:
                self._drop(r, "is no longer this worker's (requeued by another worker)")
            elif job.cancel_requested:
                if r.stop_sent is None:
                    self._say(f"job {job_id}: cancel requested; stopping it")
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(r.proc.pid, signal.SIGTERM)
                    r.stop_sent = time.monotonic()
                elif time.monotonic() - r.stop_sent > self.kill_grace:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(r.proc.pid, signal.SIGKILL)

    def _drop(self, r: _Running, why: str) -> None:
        self._say(f"job {r.job.id} {why}; killing attempt {r.attempt}")
        kill_group(r.proc.pid, r.pid_start)
        r.proc.wait()
        self._close(r)
        self._running.pop(r.job.id, None)

    def _wait(self, timeout: float) -> None:
        fds = [r.pidfd for r in self._running.values() if r.pidfd is not None]
        if fds and len(fds) == len(self._running):
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            poller.poll(timeout * 1000)
        else:
            time.sleep(timeout)

    def _abort(self) -> None:
        """Stop every running job (SIGTERM, then SIGKILL after ``kill_grace``) and put it back in the queue."""
        for r in self._running.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(r.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.kill_grace
        for r in list(self._running.values()):
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            kill_group(r.proc.pid, r.pid_start)
            r.proc.wait()
            self._close(r)
            with contextlib.suppress(Exception):
                if self.queue.release(r.job.id, r.attempt, self.id, outcome="interrupted"):
                    self._say(f"job {r.job.id}: worker stopping; attempt {r.attempt} stopped and the job requeued")
        self._running.clear()

    @staticmethod
    def _close(r: _Running) -> None:
        if r.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(r.pidfd)
            r.pidfd = None

    def _say(self, line: str) -> None:
        if self.echo is not None:
            self.echo(f"pickaxe worker: {line}")


def run_jobs(
    queue: JobQueue, job_ids: Iterable[int], slots: int | None = None, gpus: Sequence[str | int] | None = None,
    poll: float = 0.05, on_finish: Callable[[Job], None] | None = None, warm: bool = False,
) -> dict[int, int | None]:  # fmt: skip
    """Run ``job_ids`` (and the jobs they depend on) with an in-process worker until they have all ended.

    Returns each job's exit status (None for a job that never ran: blocked, or cancelled while queued).
    ``on_finish`` is called with each job as it ends (e.g. to print progress); ``warm`` forks pickaxe jobs from
    this process (``Worker``).
    ``queue.timing(job_ids)`` then tells how much of the wall time was spent inside the jobs' processes.
    Raises ``PickaxeError`` if a job needs more cpus or GPUs than the worker has.
    """
    ids = [int(j) for j in job_ids]
    worker = Worker(queue, slots=slots, gpus=gpus, poll=poll, on_finish=on_finish, warm=warm)
    for j in sorted(queue.dependency_closure(ids)):
        job = queue.get(j)
        if job.cpus > worker.slots or job.gpus > len(worker.gpus):
            raise PickaxeError(
                f"job {j} needs {job.cpus} cpus and {job.gpus} gpus; this worker has {worker.slots} slots and "
                f"{len(worker.gpus)} gpus"
            )
    worker.run(until_empty=False, jobs=ids)
    return {j: queue.get(j).exit_status for j in ids}


def _on_sys_path(pythonpath: str) -> bool:
    """Whether every folder of a PYTHONPATH value is on this process's ``sys.path``."""
    here = {os.path.abspath(p) for p in sys.path if p}
    return all(os.path.abspath(p) in here for p in pythonpath.split(os.pathsep) if p)
