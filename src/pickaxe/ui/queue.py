"""The Queue page's API: the jobs of the queue database, their logs, and Cancel / Retry through the same
``JobQueue`` methods as ``pickaxe queue cancel`` / ``retry``. A missing database is an empty queue, not an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import PlainTextResponse

from pickaxe.errors import PickaxeError
from pickaxe.exp.queue_store import Job, JobQueue, NoQueueError
from pickaxe.ui.runs import run_id

__all__ = ["LOG_TAIL_BYTES", "router"]

router = APIRouter()
"""Routes of the Queue page's API; ``create_app`` includes them."""

LOG_TAIL_BYTES = 2_000_000
"""A log longer than this is served from its end (a note on the first line says so)."""


def _open(request: Request) -> JobQueue:
    db: Path = request.app.state.queue_db
    try:
        return JobQueue(db, create=False)
    except NoQueueError as e:
        raise HTTPException(404, str(e)) from None
    except PickaxeError as e:
        raise HTTPException(500, str(e)) from None


def _job(job: Job, root: Path) -> dict[str, Any]:
    out = job.to_dict()
    out["wall_s"] = job.wall_s
    out["log_url"] = f"/api/queue/{job.id}/log" if job.log_path else None
    out["run_id"] = None  # the job's run on the Runs page, when it is one of the app's runs
    if job.run_dir:
        path = (Path(job.cwd) / job.run_dir).resolve()
        if (path == root or root in path.parents) and (path / "config.json").is_file():
            out["run_id"] = run_id(root, path)
    return out


@router.get("/api/queue")
def list_jobs(request: Request) -> dict[str, Any]:
    """The jobs, oldest first; ``exists`` false (and a message naming the command that creates the queue) when
    there is no database."""
    db: Path = request.app.state.queue_db
    try:
        q = JobQueue(db, create=False)
    except NoQueueError as e:
        return {"db": str(db), "exists": False, "message": str(e), "jobs": []}
    except PickaxeError as e:
        raise HTTPException(500, str(e)) from None
    with q:
        jobs = q.list()
    root: Path = request.app.state.runs_dir
    return {"db": str(q.path), "exists": True, "message": None, "jobs": [_job(j, root) for j in jobs]}


def _act(request: Request, job_id: int, action: str) -> dict[str, Any]:
    with _open(request) as q:
        try:
            q.get(job_id)
        except PickaxeError as e:
            raise HTTPException(404, str(e)) from None
        try:
            job = q.cancel(job_id) if action == "cancel" else q.retry(job_id)
        except PickaxeError as e:  # a transition the job's state does not allow
            raise HTTPException(409, str(e)) from None
    if action == "cancel" and job.state == "running":
        message = f"job {job.id} is running on worker {job.worker_id}; it will stop and be marked cancelled"
    else:
        message = f"job {job.id} {job.state}"
    return {"job": _job(job, request.app.state.runs_dir), "message": message}


@router.post("/api/queue/{job_id}/cancel")
def cancel_job(request: Request, job_id: int) -> dict[str, Any]:
    """``pickaxe queue cancel ID``: queued and blocked jobs at once, a running one by its worker."""
    return _act(request, job_id, "cancel")


@router.post("/api/queue/{job_id}/retry")
def retry_job(request: Request, job_id: int) -> dict[str, Any]:
    """``pickaxe queue retry ID``: a failed, cancelled or blocked job queued again."""
    return _act(request, job_id, "retry")


@router.get("/api/queue/{job_id}/log", response_class=PlainTextResponse)
def job_log(request: Request, job_id: int, attempt: int | None = None) -> PlainTextResponse:
    """The log of a job's latest attempt (or of ``attempt``) as plain text; the end of it when it is long."""
    with _open(request) as q:
        try:
            job = q.get(job_id)
            attempts = q.attempts(job_id)
        except PickaxeError as e:
            raise HTTPException(404, str(e)) from None
    if attempt is None:
        path = job.log_path
    else:
        path = next((a.log_path for a in attempts if a.attempt == attempt), None)
        if path is None:
            raise HTTPException(404, f"job {job_id} has no attempt {attempt} (it has {len(attempts)})")
    if not path:
        raise HTTPException(404, f"job {job_id} has not started yet, so it has no log")
    file = Path(path)
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            if size > LOG_TAIL_BYTES:
                f.seek(size - LOG_TAIL_BYTES)
            data = f.read()
    except OSError as e:
        raise HTTPException(404, f"cannot read the log {file}: {e.strerror or e}") from None
    text = data.decode("utf-8", errors="replace")
    if size > LOG_TAIL_BYTES:
        text = f"[the last {LOG_TAIL_BYTES:,} of {size:,} bytes of {file}]\n" + text.split("\n", 1)[-1]
    return PlainTextResponse(text, headers={"X-Content-Type-Options": "nosniff"})
