"""The warm queue worker (``Worker(warm=True)``, what ``pickaxe sweep`` runs): pickaxe jobs forked from a process
that has imported pickaxe give the numbers of a fresh ``python -m pickaxe.cli`` process, and stay crash-safe (a
SIGKILLed worker takes its forked job with it, and the next worker resumes the run exactly)."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pickaxe.exp import worker as worker_module
from pickaxe.exp.processes import fork_module, process_alive
from pickaxe.exp.queue_store import JobQueue
from pickaxe.exp.worker import Worker
from pickaxe.runs.run import read_metrics

TRAIN = ["train", "cartpole-ppo", "--trainer.total-steps", "2048", "--save-every", "512",
         "--trainer.eval-every", "1024", "--no-progress"]  # fmt: skip


def _wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _worker_cmd(db: Path) -> list[str]:
    code = (
        "from pickaxe.exp.queue_store import JobQueue\nfrom pickaxe.exp.worker import Worker\n"
        f"Worker(JobQueue({str(db)!r}), slots=1, gpus=(), poll=0.05, warm=True).run(until_empty=True)"
    )
    return [sys.executable, "-c", code]


@pytest.mark.slow  # three short training runs (~15 s on a quiet 2-core machine)
def test_forked_job_is_killed_with_its_worker_and_resumes_to_the_uninterrupted_numbers(tmp_path: Path) -> None:
    fresh, run_dir = tmp_path / "fresh", tmp_path / "run"
    subprocess.run([sys.executable, "-m", "pickaxe.cli", *TRAIN, "--run-dir", str(fresh)], check=True)
    q = JobQueue(tmp_path / "q.db")
    job = q.add([sys.executable, "-m", "pickaxe.cli", *TRAIN, "--run-dir", str(run_dir)], name="train")
    first = subprocess.Popen(_worker_cmd(q.path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: (run_dir / "checkpoints" / "latest").exists(), 120, "a first checkpoint")
        pid = q.get(job).pid
        os.kill(pid, signal.SIGSTOP)  # hold training mid-run so the kill lands before its end
        assert pid != first.pid and os.getpgid(pid) == pid  # a child of the worker in its own session
    finally:
        first.kill()  # SIGKILL: the forked job gets its parent-death signal
        first.wait()
    _wait_for(lambda: not process_alive(pid), 120, "the forked job to die with its worker")
    second = subprocess.run(_worker_cmd(q.path), capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stderr
    assert [a.outcome for a in q.attempts(job)] == ["lost", "succeeded"]
    assert q.attempts(job)[1].argv[-5:] == ["pickaxe.cli", "resume", str(run_dir), "--restart", "--no-progress"]
    log = (run_dir / "job.log").read_text()
    assert log.count("### pickaxe job") == 2 and "resumed from" in log  # the child wrote to the job's log
    assert read_metrics(run_dir, deterministic=True) == read_metrics(fresh, deterministic=True)
    q.close()


def _no_fork_spy(forked: list[list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Record what the worker would fork and run it as ``python -m`` instead: a test process may hold other threads
    (Ray's, a server's), and forking it then is what the worker refuses; the decision is what is under test."""

    def spy(module: str, args: list[str], cwd: str | None, env: dict[str, str], log_fd: int, *rest: object):
        forked.append(args)
        return subprocess.Popen(
            [sys.executable, "-m", module, *args], cwd=cwd, env=env, stdout=log_fd, stderr=subprocess.STDOUT
        )

    monkeypatch.setattr(worker_module, "fork_module", spy)
    monkeypatch.setattr(worker_module, "preload_pickaxe", lambda: None)  # a speed-up only; the child imports
    monkeypatch.setattr(worker_module.threading, "active_count", lambda: 1)


def test_warm_worker_forks_only_pickaxe_commands_on_one_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    forked: list[list[str]] = []
    _no_fork_spy(forked, monkeypatch)
    q = JobQueue(tmp_path / "q.db")
    out = tmp_path / "out"
    version = q.add([sys.executable, "-m", "pickaxe.cli", "--version"], name="fork")
    bad = q.add([sys.executable, "-m", "pickaxe.cli", "no-such-command"], name="fork-fails")
    shell = q.add(["sh", "-c", f"echo shell > {out}"], name="subprocess")
    two = q.add([sys.executable, "-m", "pickaxe.cli", "--version"], name="two-cpus", cpus=2)
    Worker(q, slots=2, gpus=(), poll=0.02, warm=True).run(until_empty=True)
    assert forked == [["--version"], ["no-such-command"]]
    assert q.get(version).state == "succeeded" and "pickaxe " in Path(q.get(version).log_path).read_text()
    assert q.get(bad).exit_status == 2 and "unknown command" in Path(q.get(bad).log_path).read_text()
    assert q.get(shell).state == "succeeded" and out.read_text() == "shell\n"
    assert q.get(two).state == "succeeded"  # two cpus: a fresh interpreter (torch threads across a fork hang)
    q.close()


def test_a_job_needing_a_new_pythonpath_folder_gets_a_fresh_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PYTHONPATH is read at interpreter start: a fork would not see a folder the worker's environment gained later
    forked: list[list[str]] = []
    _no_fork_spy(forked, monkeypatch)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "envs"))
    q = JobQueue(tmp_path / "q.db")
    job = q.add([sys.executable, "-m", "pickaxe.cli", "--version"], name="fresh")
    Worker(q, slots=1, gpus=(), poll=0.02, warm=True).run(until_empty=True)
    assert forked == [] and q.get(job).state == "succeeded"
    q.close()


def test_forked_child_logs_to_its_file_and_skips_the_callers_exit_handlers(tmp_path: Path) -> None:
    marker, log = tmp_path / "marker", tmp_path / "job.log"

    def handler() -> None:  # the caller's: must not run when the child exits
        marker.write_text(str(os.getpid()))

    atexit.register(handler)
    try:
        with open(log, "ab") as f:
            proc = fork_module("pickaxe.cli", ["--version"], str(tmp_path), dict(os.environ), f.fileno(), 1, None)
        assert proc.wait(timeout=60) == 0
    finally:
        atexit.unregister(handler)
    assert not marker.exists()
    assert log.read_text().startswith("pickaxe ")
    failing = fork_module(
        "pickaxe.cli", ["no-such-command"], None, dict(os.environ), os.open(os.devnull, os.O_WRONLY), 1, None
    )
    assert failing.wait(timeout=60) == 2 and failing.poll() == 2
