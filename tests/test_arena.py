"""The arena's statistics and storage: Bradley–Terry strengths match an independent fit, ties count half, the
bootstrap is seeded and brackets the fit, and the SQLite store loses no vote under concurrent voters and stores
nothing for an invalid one."""

import gc
import math
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import minimize

from pickaxe.eval.arena import (
    DEFAULT_PRIOR,
    ELO_BASE,
    ELO_PER_NAT,
    ArenaError,
    ArenaStore,
    ArenaSummary,
    Vote,
    bootstrap_ci,
    bradley_terry,
    leaderboard,
    read_arenas,
    votes_to_separate,
)

# fixed vote data: a beats b 7-3, b and c tie twice, c beats a once, one "both bad" between a and c
VOTES = (
    [Vote("a", "b", "left")] * 5
    + [Vote("b", "a", "right")] * 2
    + [Vote("a", "b", "right")] * 3
    + [Vote("b", "c", "tie")] * 2
    + [Vote("c", "a", "left"), Vote("c", "a", "both_bad"), Vote("b", "c", "left")]
)


def _scipy_fit(votes: list[Vote], prior: float) -> dict[str, float]:
    """The same penalised likelihood maximised by scipy (BFGS), centred."""
    players = sorted({v.left for v in votes} | {v.right for v in votes})
    ix = {p: i for i, p in enumerate(players)}

    def nll(theta: np.ndarray) -> float:
        total = 0.0
        for v in votes:
            d = theta[ix[v.left]] - theta[ix[v.right]]
            s = {"left": 1.0, "right": 0.0}.get(v.choice, 0.5)
            total -= s * -np.logaddexp(0, -d) + (1 - s) * -np.logaddexp(0, d)
        return total + prior / 2 * float(theta @ theta)

    res = minimize(nll, np.zeros(len(players)), method="BFGS", options={"gtol": 1e-10})
    theta = res.x - res.x.mean()
    return {p: float(theta[ix[p]]) for p in players}


def test_two_players_match_the_closed_form_wins_over_losses() -> None:
    votes = [Vote("a", "b", "left")] * 7 + [Vote("b", "a", "left")] * 3
    theta = bradley_terry(votes, prior=0.0)
    assert theta["a"] - theta["b"] == pytest.approx(math.log(7 / 3), abs=1e-9)
    assert theta["a"] + theta["b"] == pytest.approx(0.0, abs=1e-12)
    # a tie is half a win to each side: 7 wins + 2 ties vs 3 wins + 2 ties -> odds 8:4
    theta = bradley_terry([*votes, Vote("a", "b", "tie"), Vote("b", "a", "both_bad")], prior=0.0)
    assert theta["a"] - theta["b"] == pytest.approx(math.log(8 / 4), abs=1e-9)


@pytest.mark.parametrize("prior", [0.0, DEFAULT_PRIOR, 1.0])
def test_bradley_terry_matches_an_independent_scipy_fit(prior: float) -> None:
    ours = bradley_terry(VOTES, prior=prior)
    ref = _scipy_fit(VOTES, prior)
    assert ours.keys() == ref.keys()
    for p in ref:
        assert ours[p] == pytest.approx(ref[p], abs=1e-5)


def test_an_unbeaten_checkpoint_gets_a_finite_strength() -> None:
    theta = bradley_terry([Vote("a", "b", "left")] * 20)
    assert math.isfinite(theta["a"]) and theta["a"] > 2
    assert theta["a"] == pytest.approx(_scipy_fit([Vote("a", "b", "left")] * 20, DEFAULT_PRIOR)["a"], abs=1e-5)


def test_bad_votes_are_refused() -> None:
    with pytest.raises(ValueError, match="choice must be one of"):
        bradley_terry([("a", "b", "maybe")])
    with pytest.raises(ValueError, match="two different checkpoints"):
        bradley_terry([("a", "a", "left")])


