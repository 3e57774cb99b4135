"""``pickaxe sweep --backend ray``: the same run folders and numbers as the queue backend, a crashed run restarted
from its checkpoint, a run whose Ray worker dies requeued and resumed, and the flags' errors and help."""

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pickaxe.cli import main

TINY = ["--trainer.total-steps", "4096", "--trainer.eval-every", "1024"]
"""16 iterations of 256 steps, an evaluation (and checkpoint) every 4 iterations: ~1.5 s of training."""


def _numbers(run_dir: Path) -> list[dict[str, Any]]:
    """Every log record of a run without its wall-clock and machine fields (those differ between two runs)."""
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        out.append({k: v for k, v in record.items() if not k.startswith(("time/", "sys/"))})
    return out


def _last(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: v for r in records for k, v in r.items()}  # the last value of every key, as a resumed run ends


@pytest.fixture(scope="module")
def queue_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: a 2-point x 1-seed sweep on the queue backend."""
    folder = tmp_path_factory.mktemp("queue") / "sweep"
    command = ["sweep", "cartpole-ppo", "--algo.lr", "3e-3,1e-3", "--seeds", "1", "--workers", "2", *TINY]
    assert main([*command, "--sweep-dir", str(folder)]) == 0
    return folder


def test_ray_backend_gives_the_queue_backends_folders_and_numbers(
    ray_local: Any, queue_sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    folder = tmp_path / "sweep"
    command = ["sweep", "cartpole-ppo", "--algo.lr", "3e-3,1e-3", "--seeds", "1", *TINY, "--backend", "ray"]
    assert main([*command, "--sweep-dir", str(folder)]) == 0
    err = capsys.readouterr().err
    cpus = ray_local.cluster_resources()["CPU"]  # 4 from the fixture, unless an earlier test of this process began Ray
    assert f"on Ray (1 node, {cpus:g} cpus, 0 GPUs)" in err
    progress = [ln for ln in err.splitlines() if ln.startswith("pickaxe: [")]
    assert len(progress) == 2 and all("succeeded" in ln and "eval/return_mean" in ln for ln in progress)
    runs = sorted(p.relative_to(folder) for p in folder.glob("*/seed-*"))
    assert runs == sorted(p.relative_to(queue_sweep) for p in queue_sweep.glob("*/seed-*"))
    assert runs == [Path("lr=1e-3/seed-0"), Path("lr=3e-3/seed-0")]
    for run in runs:
        assert _numbers(folder / run) == _numbers(queue_sweep / run)
    ours = json.loads((folder / "compare" / "summary.json").read_text())
    theirs = json.loads((queue_sweep / "compare" / "summary.json").read_text())
    assert ours["winner"] == theirs["winner"]
    for group in (*ours["groups"], *theirs["groups"]):
        group.pop("run_dirs")  # the only difference: the folder each sweep ran in
    assert ours["groups"] == theirs["groups"]
    timing = json.loads((folder / "sweep_timing.json").read_text())
    assert timing["backend"] == "ray" and timing["runs"] == 2 and timing["failed"] == 0
    assert json.loads((queue_sweep / "sweep_timing.json").read_text())["backend"] == "queue"
    assert "on ray:" in (folder / runs[0] / "job.log").read_text()  # the attempt's header names the Ray worker


def test_a_crashed_run_restarts_from_its_checkpoint_and_ends_like_an_undisturbed_one(
    ray_local: Any, queue_sweep: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # killed (SIGKILL) after iteration 6, past the checkpoint at 1024 steps; --max-restarts 1 resumes it
    monkeypatch.setenv("PICKAXE_FAULT", "iteration:6")
    monkeypatch.setenv("PICKAXE_FAULT_ONCE", str(tmp_path / "fired"))
    folder = tmp_path / "sweep"
    command = ["sweep", "cartpole-ppo", "--algo.lr", "3e-3", "--seeds", "1", *TINY, "--max-restarts", "1"]
    assert main([*command, "--backend", "ray", "--sweep-dir", str(folder)]) == 0
    assert (tmp_path / "fired").exists()  # the fault reached the job through Ray
    run = folder / "default" / "seed-0"
    events = (run / "events.jsonl").read_text()
    assert "restart 1/1 after exit status -9: resuming from the newest checkpoint" in events
    assert "resumed from step-000000001024 at step 1024; resume is exact" in events
    numbers, reference = _numbers(run), _numbers(queue_sweep / "lr=3e-3" / "seed-0")
    assert _last(numbers) == _last(reference)
    assert (run / "model.safetensors").read_bytes() == (queue_sweep / "lr=3e-3/seed-0/model.safetensors").read_bytes()


@pytest.mark.slow  # ~15 s idle (two more training processes); the file stays under a minute without it
def test_a_run_whose_ray_worker_dies_is_requeued_and_resumes(
    ray_local: Any, queue_sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "sweep"
    run = folder / "default" / "seed-0"
    command = ["sweep", "cartpole-ppo", "--algo.lr", "3e-3", "--seeds", "1", *TINY, "--backend", "ray"]
    status: list[int] = []
    sweep = threading.Thread(target=lambda: status.append(main([*command, "--sweep-dir", str(folder)])))
    sweep.start()
    deadline = time.monotonic() + 60
    while not (run / "checkpoints" / "latest").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    header = (run / "job.log").read_text().splitlines()[0]  # "### pickaxe job 1 attempt 1 on ray:HOST:PID at ..."
    os.kill(int(header.split(" on ray:")[1].split()[0].rsplit(":", 1)[1]), signal.SIGKILL)
    sweep.join(timeout=90)
    assert status == [0]
    err = capsys.readouterr().err
    assert "requeued (1/3), it resumes from its checkpoint" in err
    log = (run / "job.log").read_text()
    assert "attempt 2 (resuming its run)" in log and " resume " in log and "resumed from step-" in log
    assert _last(_numbers(run)) == _last(_numbers(queue_sweep / "lr=3e-3" / "seed-0"))


def test_cancelling_a_job_lets_its_command_checkpoint_before_it_returns(ray_local: Any, tmp_path: Path) -> None:
    from pickaxe.dist.jobs import RayJobs

    # what Ctrl-C on a Ray-backed sweep does to each run: SIGTERM to the command, then wait for it to exit
    script = "trap 'sleep 1; echo checkpointed > done; exit 130' TERM; touch up; while true; do sleep 0.1; done"
    jobs = RayJobs(ray_local)
    jobs.submit(7, ["bash", "-c", script], str(tmp_path), str(tmp_path / "job.log"), header="pickaxe job 7")
    deadline = time.monotonic() + 120
    while not (tmp_path / "up").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    outcomes = jobs.cancel(timeout=120)
    assert [(o.key, o.exit_status, o.lost) for o in outcomes] == [(7, None, "cancelled")] and not jobs.running
    assert (tmp_path / "done").read_text() == "checkpointed\n"
    assert (tmp_path / "job.log").read_text().startswith("### pickaxe job 7 on ray:")


def test_a_cancel_reaches_the_command_even_where_sigint_was_ignored(tmp_path: Path) -> None:
    # what ray.cancel does to a running task (interrupt_main, a no-op while SIGINT is ignored), in a process that
    # inherited an ignored SIGINT as Ray workers do from a sweep started in the background
    import subprocess
    import sys

    script = "trap 'sleep 1; echo checkpointed > done; exit 130' TERM; touch up; while true; do sleep 0.1; done"
    code = f"""
import _thread, signal, threading, time
from pathlib import Path
from pickaxe.dist.jobs import run_command
signal.signal(signal.SIGINT, signal.SIG_IGN)
def cancel():
    while not Path("up").exists():
        time.sleep(0.02)
    _thread.interrupt_main()
threading.Thread(target=cancel, daemon=True).start()
try:
    run_command(["bash", "-c", {script!r}], ".", "job.log")
except KeyboardInterrupt:
    print("interrupted")
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "interrupted", proc.stderr
    assert (tmp_path / "done").read_text() == "checkpointed\n"


def test_bad_backend_and_address_without_ray_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "cartpole-ppo", "--algo.lr", "1e-3,3e-4", "--backend", "rayy"]) == 2
    err = capsys.readouterr().err
    assert err == "pickaxe: error: unknown --backend 'rayy'; did you mean 'ray'? (backends: queue, ray)\n"
    assert main(["sweep", "cartpole-ppo", "--address", "auto"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_help_shows_the_backend_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--backend {queue,ray}", "--address", "--job-cpus", "--job-gpus", "--max-restarts"):
        assert flag in out
