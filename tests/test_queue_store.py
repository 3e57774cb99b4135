"""JobQueue in-process, without workers: timing figures, wall times, cancel and retry edge cases, liveness.

Times are written straight into the database so the figures have one known answer; nothing here starts a
job process, so every test is fast and mutmut can trace it.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pickaxe.errors import PickaxeError
from pickaxe.exp.processes import process_start
from pickaxe.exp.queue_store import JobQueue


@pytest.fixture
def q(tmp_path: Path) -> Iterator[JobQueue]:
    queue = JobQueue(tmp_path / "q.db")
    yield queue
    queue.close()


def _sql(q: JobQueue, statement: str, *params: object) -> list[tuple]:
    """Run one statement on the queue file through a second connection (as another process would)."""
    conn = sqlite3.connect(q.path)
    try:
        rows = conn.execute(statement, params).fetchall()
        conn.commit()
    finally:
        conn.close()
    return rows


def _ran(q: JobQueue, job_id: int, status: int, worker: str = "w") -> None:
    """Claim ``job_id`` for ``worker`` and finish it with ``status``."""
    job = q.claim(worker, free_cpus=64, only=[job_id])
    assert job is not None and job.id == job_id
    assert q.finish(job_id, status, attempt=job.attempts, worker_id=worker)


def test_timing_sums_attempts_and_spans_from_creation_to_the_last_end(q: JobQueue) -> None:
    a, b, c, d = (q.add(["true"], name=n) for n in "abcd")
    _ran(q, a, 1)
    q.retry(a)
    _ran(q, a, 0)
    _ran(q, b, 0)
    assert q.claim("w", free_cpus=1, only=[c]) is not None  # c is still running: started, never ended
    for job_id, created in ((a, 100.0), (b, 105.0), (c, 120.0), (d, 90.0)):
        _sql(q, "UPDATE jobs SET created = ? WHERE id = ?", created, job_id)
    for job_id, attempt, started, ended in ((a, 1, 110.0, 130.0), (a, 2, 140.0, 145.0), (b, 1, 112.0, 150.0)):
        _sql(q, "UPDATE attempts SET started = ?, ended = ? WHERE job_id = ? AND attempt = ?", started, ended,
             job_id, attempt)  # fmt: skip
    _sql(q, "UPDATE attempts SET started = 160.0 WHERE job_id = ?", c)

    t = q.timing([a, b, c])
    assert (t.jobs, t.attempts) == (3, 4)
    assert t.per_job == {a: 25.0, b: 38.0}  # a: 20 s + 5 s over two attempts; c has not ended
    assert t.job_s == 63.0
    assert t.span_s == 50.0  # from a's creation (100) to b's end (150)
    assert t.run_span_s == 40.0  # from a's first start (110) to b's end

    everything = q.timing()  # all jobs: d (queued, created at 90) widens the span only
    assert (everything.jobs, everything.attempts, everything.job_s) == (4, 4, 63.0)
    assert (everything.span_s, everything.run_span_s) == (60.0, 40.0)

    running = q.timing([c])  # nothing ended yet: no spans
    assert (running.jobs, running.attempts, running.job_s, running.span_s, running.run_span_s) == (1, 1, 0.0, 0.0, 0.0)
    assert running.per_job == {}
    assert q.timing([d]) == q.timing([]).__class__(jobs=1, attempts=0, job_s=0.0, span_s=0.0, run_span_s=0.0)
    with pytest.raises(PickaxeError, match="no job 99"):
        q.timing([a, 99])


def test_wall_time_of_a_job(q: JobQueue) -> None:
    done, running, queued = q.add(["true"]), q.add(["true"]), q.add(["true"])
    _ran(q, done, 0)
    _sql(q, "UPDATE jobs SET started = 1000.0, finished = 1042.5 WHERE id = ?", done)
    assert q.get(done).wall_s == 42.5
    assert q.claim("w", free_cpus=1, only=[running]) is not None
    started = time.time() - 100.0
    _sql(q, "UPDATE jobs SET started = ? WHERE id = ?", started, running)
    wall_s = q.get(running).wall_s
    assert 100.0 <= wall_s <= time.time() - started  # still running: up to now
    assert q.get(queued).wall_s is None
    first = q.add(["false"])
    blocked = q.add(["true"], depends_on=[first])
    _ran(q, first, 1)
    _sql(q, "UPDATE jobs SET started = 5.0 WHERE id = ?", blocked)  # a retried, now blocked job has no wall time
    assert q.get(blocked).state == "blocked" and q.get(blocked).wall_s is None


def test_release_and_finish_record_when_the_attempt_ended(q: JobQueue) -> None:
    job = q.add(["true"])
    before = time.time()
    assert q.claim("w", free_cpus=1) is not None
    assert q.release(job, 1, "w", outcome="lost")
    (attempt,) = q.attempts(job)
    assert attempt.outcome == "lost" and attempt.ended is not None and 0.0 <= attempt.wall_s <= time.time() - before
    _ran(q, job, -int(signal.SIGKILL))
    last = q.get(job)
    assert (last.state, last.reason, last.exit_status) == ("failed", "killed by SIGKILL", -9)
    assert last.finished is not None and 0.0 <= last.wall_s <= time.time() - before
    stopped = q.add(["true"])
    assert q.claim("w", free_cpus=1, only=[stopped]) is not None
    assert q.release(stopped, 1, "w")  # a worker stopping: the default outcome
    assert (q.attempts(stopped)[0].outcome, q.get(stopped).reason) == ("interrupted", "attempt 1 interrupted; requeued")
    other = q.add(["true"])
    _ran(q, other, -200)  # not a signal this OS names
    assert q.get(other).reason == "killed by signal 200"


def test_cancelling_a_blocked_job_keeps_it_and_its_dependents_from_running(q: JobQueue) -> None:
    a = q.add(["false"])
    b = q.add(["true"], depends_on=[a])
    c = q.add(["true"], depends_on=[b])
    _ran(q, a, 1)
    assert [q.get(j).state for j in (b, c)] == ["blocked", "blocked"]
    cancelled = q.cancel(b)
    assert (cancelled.state, cancelled.reason, cancelled.attempts) == ("cancelled", "cancelled by user", 0)
    assert cancelled.finished is not None
    assert q.retry(a).state == "queued"  # a runs again, but b stays cancelled, so c stays blocked
    assert (q.get(b).state, q.get(c).state) == ("cancelled", "blocked")
    with pytest.raises(PickaxeError, match="already cancelled; only queued, blocked or running"):
        q.cancel(b)


def test_cancel_touches_only_its_job(q: JobQueue) -> None:
    orphan = q.add(["true"])
    assert q.claim("ghost", free_cpus=1) is not None
    _sql(q, "UPDATE workers SET host = 'elsewhere', heartbeat = 0 WHERE id = 'ghost'")  # judged dead
    queued = q.add(["true"])
    assert q.cancel(queued).state == "cancelled"
    assert q.get(orphan).state == "running"  # recovering the dead worker's job is a worker's business


def test_retry_unblocks_only_jobs_whose_every_dependency_is_fine(q: JobQueue) -> None:
    a, b = q.add(["false"]), q.add(["false"])
    both = q.add(["true"], depends_on=[a, b])
    _ran(q, a, 1)
    _ran(q, b, 2)
    assert q.get(both).state == "blocked"
    with pytest.raises(PickaxeError) as err:
        q.retry(both)
    assert str(err.value) == f"job {both} depends on job {a}, which is failed; retry job {a} first"
    q.retry(a)
    assert (q.get(both).state, q.get(both).reason) == ("blocked", f"job {a} failed")  # b still failed
    q.retry(b)
    assert (q.get(both).state, q.get(both).reason) == ("queued", None)


def test_worker_liveness(q: JobQueue) -> None:
    assert not q.worker_alive(None) and not q.worker_alive("never-seen")
    q.register_worker("here", slots=3, gpus=["0"])
    assert q.worker_alive("here")
    assert _sql(q, "SELECT pid, slots, gpus FROM workers WHERE id = 'here'") == [(os.getpid(), 3, '["0"]')]
    _sql(q, "UPDATE workers SET pid_start = ? WHERE id = 'here'", process_start(os.getpid()) + 1)
    assert not q.worker_alive("here")  # same pid, another process (the pid was reused)
    q.register_worker("here")
    assert q.worker_alive("here")
    q.stop_worker("here")
    assert not q.worker_alive("here")
    (stopped,) = _sql(q, "SELECT stopped FROM workers WHERE id = 'here'")[0]
    q.stop_worker("here")
    assert _sql(q, "SELECT stopped FROM workers WHERE id = 'here'")[0][0] == stopped  # the first stop counts

    q.register_worker("remote")
    _sql(q, "UPDATE workers SET host = 'elsewhere', heartbeat = ? WHERE id = 'remote'", time.time() - 30)
    assert q.worker_alive("remote", stale_after=3600) and not q.worker_alive("remote", stale_after=10)
    _sql(q, "UPDATE workers SET heartbeat = 0 WHERE id = 'remote'")
    assert not q.worker_alive("remote")  # its pid is alive here, but on another host only heartbeats count
    q.heartbeat("remote")
    assert q.worker_alive("remote")


def test_job_dict_is_json_ready(q: JobQueue) -> None:
    a = q.add(["true"])
    job = q.get(q.add(["echo", "hi"], depends_on=[a], name="echo"))
    d = job.to_dict()
    assert d == json.loads(json.dumps(d))  # lists, not tuples: what `queue list --json` prints
    assert (d["depends_on"], d["argv"], d["gpu_ids"], d["name"]) == ([a], ["echo", "hi"], [], "echo")