def test_bootstrap_is_seeded_and_brackets_the_fit() -> None:
    one, two = bootstrap_ci(VOTES, n=400, seed=3), bootstrap_ci(VOTES, n=400, seed=3)
    assert one == two
    assert bootstrap_ci(VOTES, n=400, seed=4) != one
    theta = bradley_terry(VOTES)
    for p, (low, high) in one.items():
        assert low < theta[p] < high
    # more votes with the same win rate -> a narrower interval
    wide = bootstrap_ci(VOTES, n=400)["a"]
    narrow = bootstrap_ci(VOTES * 4, n=400)["a"]
    assert narrow[1] - narrow[0] < wide[1] - wide[0]


def test_leaderboard_ranks_on_the_elo_scale_with_counts() -> None:
    board = leaderboard(VOTES, players=["d"], n_boot=200)
    assert board[0].name == "a"
    theta = bradley_terry(VOTES)
    a = board[0]
    assert a.score == pytest.approx(1000 + ELO_PER_NAT * theta["a"])
    assert (a.wins, a.losses, a.ties, a.votes) == (7, 4, 1, 12)
    d = next(r for r in board if r.name == "d")
    assert (d.score, d.low, d.high, d.votes) == (1000.0, 1000.0, 1000.0, 0)


def test_votes_to_separate_follows_the_log_odds_formula() -> None:
    votes = [Vote("a", "b", "left")] * 6 + [Vote("a", "b", "right")] * 4
    d = bradley_terry(votes)["a"] - bradley_terry(votes)["b"]
    p = 1 / (1 + math.exp(-d))
    expected = math.ceil(1.959964**2 / (p * (1 - p) * d * d) - 10)
    assert votes_to_separate(votes, "a", "b") == pytest.approx(expected, abs=1)
    assert votes_to_separate([Vote("a", "b", "left")] * 60 + [Vote("a", "b", "right")] * 10, "a", "b") == 0
    assert votes_to_separate([Vote("a", "b", "tie")] * 4, "a", "b") is None


# ---------------------------------------------------------------------------------------------- store


def _store(tmp_path: Path, labels: tuple[str, ...] = ("step 10", "step 20", "final")) -> ArenaStore:
    store = ArenaStore(tmp_path / "arena.sqlite")
    store.add_arena("t", {"run": "x"})
    store.add_responses("t", [(i, f"prompt {i}", lab, f"{lab} says {i}") for i in range(3) for lab in labels])
    return store


