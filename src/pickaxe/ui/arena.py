"""The arena page and API of ``pickaxe ui``: blind pairwise votes between a run's checkpoints.

Arenas are found in the ``arena.sqlite`` files (:data:`~pickaxe.ui.arena_command.DEFAULT_DB`, written by
``pickaxe arena RUN_DIR``) of the run folders under ``app.state.runs_dir`` (and RUNS_DIR itself). An arena's id is
``<folder relative to RUNS_DIR>:<name>``; requests naming anything else are refused, so no path is ever taken from
a request.

API (every error is ``{"detail": "<one line>"}`` with a 4xx status, and stores nothing):

- ``GET /api/arena/arenas``: the arenas with their checkpoint, prompt and vote counts;
- ``POST /api/arena/match`` ``{"arena", "voter"}``: a new match, ``{"match", "prompt", "left", "right"}`` (the
  checkpoints are not named);
- ``POST /api/arena/vote`` ``{"arena", "match", "voter", "choice"}`` with choice ``left|right|tie|both_bad``:
  ``{"stored": true|false (a repeat of the same vote), "votes": N}``;
- ``GET /api/arena/leaderboard?arena=ID``: Bradley–Terry ratings (Elo-like scale) with 95% bootstrap CIs and how
  many more votes would separate the top two.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from pickaxe.eval.arena import ArenaError, ArenaStore, Rating, separation
from pickaxe.runs.listing import find_run_dirs
from pickaxe.ui.arena_command import DEFAULT_DB
from pickaxe.ui.body import json_body

__all__ = ["router"]

router = APIRouter()
"""Routes of the arena; ``pickaxe.ui.app.create_app`` includes them."""

STATIC_DIR = Path(__file__).parent / "static"
MAX_BODY_BYTES = 16_384
BOOTSTRAP = 1000

_lock = threading.Lock()
_stores: dict[Path, ArenaStore] = {}
_boards: dict[tuple[Path, str], dict[str, Any]] = {}
_fitting: dict[tuple[Path, str], threading.Lock] = {}
_discovered: dict[Path, tuple[float, list[Path]]] = {}
DISCOVERY_TTL_S = 2.0


def _store(path: Path) -> ArenaStore:
    """One ``ArenaStore`` per file (opening one runs its schema statements)."""
    with _lock:
        store = _stores.get(path)
        if store is None:
            store = _stores[path] = ArenaStore(path)
        return store


def _arena_files(root: Path) -> list[Path]:
    """The arena files (resolved) of RUNS_DIR and of every run folder under it; the folder walk is reused for
    :data:`DISCOVERY_TTL_S` seconds, so a vote does not walk every run folder."""
    now = time.monotonic()
    with _lock:
        hit = _discovered.get(root)
    if hit is not None and now - hit[0] < DISCOVERY_TTL_S:
        return hit[1]
    folders = [root] if (root / "config.json").is_file() else [root, *find_run_dirs(root)]
    found = [(f / DEFAULT_DB).resolve() for f in folders if (f / DEFAULT_DB).is_file()]
    with _lock:
        _discovered[root] = (now, found)
    return found


def _arena_id(root: Path, path: Path, name: str) -> str:
    rel = path.parent.relative_to(root).as_posix()
    return f"{rel}:{name}"


def _find(request: Request, arena: Any) -> tuple[ArenaStore, str]:
    """The store and name of arena id ``arena`` (404 when no arena file under RUNS_DIR has it)."""
    if not isinstance(arena, str) or not arena or len(arena) > 1000:
        raise HTTPException(422, "arena must be an arena id from /api/arena/arenas")
    root: Path = request.app.state.runs_dir
    files = _arena_files(root)
    for i, c in enumerate(arena):  # folder names and arena names may both hold ":"; try each split
        if c != ":":
            continue
        folder, name = arena[:i], arena[i + 1 :]
        path = (root / folder / DEFAULT_DB).resolve()
        if path.is_relative_to(root) and path in files:
            store = _store(path)
            if name in store.arenas():
                return store, name
    raise HTTPException(404, f"no arena {arena!r} under {root}; create one with `pickaxe arena RUN_DIR`")


def _refuse(e: ArenaError) -> HTTPException:
    return HTTPException(e.status, str(e))


@router.get("/arena", include_in_schema=False)
async def arena_page() -> FileResponse:
    """The arena page."""
    return FileResponse(STATIC_DIR / "arena.html", media_type="text/html", headers={"Cache-Control": "no-store"})


@router.get("/api/arena/arenas")
def list_arenas(request: Request) -> dict[str, Any]:
    """Every arena under RUNS_DIR: id, name, run folder, checkpoints, prompts and votes."""
    root: Path = request.app.state.runs_dir
    out = []
    for path in _arena_files(root):
        store = _store(path)
        for name in store.arenas():
            out.append(
                {
                    "id": _arena_id(root, path, name),
                    "name": name,
                    "folder": path.parent.relative_to(root).as_posix(),
                    "checkpoints": len(store.labels(name)),
                    "prompts": store.prompt_count(name),
                    "votes": store.vote_count(name),
                }
            )
    return {"arenas": out}


def _issue(request: Request, arena: Any, voter: Any) -> dict[str, Any]:
    store, name = _find(request, arena)
    try:
        match = store.issue_match(name, voter)
    except ArenaError as e:
        raise _refuse(e) from None
    return {"match": match.id, "prompt": match.prompt, "left": match.left, "right": match.right}


def _vote(request: Request, arena: Any, match: Any, voter: Any, choice: Any) -> dict[str, Any]:
    store, name = _find(request, arena)
    try:
        stored = store.record_vote(match, voter, choice)
    except ArenaError as e:
        raise _refuse(e) from None
    return {"stored": stored, "votes": store.vote_count(name)}


@router.post("/api/arena/match")
async def new_match(request: Request) -> dict[str, Any]:
    """Issue a match of ``arena`` to ``voter``: a prompt and two anonymised responses in random order."""
    body = await json_body(request, ("arena", "voter"), MAX_BODY_BYTES)
    return await run_in_threadpool(_issue, request, body["arena"], body["voter"])


@router.post("/api/arena/vote")
async def vote(request: Request) -> dict[str, Any]:
    """Record ``voter``'s ``choice`` on ``match``; every field is checked before anything is stored."""
    body = await json_body(request, ("arena", "match", "voter", "choice"), MAX_BODY_BYTES)
    return await run_in_threadpool(_vote, request, body["arena"], body["match"], body["voter"], body["choice"])


