"""Identical answers never make an arena match: pairs of checkpoints that answered a prompt the same are skipped and
counted (store, API), and an arena where every pair is identical says so instead of serving a match."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from pickaxe.eval.arena import ArenaError, ArenaStore, read_arenas
from pickaxe.ui.app import create_app


def test_identical_answers_are_never_issued_and_are_counted(tmp_path: Path, identical_arena: Callable) -> None:
    store = identical_arena(tmp_path / "arena.sqlite")
    for _ in range(40):
        m = store.issue_match("same", "v")
        assert m.left != m.right and m.prompt == "q4"
    assert store.identical_pairs("same") == (13, 15)  # 4 prompts x 3 pairs + a-b of prompt 4, of 5 x 3
    (summary,) = read_arenas(tmp_path / "arena.sqlite")
    assert (summary.identical, summary.pairs) == (13, 15)


def test_an_arena_of_identical_answers_only_says_so(tmp_path: Path) -> None:
    store = ArenaStore(tmp_path / "arena.sqlite")
    store.add_arena("flat", {})
    store.add_responses("flat", [(0, "q", "a", "x"), (0, "q", "b", "x")])
    with pytest.raises(ArenaError, match="every pair of answers is identical") as e:
        store.issue_match("flat", "v")
    assert e.value.status == 409


def test_api_counts_identical_pairs_and_serves_only_differing_ones(runs_root: Path, identical_arena: Callable) -> None:
    identical_arena(runs_root / "llm" / "arena.sqlite")
    client = TestClient(create_app(runs_root, queue_db=runs_root / "q.db"))
    (arena,) = client.get("/api/arena/arenas").json()["arenas"]
    assert (arena["identical_pairs"], arena["pairs"]) == (13, 15)
    for _ in range(10):
        m = client.post("/api/arena/match", json={"arena": "llm:same", "voter": "v"}).json()
        assert m["left"] != m["right"]
    board = client.get("/api/arena/leaderboard", params={"arena": "llm:same"}).json()
    assert (board["identical_pairs"], board["pairs"]) == (13, 15)