def test_store_is_wal_and_issues_anonymised_matches(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert store.journal_mode() == "wal"
    m = store.issue_match("t", "v1")
    assert m.left != m.right and m.prompt.startswith("prompt")
    assert "step" not in m.id and len(m.id) >= 16
    assert store.record_vote(m.id, "v1", "left") is True
    assert store.record_vote(m.id, "v1", "left") is False  # the same request again: idempotent
    assert store.vote_count("t") == 1
    (vote,) = store.votes("t")
    assert f"{vote.left} says" in m.left and vote.choice == "left"


def test_a_vote_on_a_match_of_another_arena_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.add_arena("u", {})
    store.add_responses("u", [(0, "p", "a", "1"), (0, "p", "b", "2")])
    m = store.issue_match("u", "v1")
    with pytest.raises(ArenaError, match="belongs to arena 'u', not 't'") as info:
        store.record_vote(m.id, "v1", "left", arena="t")
    assert info.value.status == 409 and store.vote_count() == 0
    assert store.record_vote(m.id, "v1", "left", arena="u") is True
    assert (store.vote_count("u"), store.vote_count("t")) == (1, 0)


def test_read_arenas_counts_without_creating_files(tmp_path: Path) -> None:
    store = _store(tmp_path)
    m = store.issue_match("t", "v1")
    store.record_vote(m.id, "v1", "left")
    assert read_arenas(store.path) == [ArenaSummary("t", 3, 3, 1, 0, 9)]  # read through the open writer's WAL
    store.close()
    del store
    gc.collect()
    assert [p.name for p in tmp_path.iterdir()] == ["arena.sqlite"]
    assert read_arenas(tmp_path / "arena.sqlite") == [ArenaSummary("t", 3, 3, 1, 0, 9)]
    assert [p.name for p in tmp_path.iterdir()] == ["arena.sqlite"]  # no -wal/-shm made by the read
    (tmp_path / "junk.sqlite").write_bytes(b"junk" * 512)
    with pytest.raises(ArenaError, match="is not a readable arena file") as info:
        read_arenas(tmp_path / "junk.sqlite")
    assert info.value.status == 409


def test_invalid_votes_store_nothing(tmp_path: Path) -> None:
    store = _store(tmp_path)
    m = store.issue_match("t", "v1")
    cases = [
        ((m.id, "v1", "up"), "choice must be one of"),
        (("nope", "v1", "left"), "unknown match"),
        ((m.id, "v2", "left"), "another voter"),
        ((m.id, "", "left"), "voter must be"),
        ((None, "v1", "left"), "match must be"),
        ((m.id, "v1", ["left"]), "choice must be"),
    ]
    for args, message in cases:
        with pytest.raises(ArenaError, match=message):
            store.record_vote(*args)
    assert store.vote_count() == 0
    store.record_vote(m.id, "v1", "tie")
    with pytest.raises(ArenaError, match="already has a vote"):
        store.record_vote(m.id, "v1", "left")
    assert store.votes("t") == [Vote(store.votes("t")[0].left, store.votes("t")[0].right, "tie")]
    with pytest.raises(ArenaError, match="no arena named"):
        store.issue_match("missing", "v1")


def test_concurrent_voters_lose_no_vote(tmp_path: Path) -> None:
    store = _store(tmp_path)
    errors: list[BaseException] = []

    def voter(k: int) -> None:
        try:
            for i in range(15):
                m = store.issue_match("t", f"voter-{k}")
                store.record_vote(m.id, f"voter-{k}", ("left", "right", "tie", "both_bad")[i % 4])
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=voter, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.vote_count("t") == 8 * 15
    with sqlite3.connect(tmp_path / "arena.sqlite") as db:
        assert db.execute("SELECT COUNT(DISTINCT voter) FROM votes").fetchone()[0] == 8
    assert sum(r.votes for r in store.leaderboard("t", n_boot=50)) == 2 * 8 * 15


def _vote_from_process(path: str, k: int, n: int) -> None:
    store = ArenaStore(path)
    for i in range(n):
        m = store.issue_match("t", f"proc-{k}")
        store.record_vote(m.id, f"proc-{k}", ("left", "right", "tie")[i % 3])


def test_voters_in_several_processes_lose_no_vote(tmp_path: Path) -> None:
    import multiprocessing

    store = _store(tmp_path)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_vote_from_process, args=(str(store.path), k, 20)) for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert store.vote_count("t") == 60


def test_bootstrap_intervals_are_at_the_labelled_level() -> None:
    """An even 20-20 record of A against B: a resample's A-wins are Binomial(40, 1/2) and A's θ rises with them, so
    the percentile interval's ends are the fits at the binomial quantiles: 95% (the leaderboard's label) at
    2.5% / 97.5% is 14 and 26 wins, 80% at 10% / 90% is 16 and 24 (each clear of a neighbour by >= 0.006 in
    probability, 5 standard errors at 20,000 resamples)."""
    votes = [Vote("A", "B", "left")] * 20 + [Vote("A", "B", "right")] * 20

    def theta(wins: int) -> float:
        return bradley_terry([Vote("A", "B", "left")] * wins + [Vote("A", "B", "right")] * (40 - wins))["A"]

    assert bootstrap_ci(votes, n=20_000)["A"] == pytest.approx((theta(14), theta(26)))
    assert bootstrap_ci(votes, n=20_000, confidence=0.8)["A"] == pytest.approx((theta(16), theta(24)))
    a = next(r for r in leaderboard(votes, n_boot=20_000) if r.name == "A")
    assert (a.low, a.high) == pytest.approx((ELO_BASE + ELO_PER_NAT * theta(14), ELO_BASE + ELO_PER_NAT * theta(26)))
