"""The arena of ``pickaxe ui``: the vote API round trip, malformed requests answered 4xx with one line and nothing
stored, model output returned as data; in Chromium: votes change the leaderboard, a ``<script>`` response is shown
as text, a malformed vote from the page is refused and not counted."""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pickaxe.eval.arena import ArenaStore
from pickaxe.ui.app import create_app

SCRIPT = "<script>alert(1)</script>"
IMG = '<img src=x onerror="alert(2)">'


@pytest.fixture
def arena_root(runs_root: Path) -> Path:
    """The runs folder with ``llm/arena.sqlite`` holding arena ``demo`` (three checkpoints, four prompts) and arena
    ``xss`` (two checkpoints whose answers are markup)."""
    store = ArenaStore(runs_root / "llm" / "arena.sqlite")
    store.add_arena("demo", {"run": "llm"})
    labels = ("step 64", "step 128", "final")
    store.add_responses("demo", [(i, f"{i}+{i}=", lab, f"{lab} answers {2 * i}") for i in range(4) for lab in labels])
    store.add_arena("xss", {})
    store.add_responses("xss", [(0, "<b>which?</b>", "a", SCRIPT), (0, "<b>which?</b>", "b", IMG)])
    return runs_root


@pytest.fixture
def client(arena_root: Path) -> TestClient:
    return TestClient(create_app(arena_root, queue_db=arena_root / "queue.db"))


def _votes(root: Path) -> int:
    return ArenaStore(root / "llm" / "arena.sqlite").vote_count()


def test_vote_round_trip_moves_the_leaderboard(client: TestClient, arena_root: Path) -> None:
    arenas = {a["id"]: a for a in client.get("/api/arena/arenas").json()["arenas"]}
    assert arenas["llm:demo"] | {"votes": 0} == {
        "id": "llm:demo", "name": "demo", "folder": "llm", "checkpoints": 3, "prompts": 4, "votes": 0,
        "identical_pairs": 0, "pairs": 12,
    }  # fmt: skip
    before = client.get("/api/arena/leaderboard", params={"arena": "llm:demo"}).json()
    assert before["votes"] == 0 and {r["score"] for r in before["ratings"]} == {1000.0}
    store = ArenaStore(arena_root / "llm" / "arena.sqlite")
    for _ in range(6):  # always vote for the answer of "final"
        m = client.post("/api/arena/match", json={"arena": "llm:demo", "voter": "alice"}).json()
        assert set(m) == {"match", "prompt", "left", "right"}  # checkpoints are not named
        assert m["left"] != m["right"]
        choice = "left" if m["left"].startswith("final") else "right" if m["right"].startswith("final") else "tie"
        r = client.post("/api/arena/vote", json={"arena": "llm:demo", "match": m["match"], "voter": "alice",
                                                 "choice": choice})  # fmt: skip
        assert r.status_code == 200 and r.json()["stored"] is True
        again = client.post("/api/arena/vote", json={"arena": "llm:demo", "match": m["match"], "voter": "alice",
                                                     "choice": choice})  # fmt: skip
        assert again.json() == {"stored": False, "votes": r.json()["votes"]}  # a repeated request counts once
    assert store.vote_count("demo") == 6
    board = client.get("/api/arena/leaderboard", params={"arena": "llm:demo"}).json()
    assert board["votes"] == 6 and sum(r["votes"] for r in board["ratings"]) == 12
    if any(r["wins"] for r in board["ratings"]):
        assert board["ratings"][0]["name"] == "final"
    assert board["separate"]["a"] == board["ratings"][0]["name"]


