"""``status.json``: a run's state, with dead "running" processes reported as crashed; torch-free imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from pickaxe.runs.status import STATUS_FILE, is_finished, read_status, run_state, write_status


def test_write_and_read_status(tmp_path: Path) -> None:
    write_status(tmp_path, "running", step=100, total_steps=1000)
    status = read_status(tmp_path)
    assert status is not None
    assert status["state"] == "running" and status["step"] == 100 and status["total_steps"] == 1000
    assert status["pid"] == os.getpid()
    assert status["process_create_time"] == pytest.approx(psutil.Process().create_time())
    assert run_state(tmp_path) == "running"  # this process is alive
    assert not is_finished(tmp_path)
    write_status(tmp_path, "finished", step=1000)
    assert run_state(tmp_path) == "finished" and is_finished(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [STATUS_FILE]  # no temporary file left behind


def test_unknown_state_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown run state"):
        write_status(tmp_path, "paused")
    assert not (tmp_path / STATUS_FILE).exists()


def test_missing_or_garbled_status(tmp_path: Path) -> None:
    assert read_status(tmp_path) is None
    assert run_state(tmp_path) == "crashed"  # no status, no model
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert run_state(tmp_path) == "finished"  # an older run that finished
    for garbage in (b"{not json", b"\xff\xfe", b"[1, 2]", b'{"state": 3}'):
        (tmp_path / STATUS_FILE).write_bytes(garbage)
        assert read_status(tmp_path) is None


def _status_of_dead_process(run_dir: Path) -> None:
    code = f"from pickaxe.runs.status import write_status; write_status({str(run_dir)!r}, 'running', step=5)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_running_status_of_a_dead_process_is_crashed(tmp_path: Path) -> None:
    _status_of_dead_process(tmp_path)
    assert read_status(tmp_path)["state"] == "running"
    assert run_state(tmp_path) == "crashed"


def test_reused_pid_is_crashed(tmp_path: Path) -> None:
    write_status(tmp_path, "running")
    status = json.loads((tmp_path / STATUS_FILE).read_text())
    status["process_create_time"] -= 3600  # same pid, but a process started an hour earlier wrote it
    (tmp_path / STATUS_FILE).write_text(json.dumps(status))
    assert run_state(tmp_path) == "crashed"


def test_other_host_is_trusted(tmp_path: Path) -> None:
    _status_of_dead_process(tmp_path)
    status = json.loads((tmp_path / STATUS_FILE).read_text())
    status["hostname"] = "some-other-machine"
    (tmp_path / STATUS_FILE).write_text(json.dumps(status))
    assert run_state(tmp_path) == "running"


def test_run_set_status(tmp_path: Path) -> None:
    from pickaxe.runs.run import Run

    with Run(tmp_path / "r", tensorboard=False) as run:
        run.set_status("interrupted", step=7)
        assert read_status(tmp_path / "r")["state"] == "interrupted"
        assert run_state(tmp_path / "r") == "interrupted"
        run.set_phase("training", step=8, total_steps=10)
        run.set_status("running", step=9)  # phase and total kept from the write before
        status = read_status(tmp_path / "r")
        assert (status["phase"], status["step"], status["total_steps"], status["state"]) == (
            "training",
            9,
            10,
            "running",
        )
        run.set_status("crashed", reason="boom")
        assert read_status(tmp_path / "r")["reason"] == "boom"
        run.set_status("finished")  # a finished run has no phase and no reason of an earlier write
        status = read_status(tmp_path / "r")
        assert "phase" not in status and "reason" not in status and status["wall_s"] >= 0
        with pytest.raises(ValueError, match="unknown run phase 'warmup'"):
            run.set_phase("warmup")


def test_status_and_listing_import_without_torch() -> None:
    code = (
        "import sys, pickaxe.runs.status, pickaxe.runs.listing; "
        "print('torch' in sys.modules, 'gymnasium' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# ------------------------------------------------------------------------------------------------ listing


def _fake_run(path: Path, recipe: str, records: list[dict], kind: str = "classic", total: int = 1000) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"recipe": recipe, "kind": kind, "trainer": {"total_steps": total}}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 9')  # torn line
    return path


def test_list_runs_finds_runs_in_sweeps_with_state_progress_and_evals(tmp_path: Path) -> None:
    from pickaxe.runs.listing import format_runs, list_runs

    done = _fake_run(
        tmp_path / "a-very-long-run-folder-name-that-must-not-be-cut" / "ppo",
        "cartpole-ppo",
        [
            {"step": 500, "eval/return_mean": 80.0, "time/elapsed_s": 10.0},
            {"step": 1000, "eval/return_mean": 60.0, "time/elapsed_s": 20.0},
        ],
    )
    write_status(done, "finished", step=1000)
    resumed = _fake_run(  # killed at 30 s, resumed from a checkpoint: the clock restarts
        tmp_path / "sweep-x" / "lr=0.1" / "seed-0",
        "cartpole-dqn",
        [{"step": 100, "time/elapsed_s": 30.0}, {"step": 200, "time/elapsed_s": 5.0}],
    )
    _status_of_dead_process(resumed)
    llm = _fake_run(
        tmp_path / "sweep-x" / "llm",
        "arith-grpo",
        [
            {"step": 0, "eval/accuracy": 0.9, "eval/phase_before": 1.0},  # before training: not the run's result
            {"step": 64, "eval/accuracy": 0.25, "time/elapsed_s": 1.0},
        ],
        kind="llm",
        total=64,
    )
    (llm / "model.safetensors").write_bytes(b"x")  # no status.json (older pickaxe): finished because it has a model
    (tmp_path / "sweep-x" / "compare").mkdir()  # not a run

    runs = list_runs(tmp_path)
    by_recipe = {r.recipe: r for r in runs}
    assert [r.path for r in runs] == sorted([done, resumed, llm])
    ppo, dqn, grpo = by_recipe["cartpole-ppo"], by_recipe["cartpole-dqn"], by_recipe["arith-grpo"]
    assert (ppo.state, ppo.step, ppo.total_steps, ppo.final_eval, ppo.best_eval, ppo.wall_s) == (
        "finished", 1000, 1000, 60.0, 80.0, 20.0
    )  # fmt: skip
    assert (dqn.state, dqn.step, dqn.final_eval, dqn.wall_s) == ("crashed", 5, None, 35.0)
    assert (grpo.state, grpo.metric, grpo.final_eval, grpo.best_eval) == ("finished", "eval/accuracy", 0.25, 0.25)

    table = format_runs(runs).splitlines()
    assert table[0].split() == ["recipe", "state", "env", "steps", "final", "eval", "best", "eval", "wall", "run"]
    row = next(line for line in table if "cartpole-ppo" in line)
    assert row.split() == ["cartpole-ppo", "finished", "1,000/1,000", "60.0", "80.0", "20.0s", str(done)]
    assert any(line.endswith(str(llm)) and "0.250" in line for line in table)


def test_list_runs_of_a_run_folder_and_of_nothing(tmp_path: Path) -> None:
    from pickaxe.errors import PickaxeError
    from pickaxe.runs.listing import format_runs, list_runs

    run = _fake_run(tmp_path / "r", "cartpole-ppo", [])
    assert [s.path for s in list_runs(run)] == [run]
    assert list_runs(tmp_path / "r" / "..")[0].recipe == "cartpole-ppo"
    assert "no runs" in format_runs([])
    with pytest.raises(PickaxeError, match="is not a folder"):
        list_runs(tmp_path / "missing")


def test_a_running_run_shows_its_phase_and_its_wall_time_goes_on(tmp_path: Path) -> None:
    import time

    from pickaxe.runs.listing import format_runs, summarize_run
    from pickaxe.runs.status import status_wall_s

    run = _fake_run(tmp_path / "r", "arith-grpo", [{"step": 0, "warm_start/update": 50.0}], kind="llm", total=64)
    write_status(run, "running", phase="warm_start", wall_s=300.0)  # 5 minutes into its warm start, no step yet
    summary = summarize_run(run)
    assert (summary.state, summary.phase, summary.step) == ("running", "warm_start", 0)
    assert summary.wall_s >= 300.0  # its status's wall time (not the metrics' training time, which has none yet)
    assert "running (warm start)" in format_runs([summary])
    status = read_status(run)
    status["time"] -= 60  # written a minute ago: a live run's wall time counts the minute since
    assert status_wall_s(status, "running") >= 360.0 and status_wall_s(status, "crashed") == 300.0
    assert status_wall_s({"state": "finished", "time": time.time()}) is None  # an older pickaxe's status

    _status_of_dead_process(run)  # gone without a word: crashed, and no phase shown
    summary = summarize_run(run)
    assert (summary.state, summary.phase) == ("crashed", None) and format_runs([summary]).count("crashed") == 1
