"""The Queue page's API: every job queue under the app's runs folder and the default one, their jobs, their logs,
Cancel / Retry through the same ``JobQueue`` methods as ``pickaxe queue cancel`` / ``retry``, and Add, checked like
``pickaxe queue add``. A missing database is an empty queue, not an error.

Queues are named by id, never by a path from the request: ``default`` (the app's ``queue_db``: ``--queue-db``,
``$PICKAXE_QUEUE`` or ``~/.pickaxe/queue.db``) and, for each ``queue.db`` a sweep or a pipeline keeps in its folder
under RUNS_DIR, that folder relative to RUNS_DIR.
"""

from __future__ import annotations

import os
import shlex
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import PlainTextResponse
from starlette.concurrency import run_in_threadpool

from pickaxe.errors import PickaxeError
from pickaxe.exp.pipeline import PIPELINE_FILE
from pickaxe.exp.queue_jobs import Job
from pickaxe.exp.queue_store import JobQueue, NoQueueError
from pickaxe.exp.sweep import SWEEP_FILE
from pickaxe.runs.listing import SKIP_DIRS
from pickaxe.ui.body import json_body
from pickaxe.ui.runs import run_id

__all__ = ["DEFAULT_QUEUE", "LOG_TAIL_BYTES", "QueueFile", "find_queues", "router"]

router = APIRouter()
"""Routes of the Queue page's API; ``create_app`` includes them."""

LOG_TAIL_BYTES = 2_000_000
"""A log longer than this is served from its end (a note on the first line says so)."""
DEFAULT_QUEUE = "default"
"""The id of the app's own queue database."""
QUEUE_FILE = "queue.db"
MAX_DEPTH = 4
"""How deep under RUNS_DIR queue files are looked for (a sweep's or pipeline's folder is usually one level down)."""
DISCOVERY_TTL_S = 2.0
MAX_BODY_BYTES = 16_384


@dataclass(frozen=True)
class QueueFile:
    """A queue the page shows: its ``id``, the database ``path`` and what made it (``default``, ``sweep``,
    ``pipeline`` or ``folder``)."""

    id: str
    path: Path
    kind: str


_lock = threading.Lock()
_found: dict[Path, tuple[float, list[QueueFile]]] = {}


def _kind(folder: Path) -> str:
    if (folder / SWEEP_FILE).is_file():
        return "sweep"
    if (folder / PIPELINE_FILE).is_file():
        return "pipeline"
    return "folder"


def find_queues(root: Path, default_db: Path) -> list[QueueFile]:
    """The default queue, then every ``queue.db`` under ``root`` (not inside run folders, at most
    :data:`MAX_DEPTH` levels down), by path. The walk is reused for :data:`DISCOVERY_TTL_S` seconds."""
    now = time.monotonic()
    with _lock:
        hit = _found.get(root)
    if hit is not None and now - hit[0] < DISCOVERY_TTL_S and hit[1][0].path == default_db:
        return hit[1]
    out = [QueueFile(DEFAULT_QUEUE, default_db, "default")]
    default_real = default_db.resolve() if default_db.exists() else default_db
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        depth = len(here.relative_to(root).parts)
        if "config.json" in files and here != root:
            dirs[:] = []  # a run folder holds no queue of its own
            continue
        if QUEUE_FILE in files:
            path = (here / QUEUE_FILE).resolve()
            if path.is_relative_to(root) and path != default_real:
                out.append(QueueFile(here.relative_to(root).as_posix() or ".", path, _kind(here)))
        dirs[:] = [] if depth >= MAX_DEPTH else sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
    with _lock:
        _found[root] = (now, out)
    return out


def _queue(request: Request, queue: str | None) -> QueueFile:
    """The queue of id ``queue`` (the default one when None); 404 for an id no queue has."""
    state = request.app.state
    queues = find_queues(state.runs_dir, state.queue_db)
    wanted = queue or DEFAULT_QUEUE
    for q in queues:
        if q.id == wanted:
            return q
    raise HTTPException(404, f"no queue {wanted!r} under {state.runs_dir}; /api/queues lists the queues")


def _open(request: Request, queue: str | None) -> JobQueue:
    db = _queue(request, queue).path
    try:
        return JobQueue(db, create=False)
    except NoQueueError as e:
        raise HTTPException(404, str(e)) from None
    except PickaxeError as e:
        raise HTTPException(500, str(e)) from None


def _job(job: Job, root: Path) -> dict[str, Any]:
    out = job.to_dict()
    out["wall_s"] = job.wall_s
    out["run_id"] = None  # the job's run on the Runs page, when it is one of the app's runs
    if job.run_dir:
        path = (Path(job.cwd) / job.run_dir).resolve()
        if (path == root or root in path.parents) and (path / "config.json").is_file():
            out["run_id"] = run_id(root, path)
    return out


def _log_url(job: dict[str, Any], queue: str) -> str | None:
    if not job["log_path"]:
        return None
    suffix = "" if queue == DEFAULT_QUEUE else f"?queue={_quote(queue)}"
    return f"/api/queue/{job['id']}/log{suffix}"


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def _jobs(q: QueueFile, root: Path) -> dict[str, Any]:
    try:
        db = JobQueue(q.path, create=False)
    except NoQueueError as e:
        return {"queue": q.id, "kind": q.kind, "db": str(q.path), "exists": False, "message": str(e), "jobs": []}
    except PickaxeError as e:
        raise HTTPException(500, str(e)) from None
    with db:
        jobs = db.list()
    out = []
    for j in jobs:
        d = _job(j, root)
        d["log_url"] = _log_url(d, q.id)
        out.append(d)
    return {"queue": q.id, "kind": q.kind, "db": str(db.path), "exists": True, "message": None, "jobs": out}


