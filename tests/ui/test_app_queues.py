"""Every queue under the runs folder on the Queue page (the default one, a sweep's and a pipeline's), their jobs with
dependencies and priorities, actions on the queue named, and a recipe run queued from the page as ``pickaxe queue
add`` would queue it (checked first; nothing queued when it is refused)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from pickaxe.exp.queue_store import JobQueue
from pickaxe.ui.app import create_app


def make_queue(folder: Path, marker: str) -> Path:
    """A sweep's or pipeline's folder (``marker``: sweep.json or pipeline.json) with a queue of two dependent jobs."""
    folder.mkdir(parents=True)
    (folder / marker).write_text("{}\n")
    with JobQueue(folder / "queue.db") as q:
        first = q.add(["pickaxe", "train", "cartpole-ppo"], name=f"{folder.name}-a", priority=5)
        q.add(["pickaxe", "train", "cartpole-dqn"], name=f"{folder.name}-b", depends_on=[first], priority=1)
    return folder / "queue.db"


@pytest.fixture
def queues(runs_root: Path, tmp_path: Path) -> dict[str, Path]:
    default = tmp_path / "default.db"
    with JobQueue(default) as q:
        q.add(["pickaxe", "train", "cartpole-ppo"], name="mine")
    return {
        "default": default,
        "sweep-cartpole-ppo-1a2b": make_queue(runs_root / "sweep-cartpole-ppo-1a2b", "sweep.json"),
        "pipes/pipeline-rlhf-3c4d": make_queue(runs_root / "pipes" / "pipeline-rlhf-3c4d", "pipeline.json"),
    }


def test_every_queue_under_the_runs_folder_is_listed(runs_root: Path, queues: dict[str, Path]) -> None:
    client = TestClient(create_app(runs_root, queue_db=queues["default"]))
    listed = client.get("/api/queues").json()
    assert [(q["id"], q["kind"]) for q in listed["queues"]] == [
        ("default", "default"),
        ("pipes/pipeline-rlhf-3c4d", "pipeline"),
        ("sweep-cartpole-ppo-1a2b", "sweep"),
    ]
    assert listed["queues"][2]["counts"] == {"queued": 2}
    assert "cartpole-ppo" in listed["recipes"]
    jobs = client.get("/api/queue", params={"queue": "sweep-cartpole-ppo-1a2b"}).json()
    assert jobs["db"] == str(queues["sweep-cartpole-ppo-1a2b"].resolve()) and jobs["kind"] == "sweep"
    assert [(j["name"], j["priority"], j["depends_on"]) for j in jobs["jobs"]] == [
        ("sweep-cartpole-ppo-1a2b-a", 5, []),
        ("sweep-cartpole-ppo-1a2b-b", 1, [1]),
    ]
    assert [j["name"] for j in client.get("/api/queue").json()["jobs"]] == ["mine"]  # the default queue
    r = client.get("/api/queue", params={"queue": "../elsewhere"})
    assert r.status_code == 404 and "/api/queues lists the queues" in r.json()["detail"]


def test_cancel_acts_on_the_queue_named(runs_root: Path, queues: dict[str, Path]) -> None:
    client = TestClient(create_app(runs_root, queue_db=queues["default"]))
    r = client.post("/api/queue/1/cancel", params={"queue": "pipes/pipeline-rlhf-3c4d"}, json={})
    assert r.status_code == 200 and r.json()["message"] == "job 1 cancelled"
    with JobQueue(queues["pipes/pipeline-rlhf-3c4d"], create=False) as q:
        assert (q.get(1).state, q.get(2).state) == ("cancelled", "blocked")
    with JobQueue(queues["default"], create=False) as q:
        assert q.get(1).state == "queued"  # the default queue's job 1 is another job


def test_queue_a_recipe_run_with_flags_and_priority(runs_root: Path, tmp_path: Path) -> None:
    db = tmp_path / "new" / "queue.db"
    client = TestClient(create_app(runs_root, queue_db=db))
    body = {"recipe": "cartpole-ppo", "flags": "--algo.lr 1e-4 --seed 2", "priority": 7}
    r = client.post("/api/queue/add", json=body)
    assert r.status_code == 200, r.text
    job = r.json()["job"]
    assert job["argv"][:5] == [sys.executable, "-m", "pickaxe.cli", "train", "cartpole-ppo"]
    assert job["argv"][5:9] == ["--algo.lr", "1e-4", "--seed", "2"] and job["priority"] == 7
    assert Path(job["run_dir"]).parent == runs_root.resolve()  # the run lands under the app's folder
    r = client.post("/api/queue/add", json={**body, "flags": f"--run-dir {tmp_path / 'x'}", "after": "1"})
    job2 = r.json()["job"]
    assert job2["depends_on"] == [1] and job2["run_dir"] == str(tmp_path / "x")
    with JobQueue(db, create=False) as q:
        assert [j.priority for j in q.list()] == [7, 7]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"recipe": "cartpole-ppo", "flags": "--algo.lrr 1e-4"}, "unknown config key --algo.lrr; did you mean"),
        ({"recipe": "cartpole-ppo", "flags": "--algo.lr -1"}, "algo.lr"),
        ({"recipe": "carpole-ppo"}, "cartpole-ppo"),
        ({"recipe": "cartpole-ppo", "priority": "high"}, "priority must be an integer"),
        ({"recipe": "cartpole-ppo", "after": [99]}, "99"),
        ({"recipe": "cartpole-ppo", "flags": "--seed 'unterminated"}, "flags:"),
    ],
)
def test_a_bad_run_is_refused_before_anything_is_queued(runs_root: Path, tmp_path: Path, body: dict, says: str) -> None:
    db = tmp_path / "queue.db"
    with JobQueue(db):
        pass
    r = TestClient(create_app(runs_root, queue_db=db)).post("/api/queue/add", json=body)
    assert r.status_code == 422 and says in r.json()["detail"], r.text
    with JobQueue(db, create=False) as q:
        assert q.list() == []
