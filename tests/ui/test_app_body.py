"""Request bodies of ``pickaxe ui`` are capped while they arrive: a ``Content-Length`` over the cap is refused before
any of the body is read, a chunked body (no length) is refused at the first piece past the cap, and in both cases
the route never sees the request (nothing is stored). Driven through the app's ASGI interface, so the test counts
exactly how many pieces of the body the app asked for."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from pathlib import Path
from typing import Any

import pytest

from pickaxe.eval.arena import ArenaStore
from pickaxe.ui.app import create_app
from pickaxe.ui.arena import MAX_BODY_BYTES

PIECE = 1024


@pytest.fixture
def arena_root(runs_root: Path) -> Path:
    """The runs folder with ``llm/arena.sqlite`` holding arena ``demo`` (two checkpoints, one prompt)."""
    store = ArenaStore(runs_root / "llm" / "arena.sqlite")
    store.add_arena("demo", {})
    store.add_responses("demo", [(0, "1+1=", "a", "2"), (0, "1+1=", "b", "3")])
    return runs_root


def _vote_padded_to(root: Path, size: int) -> bytes:
    """A valid vote on a fresh match, padded with JSON whitespace to ``size`` bytes: only its size can refuse it."""
    match = ArenaStore(root / "llm" / "arena.sqlite").issue_match("demo", "ann")
    vote = json.dumps({"arena": "llm:demo", "match": match.id, "voter": "ann", "choice": "left"}).encode()
    return vote + b" " * (size - len(vote))


def _post(app: Any, path: str, body: bytes, chunked: bool) -> tuple[int, dict[str, Any], int, int]:
    """POST ``body`` to ``path`` in pieces of :data:`PIECE` bytes, with a ``Content-Length`` unless ``chunked``;
    returns the status, the JSON answer, how many pieces the app read and how many there were."""
    pieces = [body[i : i + PIECE] for i in range(0, len(body), PIECE)]
    read = 0

    async def receive() -> dict[str, Any]:
        nonlocal read
        if read < len(pieces):
            read += 1
            return {"type": "http.request", "body": pieces[read - 1], "more_body": read < len(pieces)}
        await asyncio.sleep(3600)  # a client still connected, sending nothing more
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json")]
    if not chunked:
        headers.append((b"content-length", str(len(body)).encode()))
    else:
        headers.append((b"transfer-encoding", b"chunked"))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    # in a thread of its own: a browser test's Playwright session earlier in this process keeps an event loop
    # running on the main thread, where asyncio.run refuses to start
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, asyncio.wait_for(app(scope, receive, send), timeout=60)).result()
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    answer = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
    return status, answer, read, len(pieces)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_just_over_the_cap_is_refused_before_it_is_read(arena_root: Path, chunked: bool) -> None:
    app = create_app(arena_root, queue_db=arena_root / "queue.db")
    status, answer, read, pieces = _post(
        app, "/api/arena/vote", _vote_padded_to(arena_root, MAX_BODY_BYTES + 1), chunked
    )
    assert status == 413 and answer == {"detail": f"the request body is over {MAX_BODY_BYTES} bytes"}
    # a stated length is refused before any piece is read; a chunked body at the piece that crosses the cap
    assert read == (pieces if chunked else 0)
    assert ArenaStore(arena_root / "llm" / "arena.sqlite").vote_count() == 0  # the route never had the vote


def test_a_chunked_body_far_over_the_cap_is_not_read_to_its_end(arena_root: Path) -> None:
    app = create_app(arena_root, queue_db=arena_root / "queue.db")
    body = _vote_padded_to(arena_root, 100 * MAX_BODY_BYTES)
    status, _, read, pieces = _post(app, "/api/arena/vote", body, chunked=True)
    assert status == 413
    assert read == MAX_BODY_BYTES // PIECE + 1 and pieces == 100 * MAX_BODY_BYTES // PIECE
    assert ArenaStore(arena_root / "llm" / "arena.sqlite").vote_count() == 0


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_at_the_cap_is_served(arena_root: Path, chunked: bool) -> None:
    app = create_app(arena_root, queue_db=arena_root / "queue.db")
    status, answer, read, pieces = _post(app, "/api/arena/vote", _vote_padded_to(arena_root, MAX_BODY_BYTES), chunked)
    assert (status, answer, read) == (200, {"stored": True, "votes": 1}, pieces)


def test_the_playground_caps_its_body_too(tmp_path: Path) -> None:
    from pickaxe.ui.playground import MAX_BODY_BYTES as PLAYGROUND_MAX

    app = create_app(tmp_path, queue_db=tmp_path / "queue.db")
    body = json.dumps({"run": "r", "checkpoint": "final", "prompt": "x" * PLAYGROUND_MAX}).encode()
    status, _, read, _ = _post(app, "/api/playground/generate", body, chunked=False)
    assert (status, read) == (413, 0)
