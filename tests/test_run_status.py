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


def test_status_and_listing_import_without_torch() -> None:
    code = "import sys, pickaxe.runs.status; print('torch' in sys.modules, 'gymnasium' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
