"""The Run page's API: a run's config, status and mutable keys; its metrics read incrementally (whole lines only, a
rewound file read again); its events; live changes written exactly where and as ``pickaxe set`` writes them, with
the same refusals and the same cross-site protections as the vote endpoint."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from pickaxe.cli import main as cli_main
from pickaxe.runs.status import write_status
from pickaxe.ui.app import LOOPBACK_HOSTS, create_app


@pytest.fixture
def live_run(runs_root: Path, make_run: Callable[..., Path]) -> Path:
    """A running (this process is its writer) cartpole-ppo run with the recipe's full config."""
    return make_run(runs_root / "live", evals={1000: 10.0}, state="running", real_config=True)


def test_info_lists_config_status_and_the_keys_pickaxe_set_accepts(runs_root: Path, live_run: Path) -> None:
    client = TestClient(create_app(runs_root, queue_db=runs_root / "q.db"))
    data = client.get("/api/run", params={"run": "live"}).json()
    assert data["config"]["recipe"] == "cartpole-ppo" and data["status"]["state"] == "running"
    keys = {m["key"]: m for m in data["mutable"]}
    assert keys["algo.lr"]["value"] == 3e-4 and keys["algo.lr"]["range"] == "> 0 and <= 10"
    assert "algo.gamma" not in keys and data["mutable_error"] is None
    (live_run / "overrides.jsonl").write_text(json.dumps({"step": 500, "key": "algo.lr", "value": 1e-4}) + "\n")
    data = client.get("/api/run", params={"run": "live"}).json()
    assert {m["key"]: m["value"] for m in data["mutable"]}["algo.lr"] == 1e-4  # the value in force now
    assert data["overrides"] == [{"step": 500, "key": "algo.lr", "value": 1e-4}]
    assert client.get("/api/run", params={"run": "../x"}).status_code == 400
    assert client.get("/api/run", params={"run": "nope"}).status_code == 404


def test_a_warming_up_run_reads_as_running_in_its_phase(runs_root: Path, live_run: Path) -> None:
    write_status(live_run, "running", phase="warm_start", step=0)
    status = TestClient(create_app(runs_root)).get("/api/run", params={"run": "live"}).json()["status"]
    assert (status["state"], status["phase"]) == ("running", "warm_start")


def test_poll_returns_new_whole_lines_and_starts_over_after_a_rewind(runs_root: Path, live_run: Path) -> None:
    client = TestClient(create_app(runs_root))
    first = client.get("/api/run/poll", params={"run": "live"}).json()
    assert [r["step"] for r in first["records"]] == [1000, 1000] and not first["reset"]
    assert first["offset"] == (live_run / "metrics.jsonl").stat().st_size and first["status"]["state"] == "running"
    with open(live_run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 2000, "loss/kl": 0.01, "sys/rss_mb": 300.0}) + "\n")
        f.write('{"step": 3000, "loss/kl"')  # a line still being written
    q = {"run": "live", "offset": first["offset"], "file": first["file"]}
    second = client.get("/api/run/poll", params=q).json()
    assert second["records"] == [{"step": 2000, "loss/kl": 0.01, "sys/rss_mb": 300.0}] and not second["reset"]
    q["offset"] = second["offset"]
    assert client.get("/api/run/poll", params=q).json()["records"] == []  # the torn line waits
    # a resume rewinds metrics.jsonl (a new file): the page is told to start again
    tmp = live_run / "metrics.tmp"
    tmp.write_text(json.dumps({"step": 1000, "loss/kl": 0.5}) + "\n")
    os.replace(tmp, live_run / "metrics.jsonl")
    third = client.get("/api/run/poll", params=q).json()
    assert third["reset"] and third["records"] == [{"step": 1000, "loss/kl": 0.5}]


def test_poll_returns_new_events(runs_root: Path, live_run: Path) -> None:
    client = TestClient(create_app(runs_root))
    assert client.get("/api/run/poll", params={"run": "live"}).json()["events"] == []
    with open(live_run / "events.jsonl", "a") as f:
        f.write(json.dumps({"time": 1.0, "message": "resumed from step 1000", "step": 1000}) + "\n")
        f.write(json.dumps({"time": 2.0, "message": "alarm", "alarm": "kl_past_peak", "step": 2000}) + "\n")
    data = client.get("/api/run/poll", params={"run": "live", "events": 1}).json()
    assert [e["step"] for e in data["events"]] == [2000] and data["events_count"] == 2