@router.get("/api/queues")
def list_queues(request: Request) -> dict[str, Any]:
    """Every queue the page can show: the default one and each sweep's and pipeline's under RUNS_DIR, with how
    many jobs each holds in each state (a default queue not created yet has ``exists`` false)."""
    state = request.app.state
    out = []
    for q in find_queues(state.runs_dir, state.queue_db):
        counts: dict[str, int] = {}
        exists = q.path.is_file()
        if exists:
            try:
                with JobQueue(q.path, create=False) as db:
                    for j in db.list():
                        counts[j.state] = counts.get(j.state, 0) + 1
            except PickaxeError:
                exists = False
        out.append({"id": q.id, "kind": q.kind, "db": str(q.path), "exists": exists, "counts": counts})
    from pickaxe.recipes import RECIPES

    return {"queues": out, "recipes": sorted(RECIPES)}


@router.get("/api/queue")
def list_jobs(request: Request, queue: str | None = None) -> dict[str, Any]:
    """The jobs of ``queue`` (default: the app's queue), oldest first; ``exists`` false (and a message naming the
    command that creates the queue) when there is no database."""
    return _jobs(_queue(request, queue), request.app.state.runs_dir)


def _act(request: Request, job_id: int, action: str, queue: str | None) -> dict[str, Any]:
    with _open(request, queue) as q:
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
def cancel_job(request: Request, job_id: int, queue: str | None = None) -> dict[str, Any]:
    """``pickaxe queue cancel ID``: queued and blocked jobs at once, a running one by its worker."""
    return _act(request, job_id, "cancel", queue)


@router.post("/api/queue/{job_id}/retry")
def retry_job(request: Request, job_id: int, queue: str | None = None) -> dict[str, Any]:
    """``pickaxe queue retry ID``: a failed, cancelled or blocked job queued again."""
    return _act(request, job_id, "retry", queue)


def _int(body: dict[str, Any], key: str, default: int, low: int | None = None) -> int:
    value = body.get(key, default)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
        bound = f" >= {low}" if low is not None else ""
        raise HTTPException(422, f"{key} must be an integer{bound}, got {value!r}")
    return value


def _add(request: Request, body: dict[str, Any]) -> dict[str, Any]:
    from pickaxe.recipes.args import check_train_command

    q = _queue(request, body.get("queue") if isinstance(body.get("queue"), str) else None)
    recipe, flags = body["recipe"], body.get("flags", "")
    if not isinstance(recipe, str) or not recipe.strip() or recipe.strip().startswith("-"):
        raise HTTPException(422, "recipe must be a recipe name, e.g. cartpole-ppo (`pickaxe recipes` lists them)")
    if not isinstance(flags, str):
        raise HTTPException(422, "flags must be text, e.g. --algo.lr 1e-4 --seed 2")
    try:
        words = shlex.split(flags)
    except ValueError as e:
        raise HTTPException(422, f"flags: {e} (quote values as a shell would)") from None
    priority = _int(body, "priority", 0)
    cpus = _int(body, "cpus", 1, low=1)
    after = body.get("after", [])
    if isinstance(after, str):
        after = [a for a in after.replace(",", " ").split() if a]
    if not isinstance(after, list) or not all(
        (isinstance(a, int) and not isinstance(a, bool)) or (isinstance(a, str) and a.isdigit()) for a in after
    ):
        raise HTTPException(422, "after must be job ids (integers) of this queue")
    root: Path = request.app.state.runs_dir
    if not any(w == "--run-dir" or w.startswith("--run-dir=") for w in words):
        # under the app's folder, so the run shows on the Runs page
        words += ["--run-dir", str(root / f"{recipe.strip()}-{time.strftime('%Y%m%d-%H%M%S')}")]
    argv = [sys.executable, "-m", "pickaxe.cli", "train", recipe.strip(), *words]
    try:
        check_train_command(argv)  # a bad command fails now, not in a worker later, as `pickaxe queue add`
    except PickaxeError as e:
        raise HTTPException(422, str(e)) from None
    name = body.get("name") or None
    if name is not None and (not isinstance(name, str) or len(name) > 200):
        raise HTTPException(422, "name must be text of at most 200 characters")
    try:
        with JobQueue(q.path) as db:
            for a in after:
                db.get(int(a))
            job_id = db.add(
                argv,
                name=name,
                priority=priority,
                depends_on=[int(a) for a in after],
                cpus=cpus,
                cwd=root,
            )
            job = db.get(job_id)
    except PickaxeError as e:
        raise HTTPException(422, str(e)) from None
    out = _job(job, root)
    return {"job": out, "queue": q.id, "message": f"job {job_id} queued in {q.id} ({job.state})"}


@router.post("/api/queue/add")
async def add_job(request: Request) -> dict[str, Any]:
    """``pickaxe queue add [--priority P] [--after ID ...] [--cpus N] [--name NAME] -- pickaxe train RECIPE FLAGS``:
    ``{"queue"?, "recipe", "flags"?, "priority"?, "after"?, "cpus"?, "name"?}``; the train command is checked as
    ``pickaxe train`` would check it before anything is queued. Without ``--run-dir`` in the flags the run goes to
    ``RUNS_DIR/<recipe>-<time>``. The default queue is created when missing, as the CLI does."""
    body = await json_body(request, ("recipe",), MAX_BODY_BYTES)
    return await run_in_threadpool(_add, request, body)


@router.get("/api/queue/{job_id}/log", response_class=PlainTextResponse)
def job_log(request: Request, job_id: int, attempt: int | None = None, queue: str | None = None) -> PlainTextResponse:
    """The log of a job's latest attempt (or of ``attempt``) as plain text; the end of it when it is long."""
    with _open(request, queue) as q:
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
