"""The arena page and API of ``pickaxe ui``: blind pairwise votes between a run's checkpoints.

Arenas are found in the ``arena.sqlite`` files (:data:`~pickaxe.ui.arena_command.DEFAULT_DB`, written by
``pickaxe arena RUN_DIR``) of the run folders under ``app.state.runs_dir`` (and RUNS_DIR itself). An arena's id is
``<folder relative to RUNS_DIR>:<name>``; requests naming anything else are refused, so no path is ever taken from
a request.

API (every error is ``{"detail": "<one line>"}`` with a 4xx status, and stores nothing):

- ``GET /api/arena/arenas``: the arenas with their checkpoint, prompt and vote counts, read without writing
  anything, and under ``unreadable`` each arena file that is damaged or leads outside RUNS_DIR, with the reason
  (such a file is skipped, never opened, and never fails the list);
- ``POST /api/arena/match`` ``{"arena", "voter"}``: a new match, ``{"match", "prompt", "left", "right"}`` (the
  checkpoints are not named);
- ``POST /api/arena/vote`` ``{"arena", "match", "voter", "choice"}`` with choice ``left|right|tie|both_bad``:
  ``{"stored": true|false (a repeat of the same vote), "votes": N}`` (N: the votes of that arena; a match of
  another arena is refused with 409);
- ``GET /api/arena/leaderboard?arena=ID``: Bradley–Terry ratings (Elo-like scale) with 95% bootstrap CIs, how
  many more votes would separate the top two, and how many (prompt, pair) hold two identical answers
  (``identical_pairs`` of ``pairs``): those are never issued as matches.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from pickaxe.eval.arena import ArenaError, ArenaStore, Rating, read_arenas, separation
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
_discovered: dict[Path, tuple[float, list[ArenaFile]]] = {}
DISCOVERY_TTL_S = 2.0


@dataclass(frozen=True)
class ArenaFile:
    """An arena file found under RUNS_DIR: its run ``folder`` (relative to RUNS_DIR, ``.`` for RUNS_DIR itself),
    the file it is (``path``, resolved) and, when it must not be opened, why (``problem``)."""

    folder: str
    path: Path
    problem: str | None = None


def _store(entry: ArenaFile) -> ArenaStore:
    """One ``ArenaStore`` per file (opening one runs its schema statements); a damaged file is a one-line 409."""
    if entry.problem is not None:
        raise HTTPException(409, entry.problem)
    with _lock:
        store = _stores.get(entry.path)
        if store is None:
            try:
                store = _stores[entry.path] = ArenaStore(entry.path)
            except sqlite3.DatabaseError as e:
                raise HTTPException(
                    409, f"{entry.folder}/{DEFAULT_DB} is not a readable arena file ({e}); prepare it again"
                ) from None
        return store


def _arena_files(root: Path) -> list[ArenaFile]:
    """The arena files of RUNS_DIR and of every run folder under it; the folder walk is reused for
    :data:`DISCOVERY_TTL_S` seconds, so a vote does not walk every run folder. A file that leads outside RUNS_DIR
    (a symbolic link, or a run folder that is one) is listed with its problem and never opened."""
    now = time.monotonic()
    with _lock:
        hit = _discovered.get(root)
    if hit is not None and now - hit[0] < DISCOVERY_TTL_S:
        return hit[1]
    folders = [root] if (root / "config.json").is_file() else [root, *find_run_dirs(root)]
    found = []
    for folder in folders:
        file = folder / DEFAULT_DB
        if not file.is_file():
            continue
        rel = folder.relative_to(root).as_posix()
        real = file.resolve()
        problem = None
        if not real.is_relative_to(root):
            problem = f"{rel}/{DEFAULT_DB} leads outside {root} (to {real}); it is not opened"
        found.append(ArenaFile(rel, real, problem))
    with _lock:
        _discovered[root] = (now, found)
    return found


def _find(request: Request, arena: Any) -> tuple[ArenaStore, str]:
    """The store and name of arena id ``arena`` (404 when no arena file under RUNS_DIR has it)."""
    if not isinstance(arena, str) or not arena or len(arena) > 1000:
        raise HTTPException(422, "arena must be an arena id from /api/arena/arenas")
    root: Path = request.app.state.runs_dir
    files = {f.folder: f for f in _arena_files(root)}
    for i, c in enumerate(arena):  # folder names and arena names may both hold ":"; try each split
        if c != ":":
            continue
        entry = files.get(arena[:i])
        if entry is not None:
            store = _store(entry)
            if arena[i + 1 :] in store.arenas():
                return store, arena[i + 1 :]
    raise HTTPException(404, f"no arena {arena!r} under {root}; create one with `pickaxe arena RUN_DIR`")


def _refuse(e: ArenaError) -> HTTPException:
    return HTTPException(e.status, str(e))


@router.get("/arena", include_in_schema=False)
async def arena_page() -> FileResponse:
    """The arena page."""
    return FileResponse(STATIC_DIR / "arena.html", media_type="text/html", headers={"Cache-Control": "no-store"})


@router.get("/api/arena/arenas")
def list_arenas(request: Request) -> dict[str, Any]:
    """Every arena under RUNS_DIR (id, name, run folder, checkpoints, prompts and votes), read without writing;
    an arena file that cannot be read or leads outside RUNS_DIR is listed under ``unreadable`` with the reason,
    and the others are listed as ever."""
    root: Path = request.app.state.runs_dir
    out, unreadable = [], []
    for entry in _arena_files(root):
        if entry.problem is not None:
            unreadable.append({"folder": entry.folder, "reason": entry.problem})
            continue
        try:
            summaries = read_arenas(entry.path)
        except ArenaError as e:
            unreadable.append({"folder": entry.folder, "reason": str(e)})
            continue
        for a in summaries:
            out.append(
                {
                    "id": f"{entry.folder}:{a.name}",
                    "name": a.name,
                    "folder": entry.folder,
                    "checkpoints": a.checkpoints,
                    "prompts": a.prompts,
                    "votes": a.votes,
                    "identical_pairs": a.identical,
                    "pairs": a.pairs,
                }
            )
    return {"arenas": out, "unreadable": unreadable}


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
        stored = store.record_vote(match, voter, choice, arena=name)
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
        identical, pairs = store.identical_pairs(name)
        result = {
            "arena": name,
            "votes": len(votes),
            "identical_pairs": identical,
            "pairs": pairs,
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