def test_malformed_requests_are_one_line_4xx_and_store_nothing(client: TestClient, arena_root: Path) -> None:
    m = client.post("/api/arena/match", json={"arena": "llm:demo", "voter": "bob"}).json()
    good = {"arena": "llm:demo", "match": m["match"], "voter": "bob", "choice": "left"}
    bad: list[tuple[Any, int, str]] = [
        ("not json", 400, "JSON object"),
        ([1, 2], 400, "JSON object"),
        ({k: v for k, v in good.items() if k != "choice"}, 422, "missing field: choice"),
        ({"arena": "llm:demo"}, 422, "missing fields: match, voter, choice"),
        (good | {"choice": "up"}, 422, "choice must be one of"),
        (good | {"choice": None}, 422, "choice must be one of"),
        (good | {"match": "forged"}, 404, "unknown match"),
        (good | {"match": 12}, 422, "match must be"),
        (good | {"voter": "mallory"}, 403, "another voter"),
        (good | {"voter": ""}, 400, "voter must be"),
        (good | {"voter": "x" * 100}, 400, "at most 64"),
        (good | {"arena": "llm:nope"}, 404, "no arena"),
        (good | {"arena": "../../etc:demo"}, 404, "no arena"),
        (good | {"arena": 3}, 422, "arena must be"),
    ]
    for body, status, message in bad:
        content = body if isinstance(body, str) else json.dumps(body)
        r = client.post("/api/arena/vote", content=content, headers={"Content-Type": "application/json"})
        assert r.status_code == status, (body, r.text)
        detail = r.json()["detail"]
        assert isinstance(detail, str) and "\n" not in detail and message in detail, (body, detail)
    assert _votes(arena_root) == 0
    assert client.post("/api/arena/vote", json=good).status_code == 200
    r = client.post("/api/arena/vote", json=good | {"choice": "right"})
    assert r.status_code == 409 and "already has a vote" in r.json()["detail"]
    assert _votes(arena_root) == 1
    assert client.post("/api/arena/match", json={"arena": "llm:demo"}).status_code == 422
    assert client.get("/api/arena/leaderboard").status_code == 422
    assert client.get("/api/arena/leaderboard", params={"arena": "x:y"}).status_code == 404


def test_markup_in_a_response_is_returned_as_data(client: TestClient) -> None:
    r = client.post("/api/arena/match", json={"arena": "llm:xss", "voter": "eve"})
    assert r.headers["content-type"] == "application/json"
    m = r.json()
    assert {m["left"], m["right"]} == {SCRIPT, IMG} and m["prompt"] == "<b>which?</b>"


def _voted(page: Any) -> int:
    return int(page.locator("#board").get_attribute("data-votes") or 0)


def test_arena_page_votes_change_the_leaderboard(
    arena_root: Path, ui_server: Callable[[Any], str], page: Any, screenshot: Callable[[Any, str], Path]
) -> None:
    base = ui_server(create_app(arena_root, queue_db=arena_root / "queue.db"))
    page.goto(f"{base}/arena?arena=llm:demo")
    page.wait_for_selector("#match:not([hidden])")
    page.wait_for_function("document.querySelector('#board').dataset.votes === '0'")
    voter = page.locator("#voter").input_value()
    assert voter.startswith("voter-")
    for i, choice in enumerate(["left", "right", "left", "tie"]):
        page.click(f".arena-votes button[data-choice={choice}]")
        page.wait_for_function(f"document.querySelector('#board').dataset.votes === '{i + 1}'")
    page.wait_for_selector(".arena-votes button:not([disabled])")
    rows = page.locator("table.arena-board tbody tr")
    assert rows.count() == 3
    assert sum(int(rows.nth(i).locator("td").nth(4).inner_text()) for i in range(3)) == 8
    assert "separate the top two" in page.locator("#separate").inner_text() or "level" in page.inner_text("#separate")
    assert ArenaStore(arena_root / "llm" / "arena.sqlite").vote_count("demo") == 4
    # a malformed vote sent from the page's own origin is refused and not counted
    r = page.request.post(f"{base}/api/arena/vote", data={"arena": "llm:demo", "match": "x", "voter": voter})
    assert r.status == 422 and "missing field: choice" in r.json()["detail"]
    r = page.request.post(
        f"{base}/api/arena/vote", data={"arena": "llm:demo", "match": "forged", "voter": voter, "choice": "left"}
    )
    assert r.status == 404
    page.reload()
    page.wait_for_function("document.querySelector('#board').dataset.votes === '4'")
    page.wait_for_selector(".arena-votes button:not([disabled])")
    assert page.js_errors == [] and page.outside_requests == []
    screenshot(page, "arena")


def test_arena_page_shows_markup_as_text(
    arena_root: Path, ui_server: Callable[[Any], str], page: Any, screenshot: Callable[[Any, str], Path]
) -> None:
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    base = ui_server(create_app(arena_root, queue_db=arena_root / "queue.db"))
    page.goto(f"{base}/arena?arena=llm:xss")
    page.wait_for_selector("#match:not([hidden])")
    shown = {page.inner_text("#left"), page.inner_text("#right")}
    assert shown == {SCRIPT, IMG}
    assert page.inner_text("#prompt") == "<b>which?</b>"
    assert page.locator("#left script, #right script, #left img, #right img, #prompt b").count() == 0
    page.click(".arena-votes button[data-choice=both_bad]")
    page.wait_for_function("document.querySelector('#board').dataset.votes === '1'")
    page.wait_for_selector(".arena-votes button:not([disabled])")
    assert dialogs == [] and page.js_errors == []
    screenshot(page, "arena-markup-as-text")


