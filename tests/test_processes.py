"""Process groups and liveness (pickaxe.exp.processes) and the worker's SIGTERM-then-SIGKILL escalation.

Each test starts a small ``sh`` process group of its own (``start_new_session``) and never signals anything
else; groups that ignore SIGTERM (``trap '' TERM``, inherited by their children) show the escalation.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pickaxe.exp import processes
from pickaxe.exp.processes import group_alive, kill_group, process_alive, process_start
from pickaxe.exp.queue_store import JobQueue
from pickaxe.exp.worker import Worker

IGNORES_TERM = "trap '' TERM; sleep 30 & sleep 30; wait"


def _records_term(path: Path) -> str:
    """A job that notes each SIGTERM in ``path`` and runs on (its children die of it; it starts new ones)."""
    return f"trap 'echo TERM >> {path}' TERM; sleep 30 & while :; do sleep 1; done"


class _Clock:
    """Stands in for ``processes.time``: ``sleep`` advances ``monotonic`` instead of waiting."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _group(script: str) -> subprocess.Popen:
    proc = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    _wait_for(lambda: _members(proc.pid) >= 2, "the group to start its children")
    return proc


def _members(pgid: int) -> int:
    """Live (non-zombie) processes in group ``pgid``."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            count += int(fields[2]) == pgid and fields[0] != "Z"
    return count


def _wait_for(cond: Callable[[], object], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def groups() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:  # whatever a failed test left behind
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_kill_group_kills_every_member_and_waits_until_they_are_gone(
    groups: list[subprocess.Popen], monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = _group("sleep 30 & sleep 30; wait")
    groups.append(proc)
    assert group_alive(proc.pid) and process_alive(proc.pid, process_start(proc.pid))
    seen: list[bool] = []  # what kill_group found each time it looked: it returns once the group is gone
    monkeypatch.setattr(processes, "group_alive", lambda pgid: seen.append(group_alive(pgid)) or seen[-1])
    kill_group(proc.pid, process_start(proc.pid), wait_s=600)
    assert seen and seen[-1] is False  # it stopped waiting because the group was gone, not at its limit
    assert _members(proc.pid) == 0 and not group_alive(proc.pid)
    assert proc.wait(timeout=120) == -signal.SIGKILL
    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait()
    kill_group(gone.pid)  # a group that is gone (its leader reaped): nothing to do, no error


def test_kill_group_sends_the_given_signal(groups: list[subprocess.Popen]) -> None:
    proc = _group("sleep 30 & sleep 30; wait")
    groups.append(proc)
    kill_group(proc.pid, sig=signal.SIGTERM)
    assert proc.wait(timeout=120) == -signal.SIGTERM


def test_kill_group_gives_up_after_its_wait(groups: list[subprocess.Popen], monkeypatch: pytest.MonkeyPatch) -> None:
    proc = _group(IGNORES_TERM)
    groups.append(proc)
    clock = _Clock()  # kill_group's own clock: how long it waited, exactly, whatever the machine's load
    monkeypatch.setattr(processes, "time", clock)
    kill_group(proc.pid, sig=signal.SIGTERM, wait_s=0.3)
    assert 0.3 <= clock.now < 0.3 + 0.02 + 1e-9  # waited its 0.3 s (in polls of 0.02 s) and then gave up
    assert _members(proc.pid) == 3  # SIGTERM ignored: the whole group still runs
    clock.now = 0.0
    kill_group(proc.pid, sig=signal.SIGTERM, wait_s=0)
    assert clock.now == 0.0 and group_alive(proc.pid)  # wait_s=0: signal and return, without a poll


def test_kill_group_spares_a_reused_group_id(groups: list[subprocess.Popen]) -> None:
    proc = _group("sleep 30 & sleep 30; wait")
    groups.append(proc)
    kill_group(proc.pid, leader_start=process_start(proc.pid) + 1)  # recorded for another process
    assert _members(proc.pid) == 3 and proc.poll() is None


def test_liveness_of_pids_and_zombies(groups: list[subprocess.Popen]) -> None:
    proc = _group("sleep 30 & sleep 30; wait")
    groups.append(proc)
    start = process_start(proc.pid)
    assert start is not None
    assert process_alive(proc.pid) and process_alive(proc.pid, start) and not process_alive(proc.pid, start + 1)
    os.killpg(proc.pid, signal.SIGKILL)
    _wait_for(lambda: _members(proc.pid) == 0, "the group to die")
    # the leader is a zombie until it is reaped: not alive, and its group counts as empty
    assert Path(f"/proc/{proc.pid}/stat").exists()
    assert not process_alive(proc.pid) and not group_alive(proc.pid)
    proc.wait()
    assert process_start(proc.pid) is None and not process_alive(proc.pid)


def test_liveness_without_proc(groups: list[subprocess.Popen], monkeypatch: pytest.MonkeyPatch) -> None:
    class NoProc(type(Path())):  # type: ignore[misc]
        """A Path for which /proc/self/stat does not exist, as on macOS."""

        def exists(self, *args: object, **kwargs: object) -> bool:
            return str(self) != "/proc/self/stat" and super().exists()

    proc = _group("sleep 30 & sleep 30; wait")
    groups.append(proc)
    monkeypatch.setattr(processes, "Path", NoProc)
    assert process_alive(proc.pid) and group_alive(proc.pid)  # signal 0 reaches them
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _wait_for(lambda: not process_alive(proc.pid) and not group_alive(proc.pid), "signal 0 to find nothing")


def _cancel_once_started(q: JobQueue, job: int) -> Callable[[str], None]:
    """A worker's echo that cancels ``job`` once it has started its children (this process is the worker: the
    cancel is a request to it)."""

    def echo(line: str) -> None:
        if "started" in line:
            _wait_for(lambda: _members(q.get(job).pid or -1) >= 2, "the job's children")
            q.cancel(job)

    return echo


def test_cancel_escalates_to_sigkill_after_the_grace(tmp_path: Path) -> None:
    with JobQueue(tmp_path / "q.db") as q:
        job = q.add(["sh", "-c", _records_term(tmp_path / "term")])
        Worker(q, slots=1, gpus=[], poll=0.02, kill_grace=0.4, echo=_cancel_once_started(q, job)).run()
        final = q.get(job)
        assert (final.state, final.exit_status) == ("cancelled", -signal.SIGKILL)
        assert (tmp_path / "term").read_text() == "TERM\n"  # one SIGTERM first; it ran on, so SIGKILL ended it
        assert _members(final.pid) == 0  # the whole group, not only its leader


def test_cancel_lets_a_job_end_itself_within_the_grace(tmp_path: Path) -> None:
    """SIGKILL waits for the grace: a job that cleans up and leaves on SIGTERM ends with its own exit status."""
    with JobQueue(tmp_path / "q.db") as q:
        script = f"trap 'sleep 0.2; echo cleaned > {tmp_path / 'done'}; exit 3' TERM; sleep 30 & wait"
        job = q.add(["sh", "-c", script])
        Worker(q, slots=1, gpus=[], poll=0.02, kill_grace=600, echo=_cancel_once_started(q, job)).run()
        final = q.get(job)
        assert (final.state, final.exit_status) == ("cancelled", 3)
        assert (tmp_path / "done").read_text() == "cleaned\n"
        assert _members(final.pid) == 0


def test_stopping_a_worker_kills_jobs_that_ignore_sigterm(tmp_path: Path) -> None:
    with JobQueue(tmp_path / "q.db") as q:
        job = q.add(["sh", "-c", IGNORES_TERM])

        def echo(line: str) -> None:
            if "started" in line:
                _wait_for(lambda: _members(q.get(job).pid or -1) >= 2, "the job's children")
                raise KeyboardInterrupt  # as Ctrl-C would, while the job runs

        with pytest.raises(KeyboardInterrupt):
            Worker(q, slots=1, gpus=[], poll=0.02, kill_grace=0.4, echo=echo).run()
        pid = q.attempts(job)[0].pid
        assert pid is not None and _members(pid) == 0
        assert (q.get(job).state, q.attempts(job)[0].outcome) == ("queued", "interrupted")
