"""The Queue API of ``pickaxe ui``: jobs as ``pickaxe queue list`` knows them, Cancel / Retry through the same
``JobQueue`` methods as the CLI (the database changes), logs as text, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from pickaxe.exp.queue_store import JobQueue
from pickaxe.ui.app import create_app


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "queue.db"
    with JobQueue(path) as q:
        first = q.add(["pickaxe", "train", "cartpole-ppo"], name="first", priority=2)
        q.add(["pickaxe", "train", "cartpole-dqn"], name="second", depends_on=[first])
    return path


def test_no_queue_database_is_an_empty_queue(runs_root: Path, tmp_path: Path) -> None:
    client = TestClient(create_app(runs_root, queue_db=tmp_path / "none.db"))
    data = client.get("/api/queue").json()
    assert (data["exists"], data["jobs"]) == (False, [])
    assert data["message"].endswith("`pickaxe queue add -- COMMAND` creates it")
    assert not (tmp_path / "none.db").exists()  # reading never creates the queue
    r = client.post("/api/queue/1/cancel", json={})
    assert r.status_code == 404 and "there is no job queue at" in r.json()["detail"]


def test_jobs_with_state_priority_dependencies_and_attempts(runs_root: Path, db: Path) -> None:
    client = TestClient(create_app(runs_root, queue_db=db))
    data = client.get("/api/queue").json()
    assert data["exists"] and data["db"] == str(db)
    first, second = data["jobs"]
    assert (first["id"], first["name"], first["state"], first["priority"], first["attempts"]) == (
        1,
        "first",
        "queued",
        2,
        0,
    )
    assert (second["depends_on"], second["log_url"], second["run_id"]) == ([1], None, None)


def test_a_job_writing_one_of_the_runs_links_to_it(runs_root: Path, tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    with JobQueue(db) as q:
        q.add(["pickaxe", "train", "cartpole-ppo"], run_dir=str(runs_root / "llm"))
        q.add(["pickaxe", "train", "cartpole-ppo"], run_dir=str(tmp_path / "elsewhere"))
    jobs = TestClient(create_app(runs_root, queue_db=db)).get("/api/queue").json()["jobs"]
    assert [j["run_id"] for j in jobs] == ["llm", None]


def test_cancel_and_retry_change_the_database_like_the_cli(runs_root: Path, db: Path) -> None:
    client = TestClient(create_app(runs_root, queue_db=db))
    r = client.post("/api/queue/1/cancel", json={})
    assert r.status_code == 200
    assert (r.json()["job"]["state"], r.json()["message"]) == ("cancelled", "job 1 cancelled")
    with JobQueue(db, create=False) as q:
        assert [q.get(1).state, q.get(2).state] == ["cancelled", "blocked"]  # its dependent is blocked, as the CLI does
    r = client.post("/api/queue/1/cancel", json={})
    assert r.status_code == 409
    assert r.json()["detail"] == "job 1 is already cancelled; only queued, blocked or running jobs can be cancelled"
    r = client.post("/api/queue/2/retry", json={})
    assert (r.status_code, r.json()["detail"]) == (409, "job 2 depends on job 1, which is cancelled; retry job 1 first")
    assert client.post("/api/queue/1/retry", json={}).json()["job"]["state"] == "queued"
    with JobQueue(db, create=False) as q:
        assert [q.get(1).state, q.get(2).state] == ["queued", "queued"]


@pytest.mark.parametrize(
    ("url", "status", "detail"),
    [
        ("/api/queue/99/cancel", 404, "no job 99 in"),
        ("/api/queue/99/retry", 404, "no job 99 in"),
        ("/api/queue/x/cancel", 422, "bad request: job_id: Input should be a valid integer"),
    ],
)
def test_bad_job_requests_are_one_line(runs_root: Path, db: Path, url: str, status: int, detail: str) -> None:
    r = TestClient(create_app(runs_root, queue_db=db)).post(url, json={})
    assert r.status_code == status and r.json()["detail"].startswith(detail)


def test_a_job_log_is_served_as_text(runs_root: Path, db: Path) -> None:
    client = TestClient(create_app(runs_root, queue_db=db))
    r = client.get("/api/queue/1/log")
    assert (r.status_code, r.json()["detail"]) == (404, "job 1 has not started yet, so it has no log")
    with JobQueue(db) as q:
        job = q.claim("w1", free_cpus=1)
        assert job is not None and job.id == 1
        Path(job.log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(job.log_path).write_text("step 100 <script>alert(1)</script>\nTraceback: boom\n")
        q.finish(1, 1)
    job = client.get("/api/queue").json()["jobs"][0]
    assert (job["state"], job["attempts"], job["log_url"]) == ("failed", 1, "/api/queue/1/log")
    r = client.get(job["log_url"])
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert r.text == "step 100 <script>alert(1)</script>\nTraceback: boom\n"
    assert client.get("/api/queue/1/log", params={"attempt": 1}).text == r.text
    r = client.get("/api/queue/1/log", params={"attempt": 2})
    assert (r.status_code, r.json()["detail"]) == (404, "job 1 has no attempt 2 (it has 1)")


def test_a_cross_site_form_post_changes_nothing(runs_root: Path, db: Path) -> None:
    # a form on another web site can POST to 127.0.0.1 without a CORS preflight, but never as JSON
    client = TestClient(create_app(runs_root, queue_db=db))
    r = client.post("/api/queue/1/cancel", data={"x": "1"})
    assert (r.status_code, r.json()["detail"]) == (
        415,
        "POST requests must send Content-Type: application/json (the pages do)",
    )
    assert client.post("/api/queue/1/cancel", content=b"", headers={"content-type": "text/plain"}).status_code == 415
    with JobQueue(db, create=False) as q:
        assert q.get(1).state == "queued"