def _rating(r: Rating) -> dict[str, Any]:
    return asdict(r)


def _board(store: ArenaStore, name: str) -> dict[str, Any]:
    """The leaderboard of ``name``, never older than the votes stored when the request came in. One fit per arena
    at a time: requests that arrive during a fit wait for it and take its result when it already counts every vote
    they could have seen, so 20 voters cost a few fits per wave of votes instead of one each."""
    key = (store.path, name)
    seen = store.vote_count(name)
    with _lock:
        cached = _boards.get(key)
        fitting = _fitting.setdefault(key, threading.Lock())
    if cached is not None and cached["votes"] >= seen:
        return cached
    with fitting:
        with _lock:
            cached = _boards.get(key)
        if cached is not None and cached["votes"] >= seen:
            return cached
        votes = store.votes(name)
        ratings = store.leaderboard_of(name, votes, n_boot=BOOTSTRAP)
        sep = separation(votes, ratings)
        result = {
            "arena": name,
            "votes": len(votes),
            "ratings": [_rating(r) for r in ratings],
            "separate": asdict(sep) if sep is not None else None,
            "scale": "Bradley-Terry strength on an Elo-like scale (400 points = 10:1 odds, mean 1000); "
            f"95% CI: percentile bootstrap over votes ({BOOTSTRAP} resamples)",
        }
        with _lock:
            _boards[key] = result
        return result


@router.get("/api/arena/leaderboard")
async def arena_leaderboard(request: Request, arena: str | None = None) -> dict[str, Any]:
    """The leaderboard of ``arena`` (cached until the next vote)."""
    if arena is None:
        raise HTTPException(422, "missing query parameter: arena")
    return await run_in_threadpool(lambda: _board(*_find(request, arena)))