def test_set_writes_the_request_pickaxe_set_writes(
    runs_root: Path, live_run: Path, capsys: pytest.CaptureFixture
) -> None:
    client = TestClient(create_app(runs_root))
    r = client.post("/api/run/set", json={"run": "live", "changes": {"algo.lr": "1e-4", "algo.epochs": 4}})
    assert r.status_code == 200, r.text
    assert r.json()["changes"] == {"algo.lr": 1e-4, "algo.epochs": 4}
    (page_file,) = (live_run / "control").iterdir()
    assert cli_main(["set", str(live_run), "algo.lr=1e-4", "algo.epochs=4"]) == 0
    cli_file = next(p for p in (live_run / "control").iterdir() if p != page_file)
    assert page_file.read_text() == cli_file.read_text()  # byte for byte what `pickaxe set` writes
    capsys.readouterr()


@pytest.mark.parametrize(
    ("changes", "status", "says"),
    [
        ({"algo.lr": "-1"}, 422, "algo.lr must be > 0"),
        ({"algo.gamma": "0.5"}, 422, "algo.gamma cannot change while a run trains"),
        ({"algo.lr": "fast"}, 422, "algo.lr"),
        ({}, 422, "changes must be an object"),
        ({"algo.lr": None}, 422, "give the value as text or a number"),
    ],
)
def test_set_refuses_what_pickaxe_set_refuses(
    runs_root: Path, live_run: Path, changes: dict, status: int, says: str
) -> None:
    r = TestClient(create_app(runs_root)).post("/api/run/set", json={"run": "live", "changes": changes})
    assert r.status_code == status and says in r.json()["detail"]
    assert not (live_run / "control").exists()  # nothing written


def test_set_refuses_a_finished_run(runs_root: Path, make_run: Callable[..., Path]) -> None:
    run = make_run(runs_root / "done", evals={1000: 1.0}, state="finished", real_config=True)
    (run / "model.safetensors").write_bytes(b"")
    r = TestClient(create_app(runs_root)).post("/api/run/set", json={"run": "done", "changes": {"algo.lr": "1e-4"}})
    assert r.status_code == 409 and "has finished" in r.json()["detail"]


def test_set_has_the_vote_endpoints_cross_site_protections(runs_root: Path, live_run: Path) -> None:
    client = TestClient(create_app(runs_root, allowed_hosts=LOOPBACK_HOSTS), base_url="http://127.0.0.1:8000")
    body = json.dumps({"run": "live", "changes": {"algo.lr": "1e-4"}})
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = client.post("/api/run/set", content=body, headers={"Content-Type": kind})
        assert r.status_code == 415  # what a cross-site form or a simple fetch can send
    r = client.post("/api/run/set", content=body, headers={"Content-Type": "application/json", "Host": "evil.test"})
    assert r.status_code == 400  # DNS rebinding
    assert not (live_run / "control").exists()
    assert client.post("/api/run/set", content=body, headers={"Content-Type": "application/json"}).status_code == 200


def test_a_change_from_the_page_is_applied_and_replayed_on_resume(runs_root: Path, live_run: Path) -> None:
    """What the Trainer does with the page's request: take it at the next boundary, record it, replay it."""
    from pickaxe.recipes.args import load_run_config
    from pickaxe.train.overrides import Override, OverrideLog, mutable_keys

    client = TestClient(create_app(runs_root))
    assert client.post("/api/run/set", json={"run": "live", "changes": {"algo.lr": "2e-4"}}).status_code == 200
    allowed = mutable_keys(load_run_config(live_run).algo)
    assert OverrideLog(live_run, allowed).take(1500) == [Override(1500, "algo.lr", 2e-4)]
    assert list((live_run / "control").iterdir()) == []
    resumed = OverrideLog(live_run, allowed)  # a resume from the checkpoint of step 1000
    assert resumed.before(1000) == [] and resumed.take(1500) == [Override(1500, "algo.lr", 2e-4)]
    info = client.get("/api/run", params={"run": "live"}).json()
    assert info["overrides"] == [{"step": 1500, "key": "algo.lr", "value": 2e-4}] and info["pending"] == 0


def test_a_run_whose_first_status_is_not_written_yet_is_warming_up(runs_root: Path) -> None:
    """Between the folder's creation (config.json, the "started" event) and its first status.json a run reads as
    loading, not crashed, while the process that started it lives; crashed once that process is gone."""
    import socket

    run = runs_root / "new"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"recipe": "cartpole-ppo", "kind": "classic"}))
    started = {"time": 1.0, "message": "started", "step": 0, "pid": os.getpid(), "hostname": socket.gethostname()}
    (run / "events.jsonl").write_text(json.dumps(started) + "\n")
    client = TestClient(create_app(runs_root))
    (listed,) = [r for r in client.get("/api/runs").json()["runs"] if r["id"] == "new"]
    assert (listed["state"], listed["phase"]) == ("running", "loading")
    status = client.get("/api/run", params={"run": "new"}).json()["status"]
    assert (status["state"], status["phase"]) == ("running", "loading")
    (run / "events.jsonl").write_text(json.dumps({**started, "pid": 2**22 + 12345}) + "\n")  # no such process
    assert client.get("/api/run", params={"run": "new"}).json()["status"]["state"] == "crashed"