def test_arena_names_with_colons_resolve(client: TestClient, arena_root: Path) -> None:
    store = ArenaStore(arena_root / "llm" / "arena.sqlite")
    store.add_arena("v1:greedy", {})
    store.add_responses("v1:greedy", [(0, "p", "a", "x"), (0, "p", "b", "y")])
    ids = [a["id"] for a in client.get("/api/arena/arenas").json()["arenas"]]
    assert "llm:v1:greedy" in ids
    r = client.post("/api/arena/match", json={"arena": "llm:v1:greedy", "voter": "z"})
    assert r.status_code == 200 and {r.json()["left"], r.json()["right"]} == {"x", "y"}


def test_a_vote_naming_another_arena_is_refused(client: TestClient, arena_root: Path) -> None:
    # both arenas live in llm/arena.sqlite: the match of one must not be counted in the reply of the other
    m = client.post("/api/arena/match", json={"arena": "llm:xss", "voter": "kim"}).json()
    vote = {"arena": "llm:demo", "match": m["match"], "voter": "kim", "choice": "left"}
    r = client.post("/api/arena/vote", json=vote)
    assert r.status_code == 409 and "belongs to arena 'xss', not 'demo'" in r.json()["detail"]
    assert _votes(arena_root) == 0
    r = client.post("/api/arena/vote", json=vote | {"arena": "llm:xss"})
    assert r.json() == {"stored": True, "votes": 1}  # the count of the arena the vote is stored in
    assert ArenaStore(arena_root / "llm" / "arena.sqlite").vote_count("demo") == 0


def _closed_store(path: Path) -> Path:
    """An arena file with one arena (two checkpoints), its store closed: no ``-wal``/``-shm`` beside it."""
    store = ArenaStore(path)
    store.add_arena("a", {})
    store.add_responses("a", [(0, "p", "x", "1"), (0, "p", "y", "2")])
    store.close()
    del store
    gc.collect()
    assert sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name)) == [path.name]
    return path


def test_a_damaged_or_outside_arena_file_is_skipped_not_a_500(
    client: TestClient, arena_root: Path, tmp_path: Path, make_run: Callable[..., Path]
) -> None:
    make_run(arena_root / "broken", kind="llm")
    (arena_root / "broken" / "arena.sqlite").write_bytes(b"not a database " * 100)
    outside = _closed_store(tmp_path / "elsewhere" / "arena.sqlite")
    before = outside.read_bytes()
    make_run(arena_root / "linked", kind="llm")
    (arena_root / "linked" / "arena.sqlite").symlink_to(outside)
    quiet = _closed_store(make_run(arena_root / "quiet", kind="llm") / "arena.sqlite")

    r = client.get("/api/arena/arenas")
    assert r.status_code == 200
    body = r.json()
    assert {a["id"] for a in body["arenas"]} == {"llm:demo", "llm:xss", "quiet:a"}
    reasons = {u["folder"]: u["reason"] for u in body["unreadable"]}
    assert set(reasons) == {"broken", "linked"}
    assert "not a readable arena file (file is not a database)" in reasons["broken"]
    assert "leads outside" in reasons["linked"] and "not opened" in reasons["linked"]
    assert all("\n" not in reason for reason in reasons.values())
    # listing only reads: nothing is created beside the arena files, inside the runs folder or out of it
    assert sorted(p.name for p in quiet.parent.iterdir() if p.name.startswith("arena")) == ["arena.sqlite"]
    assert [p.name for p in outside.parent.iterdir()] == ["arena.sqlite"] and outside.read_bytes() == before

    for arena, status, detail in [("linked:a", 409, "leads outside"), ("broken:a", 409, "not a readable arena")]:
        r = client.post("/api/arena/match", json={"arena": arena, "voter": "v"})
        assert r.status_code == status and detail in r.json()["detail"], r.text
    assert [p.name for p in outside.parent.iterdir()] == ["arena.sqlite"] and outside.read_bytes() == before
    assert client.post("/api/arena/match", json={"arena": "quiet:a", "voter": "v"}).status_code == 200
