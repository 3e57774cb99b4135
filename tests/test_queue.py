"""The SQLite job queue and its worker: order, dependencies, resources, cancel/retry, logs, crash recovery.

Most jobs are tiny ``sh -c`` scripts. Worker and writer subprocesses import the queue modules without the
package ``__init__`` (which loads torch and takes seconds on a busy machine): ``_py`` pre-registers
``pickaxe`` and ``pickaxe.exp`` as bare namespace modules. One test runs a real ``pickaxe train`` job.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pickaxe.errors import PickaxeError
from pickaxe.exp.processes import process_alive
from pickaxe.exp.queue_cli import main_queue, main_worker
from pickaxe.exp.queue_store import JobQueue, default_db_path
from pickaxe.exp.worker import Worker, run_jobs


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", "import sys\n" + code]


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def wait_for(cond: Callable[[], object], timeout: float = 120.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def q(tmp_path: Path) -> Iterator[JobQueue]:
    queue = JobQueue(tmp_path / "q.db")
    yield queue
    queue.close()


def test_db_location_and_pragmas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PICKAXE_QUEUE", str(tmp_path / "env.db"))
    assert default_db_path() == tmp_path / "env.db"
    with JobQueue() as queue:
        assert queue.path == tmp_path / "env.db"
    monkeypatch.delenv("PICKAXE_QUEUE")
    assert default_db_path() == Path.home() / ".pickaxe" / "queue.db"
    conn = sqlite3.connect(tmp_path / "env.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(PickaxeError, match="newer"):
        JobQueue(tmp_path / "env.db")
    (tmp_path / "junk.db").write_bytes(b"not a database" * 100)
    with pytest.raises(PickaxeError, match=r"junk\.db"):
        JobQueue(tmp_path / "junk.db")


def test_priority_then_fifo(q: JobQueue, tmp_path: Path) -> None:
    out = tmp_path / "order"
    for name, prio in [("a", 0), ("b", 0), ("c", 5), ("d", -1), ("e", 5), ("f", 0)]:
        q.add(sh(f"echo {name} >> {out}"), name=name, priority=prio)
    results = Worker(q, slots=1, gpus=[], poll=0.01).run()
    assert out.read_text().split() == ["c", "e", "a", "b", "f", "d"]
    assert set(results.values()) == {0} and len(results) == 6
    assert all(j.state == "succeeded" and j.attempts == 1 for j in q.list())


def test_claim_is_atomic_strict_and_assigns_gpus(q: JobQueue) -> None:
    big = q.add(["x"], cpus=2, priority=1)
    small = q.add(["y"])
    gpu = q.add(["z"], gpus=1, priority=-1)
    # the big job's turn: a worker with 2 slots but 1 free waits for it rather than starving it
    assert q.claim("w", free_cpus=1, max_cpus=2) is None
    # without a capacity, the first job that fits is taken (backfill)
    assert q.claim("w", free_cpus=1).id == small
    # a job too big for this worker is left for others
    assert q.claim("w", free_cpus=1, max_cpus=1) is None
    job = q.claim("w2", free_cpus=2, max_cpus=2)
    assert (job.id, job.state, job.attempts, job.worker_id) == (big, "running", 1, "w2")
    job = q.claim("w2", free_cpus=4, free_gpu_ids=["3", "5"])
    assert (job.id, job.gpu_ids) == (gpu, ("3",))
    assert q.claim("w", free_cpus=8, free_gpu_ids=["0"]) is None


def test_dependencies_block_and_retry_unblocks(q: JobQueue, tmp_path: Path) -> None:
    out, flag = tmp_path / "order", tmp_path / "flag"
    a = q.add(sh(f"echo a >> {out}; test -f {flag}"), name="a")
    b = q.add(sh(f"echo b >> {out}"), name="b", depends_on=[a])
    c = q.add(sh(f"echo c >> {out}"), name="c", depends_on=[b], priority=9)
    d = q.add(sh(f"echo d >> {out}"), name="d")
    with pytest.raises(PickaxeError, match="no job 99"):
        q.add(["x"], depends_on=[99])
    Worker(q, slots=2, gpus=[], poll=0.01).run()
    assert sorted(out.read_text().split()) == ["a", "d"]
    states = {j.id: (j.state, j.reason) for j in q.list()}
    assert states[a] == ("failed", "exit status 1")
    assert states[b] == ("blocked", f"job {a} failed")
    assert states[c] == ("blocked", f"job {b} blocked")
    assert states[d][0] == "succeeded"
    e = q.add(["true"], depends_on=[a])
    assert q.get(e).state == "blocked"  # a dependency that already failed blocks at once
    with pytest.raises(PickaxeError, match=f"retry job {a} first"):
        q.retry(b)
    with pytest.raises(PickaxeError, match="only failed, cancelled or blocked"):
        q.retry(d)
    flag.touch()
    assert q.retry(a).state == "queued"
    assert {q.get(i).state for i in (b, c, e)} == {"queued"}
    Worker(q, slots=2, gpus=[], poll=0.01).run()
    assert out.read_text().split()[2:] == ["a", "b", "c"]  # b waited for a, c for b despite its priority
    assert all(j.state == "succeeded" for j in q.list())
    assert q.get(a).attempts == 2


def test_slots_and_gpus_respected(q: JobQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a cluster-wide OMP_NUM_THREADS (here 4) must not leak into jobs: each gets its own cpus' worth
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    trace = tmp_path / "trace"
    for i, cpus in enumerate([1, 2, 1, 1, 2, 1]):
        q.add(sh(f'echo "$(date +%s.%N) {cpus} $OMP_NUM_THREADS [$CUDA_VISIBLE_DEVICES]" >> {trace}; sleep 0.15; '
                 f'echo "$(date +%s.%N) -{cpus}" >> {trace}'), name=f"j{i}", cpus=cpus)  # fmt: skip
    Worker(q, slots=2, gpus=[], poll=0.01).run()
    events = sorted((float(t), int(n)) for t, n, *_ in (ln.split() for ln in trace.read_text().splitlines()))
    level, peak = 0, 0
    for _, n in events:
        level += n
        peak = max(peak, level)
    assert peak == 2  # never more cpus than slots, and the slots are used
    starts = [ln.split()[1:] for ln in trace.read_text().splitlines() if not ln.split()[1].startswith("-")]
    assert all(threads == cpus and gpus == "[]" for cpus, threads, gpus in starts)  # OMP threads = cpus, no GPU

    gtrace = tmp_path / "gpus"
    for _ in range(3):
        q.add(sh(f'echo "+ $CUDA_VISIBLE_DEVICES" >> {gtrace}; sleep 0.2; echo "- $CUDA_VISIBLE_DEVICES" >> {gtrace}'),
              gpus=1)  # fmt: skip
    Worker(q, slots=4, gpus=["0", "1"], poll=0.01).run()
    held: set[str] = set()
    for sign, gpu in (ln.split() for ln in gtrace.read_text().splitlines()):
        if sign == "+":
            assert gpu in ("0", "1") and gpu not in held  # one GPU per job, never shared
            held.add(gpu)
        else:
            held.remove(gpu)


def test_cancel_queued_and_running(q: JobQueue, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    running = q.add(sh(f"sleep 30 & echo $! > {pidfile}; wait"), name="long")
    queued = q.add(["true"], name="queued")
    after = q.add(["true"], depends_on=[running])
    assert q.cancel(queued).state == "cancelled"
    worker_q = JobQueue(q.path)
    results: dict = {}
    thread = threading.Thread(target=lambda: results.update(Worker(worker_q, slots=1, gpus=[], poll=0.02).run()))
    thread.start()
    try:
        wait_for(lambda: q.get(running).pid and pidfile.exists() and pidfile.read_text().strip(), what="job start")
        grandchild = int(pidfile.read_text())
        job = q.cancel(running)
        assert job.state == "running" and job.cancel_requested
        wait_for(lambda: q.get(running).state == "cancelled", what="cancel")
    finally:
        thread.join(timeout=120)
        worker_q.close()
    assert not thread.is_alive()
    assert not process_alive(grandchild)  # the whole process group was killed
    assert q.get(running).exit_status == -signal.SIGTERM
    assert q.get(after).state == "blocked" and q.get(after).reason == f"job {running} cancelled"
    assert q.get(queued).attempts == 0
    with pytest.raises(PickaxeError, match="already cancelled"):
        q.cancel(queued)


def test_retry_keeps_logs_of_failed_attempts(q: JobQueue, tmp_path: Path) -> None:
    ok = tmp_path / "ok"
    job = q.add(sh(f'echo "output of attempt $PICKAXE_JOB_ATTEMPT"; test -f {ok}'))
    run_dir = tmp_path / "run"
    in_run = q.add(sh(f'echo "run attempt $PICKAXE_JOB_ATTEMPT"; test -f {ok}'), run_dir=run_dir)
    Worker(q, slots=2, gpus=[], poll=0.01).run()
    assert q.get(job).state == q.get(in_run).state == "failed"
    ok.touch()
    q.retry(job)
    q.retry(in_run)
    Worker(q, slots=2, gpus=[], poll=0.01).run()
    attempts = q.attempts(job)
    assert [(a.attempt, a.outcome, a.exit_status) for a in attempts] == [(1, "failed", 1), (2, "succeeded", 0)]
    first, second = (Path(a.log_path) for a in attempts)
    assert first.name == f"{job}-1.log" and first.parent == q.path.parent / "q-logs"
    assert "output of attempt 1" in first.read_text() and "output of attempt 2" in second.read_text()
    log = (run_dir / "job.log").read_text()  # with a run_dir, attempts append to one log, each with a header
    assert log.count("### pickaxe job") == 2 and "run attempt 1" in log and "run attempt 2" in log
    assert all(a.wall_s is not None and a.wall_s >= 0 for a in attempts)


def test_recover_requeues_only_dead_workers_jobs(q: JobQueue) -> None:
    def running_job(worker: str) -> tuple[int, int]:
        job_id = q.add(["true"])
        job = q.claim(worker, free_cpus=1, only=[job_id])
        return job_id, job.attempts

    def set_worker(worker: str, **fields: object) -> None:
        conn = sqlite3.connect(q.path)
        for key, value in fields.items():
            conn.execute(f"UPDATE workers SET {key} = ? WHERE id = ?", (value, worker))
        conn.commit()
        conn.close()

    live, _ = running_job("live")  # registered with this (live) process's pid
    set_worker("live", heartbeat=0.0)  # a stale heartbeat never condemns a worker whose process is alive
    assert q.recover("me") == [] and q.get(live).state == "running"

    dead, attempt = running_job("dead")
    gone = subprocess.Popen(["true"])
    gone.wait()
    set_worker("dead", pid=gone.pid, pid_start=None)
    assert q.recover("me") == [dead]
    assert q.get(dead).state == "queued" and q.attempts(dead)[-1].outcome == "lost"
    assert not q.finish(dead, 0, attempt=attempt, worker_id="dead")  # fenced: the old attempt cannot finish it
    assert q.get(dead).state == "queued"

    rebooted, _ = running_job("rebooted")
    set_worker("rebooted", boot_id="another-boot")
    assert q.recover("me") == [rebooted]

    remote, _ = running_job("remote")
    set_worker("remote", host="elsewhere", pid=1, heartbeat=time.time())
    assert q.recover("me") == []  # another host: judged by its heartbeat, which is fresh
    set_worker("remote", heartbeat=time.time() - 600)
    assert q.recover("me") == [remote]

    cancelled, _ = running_job("dead2")
    set_worker("dead2", pid=gone.pid, pid_start=None)
    assert q.cancel(cancelled).state == "cancelled"  # its worker is dead: nobody else would act on the cancel
    assert q.get(live).state == "running"


def test_worker_sigkill_loses_nothing_and_resumes_training(q: JobQueue, tmp_path: Path) -> None:
    done, pids, run_dir = tmp_path / "done", tmp_path / "pids", tmp_path / "run"
    train = q.add(
        [sys.executable, "-m", "pickaxe.cli", "train", "cartpole-ppo", "--trainer.total-steps", "3072",
         "--save-every", "512", "--no-progress", "--run-dir", str(run_dir)],
        name="train", priority=1,
    )  # fmt: skip
    assert q.get(train).run_dir == str(run_dir)  # taken from the train command's --run-dir
    # under the first worker (HANG set) jobs hang in a background sleep in their process group; later they finish
    fake = sh(f'if [ -n "$HANG" ]; then sleep 60 & echo $! >> {pids}; wait; fi; echo "$PICKAXE_JOB_ID" >> {done}')
    fakes = [q.add(fake, name=f"fake{i}") for i in range(3)]  # with 3 slots, the third waits in the queue
    worker = _py(
        "from pickaxe.exp.queue_cli import main_worker\n"
        f"sys.exit(main_worker(['--db', {str(q.path)!r}, '--slots', '3', '--gpus', 'none', '--poll', '0.05']"
        " + sys.argv[1:]))"
    )
    hang = {**os.environ, "HANG": "1"}
    first = subprocess.Popen(worker, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=hang)
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "latest").exists(), timeout=90, what="a first checkpoint")
        train_pid = q.get(train).pid
        os.kill(train_pid, signal.SIGSTOP)  # hold training mid-run, so the kill surely lands before its end
        wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2, what="fake jobs running")
    finally:
        first.kill()  # SIGKILL: no cleanup of any kind
        first.wait()
    assert q.integrity_check() == "ok"
    wait_for(lambda: not process_alive(train_pid), what="the job to die with its worker")
    orphans = [int(p) for p in pids.read_text().split()]
    assert all(process_alive(p) for p in orphans)  # outlived the worker, in the jobs' process groups
    assert [q.get(j).state for j in (train, *fakes)] == ["running", "running", "running", "queued"]

    second = subprocess.run([*worker, "--until-empty"], capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stderr
    assert not any(process_alive(p) for p in orphans)  # recovery killed what was left of the old attempts
    assert q.integrity_check() == "ok"
    assert all(j.state == "succeeded" for j in q.list()), [(j.id, j.state, j.reason) for j in q.list()]
    assert sorted(int(x) for x in done.read_text().split()) == fakes  # every job's work done exactly once
    outcomes = [a.outcome for a in q.attempts(train)]
    assert outcomes == ["lost", "succeeded"]
    assert [a.outcome for a in q.attempts(fakes[0])] == ["lost", "succeeded"]
    assert [a.outcome for a in q.attempts(fakes[2])] == ["succeeded"]
    resumed = q.attempts(train)[1].argv
    assert resumed[-5:] == ["pickaxe.cli", "resume", str(run_dir), "--restart", "--no-progress"]
    assert "resumed from" in (run_dir / "events.jsonl").read_text()
    steps = [json.loads(ln)["step"] for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 3072
    assert (run_dir / "job.log").read_text().count("### pickaxe job") == 2


def test_a_job_killed_before_its_first_checkpoint_starts_its_run_again_on_retry(
    q: JobQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    job = q.add(
        [sys.executable, "-m", "pickaxe.cli", "train", "cartpole-ppo", "--trainer.total-steps", "4096",
         "--trainer.eval-every", "0", "--no-progress", "--run-dir", str(run_dir)],
        name="train",
    )  # fmt: skip
    monkeypatch.setenv("PICKAXE_FAULT", "iteration:1")  # SIGKILL after the first iteration: no checkpoint yet
    monkeypatch.setenv("PICKAXE_FAULT_ONCE", str(tmp_path / "fired"))
    assert run_jobs(q, [job], slots=1) == {job: -signal.SIGKILL}
    assert (run_dir / "metrics.jsonl").read_text() and not (run_dir / "checkpoints").exists()

    q.retry(job)  # every later attempt resumes its run, and this run has nothing to resume from
    assert run_jobs(q, [job], slots=1) == {job: 0}
    assert q.get(job).state == "succeeded"
    line = f"{run_dir} has no checkpoint to resume from: starting the run again from step 0"
    assert line in (run_dir / "job.log").read_text()  # one line in the job's log ...
    events = [json.loads(e) for e in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["message"] for e in events if e.get("restart")] == [line]  # ... and in the run's events
    steps = [json.loads(ln)["step"] for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 4096  # the killed attempt's records are not repeated


def test_sigterm_stops_worker_and_requeues_its_job(q: JobQueue, tmp_path: Path) -> None:
    job = q.add(sh("sleep 30"))
    worker = subprocess.Popen(
        _py(f"from pickaxe.cli import main\nsys.exit(main(['worker', '--db', {str(q.path)!r}, '--slots', '1']))"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for(lambda: q.get(job).pid, what="job start")
    pid = q.get(job).pid
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=120)
    assert worker.returncode == 130, err
    assert not process_alive(pid)
    assert q.get(job).state == "queued" and q.attempts(job)[0].outcome == "interrupted"


def test_concurrent_adds_lose_nothing(q: JobQueue) -> None:
    code = (
        "from pickaxe.exp.queue_store import JobQueue\n"
        f"q = JobQueue({str(q.path)!r})\n"
        "for i in range(25):\n"
        "    q.add(['echo', sys.argv[1], str(i)], name=f'{sys.argv[1]}-{i}')\n"
    )
    procs = [subprocess.Popen([*_py(code), f"p{k}"]) for k in range(4)]
    for p in procs:
        assert p.wait(timeout=60) == 0
    jobs = q.list()
    assert len(jobs) == 100 and len({j.id for j in jobs}) == 100
    assert {j.name for j in jobs} == {f"p{k}-{i}" for k in range(4) for i in range(25)}
    assert q.integrity_check() == "ok"


def test_run_jobs_runs_targets_and_their_dependencies(q: JobQueue, tmp_path: Path) -> None:
    a = q.add(sh("sleep 0.1"))
    b = q.add(sh("exit 4"), depends_on=[a])
    c = q.add(["true"], depends_on=[b])
    other = q.add(["true"])
    assert run_jobs(q, [b, c], slots=2) == {b: 4, c: None}
    assert q.get(a).state == "succeeded" and q.get(c).state == "blocked" and q.get(other).state == "queued"
    timing = q.timing([a, b])
    assert timing.attempts == 2 and 0.1 <= timing.job_s <= timing.span_s
    big = q.add(["true"], cpus=3)
    with pytest.raises(PickaxeError, match="needs 3 cpus"):
        run_jobs(q, [big], slots=2)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "cli.db")
    assert main_queue(["add", "--db", db, "--priority", "2", "--name", "first", "--", "sh", "-c", "exit 3"]) == 0
    first = int(capsys.readouterr().out)
    run_dir = str(tmp_path / "r")
    main_queue(["add", "--db", db, "--after", str(first), "--cpus", "1", "--run-dir", run_dir, "--", "true"])
    second = int(capsys.readouterr().out)
    assert main_worker(["--db", db, "--slots", "1", "--gpus", "none", "--until-empty", "--poll", "0.01"]) == 0
    capsys.readouterr()
    main_queue(["list", "--db", db])
    table = capsys.readouterr().out
    assert "first" in table and "failed" in table and "blocked" in table
    main_queue(["list", "--db", db, "--json", "--state", "blocked"])
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [(r["id"], r["reason"], r["run_dir"]) for r in rows] == [(second, f"job {first} failed", run_dir)]
    main_queue(["retry", str(first), "--db", db])
    assert "queued" in capsys.readouterr().out
    main_queue(["cancel", str(first), "--db", db])
    assert "cancelled" in capsys.readouterr().out
    for bad, message in [
        (["add", "--db", db, "sh"], "needs the command after --"),
        (["add", "--db", db, "--cpus", "0", "--", "true"], "--cpus must be >= 1, got 0"),
        (["add", "--db", db, "--after", "77", "--", "true"], "no job 77"),
        (["cancel", "77", "--db", db], "no job 77"),
        (["retry", str(second), "--db", db], f"retry job {first} first"),
        (["retry", "x", "--db", db], "job ids are integers"),
        (["list", "--state", "runing", "--db", db], "did you mean 'running'"),
        (["lst", "--db", db], "did you mean 'list'"),
    ]:
        with pytest.raises(PickaxeError, match=message):
            main_queue(bad)


def test_stale_finish_cannot_overwrite_the_new_owner(q: JobQueue) -> None:
    job = q.add(["true"])
    first = q.claim("w1", free_cpus=1)
    assert first is not None and first.attempts == 1
    assert q.release(job, 1, "w1", outcome="lost")  # w1 judged dead: its job is requeued
    second = q.claim("w2", free_cpus=1)
    assert second is not None and (second.worker_id, second.attempts) == ("w2", 2)
    # the stale worker wakes up and reports its attempt: with its token it must not touch w2's attempt
    assert not q.finish(job, 1, attempt=1, worker_id="w1")
    now = q.get(job)
    assert (now.state, now.worker_id, now.attempts, now.exit_status) == ("running", "w2", 2, None)
    assert [a.outcome for a in q.attempts(job)] == ["lost", "running"]
    assert q.finish(job, 0, attempt=2, worker_id="w2") and q.get(job).state == "succeeded"


def test_reading_commands_never_create_the_queue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "sub" / "none.db"
    assert main_queue(["list", "--db", str(db)]) == 0
    assert "no job queue at" in capsys.readouterr().err
    for command in (["cancel", "1"], ["retry", "1"]):
        with pytest.raises(PickaxeError, match="no job queue at"):
            main_queue([*command, "--db", str(db)])
    assert not db.exists() and not db.parent.exists()


def test_list_shows_whole_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "q.db")
    names = [f"lr=0.001_clip=0.2_ent-coef=0.01_vf-coef=0.5_gae-lambda=0.95/seed-{s}" for s in (7, 8)]
    for name in names:
        assert main_queue(["add", "--db", db, "--name", name, "--", "true"]) == 0
    capsys.readouterr()
    main_queue(["list", "--db", db])
    table = capsys.readouterr().out
    assert all(name in table for name in names)  # the seed, at the end, tells the runs apart


def test_add_checks_train_commands_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pickaxe.cli import main

    db = tmp_path / "q.db"
    for bad, message in [
        (["pickaxe", "train", "cartpole-ppo", "--algo.lrr", "1"], "did you mean --algo.lr?"),
        ([sys.executable, "-m", "pickaxe.cli", "train", "cartpole-ppo", "--algo.lr", "-1"], "--algo.lr must be > 0"),
        (["pickaxe", "train", "cartpole-pp"], "did you mean 'cartpole-ppo'"),
    ]:
        assert main(["queue", "add", "--db", str(db), "--", *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err and "Traceback" not in err
    assert not db.exists()  # nothing queued
    good = ["pickaxe", "train", "cartpole-ppo", "--algo.lr", "1e-3", "--run-dir", str(tmp_path / "r")]
    assert main(["queue", "add", "--db", str(db), "--", *good]) == 0
    assert JobQueue(db).get(int(capsys.readouterr().out)).argv == good


def test_counts_are_queued_jobs_that_fit_and_running_jobs(q: JobQueue) -> None:
    small, big, gpu = q.add(["true"], cpus=1), q.add(["true"], cpus=4), q.add(["true"], cpus=1, gpus=1)
    assert q.counts() == (3, 0)
    assert q.counts(max_cpus=2) == (2, 0)  # the 4-cpu job does not fit a 2-cpu worker
    assert q.counts(max_cpus=2, max_gpus=0) == (1, 0)
    assert q.claim("w", free_cpus=1, only=[small]) is not None
    assert q.counts() == (2, 1) and {big, gpu} == {j.id for j in q.list("queued")}


def test_release_is_fenced_and_honours_a_cancel_requested_while_running(q: JobQueue) -> None:
    job = q.add(["true"])
    after = q.add(["true"], depends_on=[job])
    assert q.claim("w1", free_cpus=1) is not None
    assert not q.release(job, 2, "w1") and not q.release(job, 1, "w2")  # wrong attempt, wrong worker
    assert q.get(job).state == "running"
    assert q.release(job, 1, "w1", outcome="interrupted")
    requeued = q.get(job)
    assert (requeued.state, requeued.worker_id, requeued.reason) == ("queued", None, "attempt 1 interrupted; requeued")
    assert [a.outcome for a in q.attempts(job)] == ["interrupted"]
    assert not q.release(job, 1, "w1")  # not running any more
    q.register_worker("w2")  # alive: the cancel is a request its worker acts on
    assert q.claim("w2", free_cpus=1) is not None
    assert q.cancel(job).cancel_requested and q.get(job).state == "running"
    assert q.release(job, 2, "w2")
    cancelled = q.get(job)
    assert (cancelled.state, cancelled.reason) == ("cancelled", "cancelled by user while running")
    assert q.get(after).state == "blocked"  # what depended on it can never run
