"""The Checkpoints API of ``pickaxe ui``: ``eval/checkpoints.json`` (the schema ``pickaxe eval --checkpoints``
writes), the training curves with their CIs, alarms from every place they are recorded, and the selection."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pickaxe.ui.app import create_app


def write_checkpoints(run: Path, content: Any) -> None:
    (run / "eval").mkdir(exist_ok=True)
    text = content if isinstance(content, str) else json.dumps(content)
    (run / "eval" / "checkpoints.json").write_text(text)


@pytest.fixture
def client(runs_root: Path, tmp_path: Path) -> TestClient:
    return TestClient(create_app(runs_root, queue_db=tmp_path / "q.db"))


def test_a_run_without_checkpoint_eval_names_the_command(client: TestClient, runs_root: Path) -> None:
    data = client.get("/api/checkpoints", params={"run": "llm"}).json()
    assert data["evaluation"] is None and data["errors"] == []
    assert data["command"] == f"pickaxe eval {runs_root / 'llm'} --checkpoints all"
    acc = data["training"]["eval/accuracy"]  # the training-time evaluations, with their logged CIs
    assert acc == {
        "step": [0, 64, 128],
        "mean": [0.9, 0.25, 0.5],
        "low": [None, -0.75, -0.5],
        "high": [None, 1.25, 1.5],
    }
    assert list(data["training"]) == ["eval/accuracy"]  # CI bounds and eval/phase_before are not curves
    assert data["alarms"] == [] and data["selection"] is None


def test_checkpoint_eval_alarms_and_selection(client: TestClient, runs_root: Path, checkpoint_eval: dict) -> None:
    run = runs_root / "llm"
    write_checkpoints(run, checkpoint_eval)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 128, "eval/accuracy": 0.5, "alarm/proxy_up_gold_down": 1.0}) + "\n")
        f.write(json.dumps({"step": 192, "eval/accuracy": 0.4, "alarm/length_drift": 1.0}) + "\n")
    with open(run / "events.jsonl", "a") as f:
        f.write(json.dumps({"time": 1.0, "message": "started", "step": 0}) + "\n")
        f.write(json.dumps({"time": 2.0, "message": "length drifted", "alarm": "length_drift", "step": 192}) + "\n")
        f.write("torn {\n")
    (run / "selection.json").write_text(json.dumps({"step": 64, "metric": "eval/accuracy", "rule": "latest"}))
    data = client.get("/api/checkpoints", params={"run": "llm"}).json()
    assert data["command"] is None and data["errors"] == []
    assert data["evaluation"] == checkpoint_eval
    assert data["alarms"] == [
        {
            "name": "proxy_up_gold_down",
            "step": 128,
            "message": "proxy reward up while gold fell below its CI",
            "values": {"gold": 0.7},
            "sources": ["eval", "metrics"],
        },
        {
            "name": "length_drift",
            "step": 192,
            "message": "length drifted",
            "values": None,
            "sources": ["metrics", "events"],
        },
    ]
    assert data["selection"]["step"] == 64
    assert data["training"]["eval/accuracy"]["step"] == [0, 64, 128, 192]  # step 128 logged twice: the last wins


@pytest.mark.parametrize(
    ("content", "error"),
    [("{not json", "is unreadable"), ({"rows": "x"}, "has no 'rows' list; run pickaxe eval again")],
)
def test_a_damaged_checkpoints_file_is_an_error_line(
    client: TestClient, runs_root: Path, content: Any, error: str
) -> None:
    write_checkpoints(runs_root / "llm", content)
    data = client.get("/api/checkpoints", params={"run": "llm"}).json()
    assert data["evaluation"] is None and data["command"].startswith("pickaxe eval")
    assert len(data["errors"]) == 1 and error in data["errors"][0]


@pytest.mark.parametrize(
    ("run", "status"), [("../..", 400), ("nope", 404), ("sweep/lr=0.0003", 404), ("a\\..\\b", 400)]
)
def test_bad_runs_are_refused(client: TestClient, run: str, status: int) -> None:
    r = client.get("/api/checkpoints", params={"run": run})
    assert r.status_code == status and isinstance(r.json()["detail"], str)


def test_the_run_parameter_is_required(client: TestClient) -> None:
    r = client.get("/api/checkpoints")
    assert (r.status_code, r.json()["detail"]) == (422, "bad request: run: Field required")
