"""The blind human arena's statistics and storage (pure numpy + sqlite3, torch-free).

Statistics: a Bradley–Terry fit of pairwise votes, P(a beats b) = 1 / (1 + exp(θ_b − θ_a)), with a tie or a
"both bad" vote counted as half a win to each side; percentile bootstrap 95% CIs by resampling votes; the ranked
:func:`leaderboard`; and :func:`votes_to_separate`, how many more head-to-head votes would separate the top two.

Scales: :func:`bradley_terry` and :func:`bootstrap_ci` return θ in natural-log odds units, centred to mean 0.
:func:`leaderboard` reports the same fit on the familiar Elo-like scale, ``ELO_BASE + ELO_PER_NAT * θ``
(400 points = 10:1 odds; the mean checkpoint is at 1000).

Storage: :class:`ArenaStore`, one SQLite file (WAL) holding the responses generated ahead of time, the matches
issued to voters (a prompt, two different checkpoints in random order; a voter only ever sees the match id and
the two texts) and the votes (match, voter, choice, time).
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "CHOICES",
    "ELO_BASE",
    "ELO_PER_NAT",
    "ArenaError",
    "ArenaStore",
    "ArenaSummary",
    "Match",
    "Rating",
    "Separation",
    "Vote",
    "bootstrap_ci",
    "bradley_terry",
    "leaderboard",
    "read_arenas",
    "separation",
    "votes_to_separate",
]

CHOICES = ("left", "right", "tie", "both_bad")
"""A voter's choices: the left response is better, the right one is, they are as good, both are bad."""
ELO_BASE = 1000.0
ELO_PER_NAT = 400.0 / math.log(10.0)
"""Elo points per unit of θ (natural-log odds): 400 points = odds of 10:1."""
DEFAULT_PRIOR = 0.01
"""L2 penalty λ on θ (a N(0, 1/λ) prior, sd 10 nats): negligible next to a handful of votes, but a checkpoint that
won (or lost) every vote gets a finite strength instead of ±infinity."""


class Vote(NamedTuple):
    """One vote: the checkpoint labels shown left and right, and the ``choice`` (one of :data:`CHOICES`)."""

    left: str
    right: str
    choice: str


@dataclass(frozen=True)
class Rating:
    """A checkpoint on the leaderboard: Bradley–Terry ``score`` on the Elo-like scale with its 95% bootstrap CI
    (``low``, ``high``; equal to the score when there are no votes), and its vote counts (``ties`` counts both
    ``tie`` and ``both_bad``)."""

    name: str
    score: float
    low: float
    high: float
    wins: int
    losses: int
    ties: int
    votes: int


@dataclass(frozen=True)
class Separation:
    """The top two of a leaderboard and how many more votes between them would separate them."""

    a: str
    b: str
    p: float
    """Fitted probability that ``a`` beats ``b``."""
    votes: int
    """Votes between ``a`` and ``b`` so far."""
    more_votes: int | None
    """Further head-to-head votes needed (0: already separated; None: the fit sees them as equal)."""


def _outcomes(votes: Iterable[Vote | Sequence[str]]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Players (sorted) and per vote the left and right player index and the left side's score (1, 0 or 0.5)."""
    rows = [Vote(*v) for v in votes]
    for v in rows:
        if v.choice not in CHOICES:
            raise ValueError(f"vote choice must be one of {', '.join(CHOICES)}, got {v.choice!r}")
        if v.left == v.right:
            raise ValueError(f"a vote compares two different checkpoints, got {v.left!r} twice")
    players = sorted({v.left for v in rows} | {v.right for v in rows})
    index = {p: i for i, p in enumerate(players)}
    left = np.array([index[v.left] for v in rows], dtype=np.int64)
    right = np.array([index[v.right] for v in rows], dtype=np.int64)
    score = np.array([{"left": 1.0, "right": 0.0}.get(v.choice, 0.5) for v in rows], dtype=np.float64)
    return players, left, right, score


def _win_matrices(k: int, left: np.ndarray, right: np.ndarray, score: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``W[b, i, j]``: the (half-)wins of i over j in weighting ``b`` of the votes (weights has shape (B, votes))."""
    m = len(left)
    spread = np.zeros((m, k * k))  # vote -> its contribution to the flattened win matrix
    rows = np.arange(m)
    spread[rows, left * k + right] += score
    spread[rows, right * k + left] += 1.0 - score
    return (weights @ spread).reshape(weights.shape[0], k, k)


def _fit(W: np.ndarray, prior: float, tol: float = 1e-10, max_iter: int = 200) -> np.ndarray:
    """Maximise sum_ij W_ij log σ(θ_i − θ_j) − prior/2 |θ|² for each of a stack of win matrices (B, k, k) by
    Newton's method; steps are clipped to 1 nat per coordinate so a lopsided start cannot overshoot, and the
    objective is concave, so the iteration converges. Returns θ (B, k), centred."""
    B, k, _ = W.shape
    N = W + W.transpose(0, 2, 1)
    theta = np.zeros((B, k))
    eye = np.eye(k)
    ridge = max(prior, 1e-9)  # prior 0: the all-equal direction is free; the tiny ridge only fixes it at mean 0
    for _ in range(max_iter):
        d = theta[:, :, None] - theta[:, None, :]
        p = 1.0 / (1.0 + np.exp(-d))
        grad = (W - N * p).sum(-1) - prior * theta
        c = N * p * (1.0 - p)
        H = c - eye * (c.sum(-1)[:, :, None] + ridge)
        step = np.linalg.solve(H, grad[:, :, None])[:, :, 0]
        step = np.clip(step, -1.0, 1.0)
        theta = theta - step
        if np.abs(step).max() < tol:
            break
    return theta - theta.mean(-1, keepdims=True)


def bradley_terry(votes: Iterable[Vote | Sequence[str]], prior: float = DEFAULT_PRIOR) -> dict[str, float]:
    """The Bradley–Terry strengths of the checkpoints in ``votes`` (``(left, right, choice)`` triples), maximum
    a posteriori under an L2 penalty ``prior`` (see :data:`DEFAULT_PRIOR`; 0 gives the plain MLE, which is finite
    only when every checkpoint has won and lost at least half a vote against a connected field).

    θ is in natural-log odds units, centred to mean 0: P(a beats b) = 1 / (1 + exp(θ_b − θ_a)). A ``tie`` or
    ``both_bad`` vote is half a win to each side."""
    if prior < 0:
        raise ValueError(f"prior must be >= 0, got {prior}")
    players, left, right, score = _outcomes(votes)
    if not players:
        return {}
    theta = _fit(_win_matrices(len(players), left, right, score, np.ones((1, len(left)))), prior)[0]
    return {p: float(t) for p, t in zip(players, theta, strict=True)}


def _bootstrap_thetas(
    players: list[str], left: np.ndarray, right: np.ndarray, score: np.ndarray, n: int, seed: int, prior: float
) -> np.ndarray:
    """θ (n, players) fitted to ``n`` resamples of the votes, each as many votes drawn with replacement. A resample
    is kept as counts over the distinct (left, right, outcome) cells, so the fits cost the same at any vote count."""
    rng = np.random.default_rng(seed)
    cells, cell_of = np.unique(np.stack([left, right, score]), axis=1, return_inverse=True)
    cell_of = cell_of.ravel()
    cl, cr, cs = cells[0].astype(np.int64), cells[1].astype(np.int64), cells[2]
    c, m = cells.shape[1], len(left)
    out = []
    chunk = max(1, min(n, 2_000_000 // max(m, 1)))  # at most ~2M drawn votes (16 MB) at once
    for start in range(0, n, chunk):
        b = min(chunk, n - start)
        drawn = cell_of[rng.integers(0, m, size=(b, m))]
        weights = np.bincount((drawn + c * np.arange(b)[:, None]).ravel(), minlength=b * c).reshape(b, c)
        out.append(_fit(_win_matrices(len(players), cl, cr, cs, weights.astype(np.float64)), prior))
    return np.concatenate(out)


def bootstrap_ci(
    votes: Iterable[Vote | Sequence[str]],
    n: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    prior: float = DEFAULT_PRIOR,
) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap CIs of each checkpoint's Bradley–Terry θ (the scale of :func:`bradley_terry`): the
    votes are resampled with replacement ``n`` times, each resample is fitted, and the ``(1 − confidence)/2`` and
    ``(1 + confidence)/2`` quantiles are reported. The same ``seed`` gives the same intervals."""
    if n < 1:
        raise ValueError(f"bootstrap resamples n must be >= 1, got {n}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    players, left, right, score = _outcomes(votes)
    if not players:
        return {}
    thetas = _bootstrap_thetas(players, left, right, score, n, seed, prior)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(thetas, [alpha, 1.0 - alpha], axis=0)
    return {p: (float(lo), float(hi)) for p, lo, hi in zip(players, low, high, strict=True)}


def _elo(theta: float) -> float:
    return ELO_BASE + ELO_PER_NAT * theta


def leaderboard(
    votes: Iterable[Vote | Sequence[str]],
    players: Iterable[str] = (),
    n_boot: int = 1000,
    seed: int = 0,
    prior: float = DEFAULT_PRIOR,
) -> list[Rating]:
    """The checkpoints ranked by Bradley–Terry score (Elo-like scale, see the module docstring) with 95% bootstrap
    CIs and their win/loss/tie counts, best first (ties of score: by name). ``players`` adds checkpoints that have
    no votes yet (score 1000, CI a point)."""
    rows = [Vote(*v) for v in votes]
    theta = bradley_terry(rows, prior)
    ci = bootstrap_ci(rows, n_boot, seed, prior=prior) if rows else {}
    counts: dict[str, list[int]] = {p: [0, 0, 0] for p in [*theta, *players]}
    for v in rows:
        if v.choice == "left":
            counts[v.left][0] += 1
            counts[v.right][1] += 1
        elif v.choice == "right":
            counts[v.right][0] += 1
            counts[v.left][1] += 1
        else:
            counts[v.left][2] += 1
            counts[v.right][2] += 1
    out = []
    for name, (w, lo, t) in counts.items():
        th = theta.get(name, 0.0)
        low, high = ci.get(name, (th, th))
        out.append(Rating(name, _elo(th), _elo(low), _elo(high), w, lo, t, w + lo + t))
    return sorted(out, key=lambda r: (-r.score, r.name))


def votes_to_separate(
    votes: Iterable[Vote | Sequence[str]], a: str, b: str, confidence: float = 0.95, prior: float = DEFAULT_PRIOR
) -> int | None:
    """How many more votes between ``a`` and ``b`` would make the CI of their strength difference exclude 0,
    estimated from the current fit.

    With p = P(a beats b) from the Bradley–Terry fit and d = logit(p) = θ_a − θ_b, n head-to-head votes estimate d
    with standard error ≈ 1 / sqrt(n p (1 − p)) (the binomial log-odds, delta method), so the two separate once
    |d| ≥ z · SE, i.e. n* = z² / (p (1 − p) d²) with z the normal quantile of ``confidence`` (1.96 for 95%).
    Returns max(0, ceil(n* − n)) with n the votes between them so far; None when the fit sees them as equal
    (d = 0: no number of votes separates them) or either has no votes."""
    rows = [Vote(*v) for v in votes]
    theta = bradley_terry(rows, prior)
    if a not in theta or b not in theta:
        return None
    return _more_votes(theta[a] - theta[b], _head_to_head(rows, a, b), confidence)


def _head_to_head(rows: Sequence[Vote], a: str, b: str) -> int:
    return sum(1 for v in rows if {v.left, v.right} == {a, b})


def _z(confidence: float) -> float:
    """The two-sided normal quantile of ``confidence`` (bisection on erf: numpy has no inverse)."""
    lo, hi = 0.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if math.erf(mid / math.sqrt(2)) < confidence:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _more_votes(d: float, n: int, confidence: float) -> int | None:
    if abs(d) < 1e-9:
        return None
    p = 1.0 / (1.0 + math.exp(-d))
    needed = _z(confidence) ** 2 / (p * (1.0 - p) * d * d)
    return max(0, math.ceil(needed - n))


def separation(
    votes: Iterable[Vote | Sequence[str]], ratings: Sequence[Rating], confidence: float = 0.95
) -> Separation | None:
    """:func:`votes_to_separate` for the top two of ``ratings`` (a :func:`leaderboard`), or None with fewer than
    two rated checkpoints."""
    if len(ratings) < 2:
        return None
    a, b = ratings[0], ratings[1]
    rows = [Vote(*v) for v in votes]
    d = (a.score - b.score) / ELO_PER_NAT
    more = _more_votes(d, _head_to_head(rows, a.name, b.name), confidence) if a.votes and b.votes else None
    return Separation(a.name, b.name, 1.0 / (1.0 + math.exp(-d)), _head_to_head(rows, a.name, b.name), more)


# ---------------------------------------------------------------------------------------------- storage


class ArenaError(ValueError):
    """A request the arena refuses (one line); ``status`` is the HTTP status the web app answers it with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Match:
    """What a voter sees: an unguessable match id, the prompt and the two responses (checkpoints hidden)."""

    id: str
    arena: str
    prompt: str
    left: str
    right: str


_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS arenas (
        name TEXT PRIMARY KEY,
        created REAL NOT NULL,
        source TEXT NOT NULL DEFAULT '{}'
    )""",
    """CREATE TABLE IF NOT EXISTS responses (
        arena TEXT NOT NULL REFERENCES arenas(name),
        prompt_id INTEGER NOT NULL,
        prompt TEXT NOT NULL,
        label TEXT NOT NULL,
        response TEXT NOT NULL,
        PRIMARY KEY (arena, prompt_id, label)
    )""",
    """CREATE TABLE IF NOT EXISTS matches (
        id TEXT PRIMARY KEY,
        arena TEXT NOT NULL,
        prompt_id INTEGER NOT NULL,
        left_label TEXT NOT NULL,
        right_label TEXT NOT NULL,
        voter TEXT NOT NULL,
        issued REAL NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS votes (
        match_id TEXT PRIMARY KEY REFERENCES matches(id),
        voter TEXT NOT NULL,
        choice TEXT NOT NULL CHECK (choice IN ('left', 'right', 'tie', 'both_bad')),
        time REAL NOT NULL
    )""",
]
MAX_VOTER_CHARS = 64
BUSY_TIMEOUT_S = 30.0


class ArenaSummary(NamedTuple):
    """One arena of a file as a listing shows it: its name and how many checkpoints, prompts and votes it has, and
    how many of its (prompt, pair of checkpoints) hold two identical answers (never issued as matches) of all
    ``pairs``."""

    name: str
    checkpoints: int
    prompts: int
    votes: int
    identical: int = 0
    pairs: int = 0


def _pair_counts(db: sqlite3.Connection, arena: str) -> tuple[int, int]:
    """``(identical, pairs)`` of :meth:`ArenaStore.identical_pairs`, on an open connection."""
    row = db.execute(
        "SELECT COUNT(*), COALESCE(SUM(a.response = b.response), 0) FROM responses a JOIN responses b "
        "ON a.arena = b.arena AND a.prompt_id = b.prompt_id AND a.label < b.label WHERE a.arena = ?",
        (arena,),
    ).fetchone()
    return int(row[1]), int(row[0])


def read_arenas(path: str | Path) -> list[ArenaSummary]:
    """The arenas in the arena file at ``path``, read without creating or changing any file.

    SQLite opens a WAL file read-only by creating its ``-wal`` and ``-shm`` files when they are missing; so a file
    without a ``-wal`` (no writer has it open and every vote is in the file itself) is read as ``immutable``, and
    one with both (a writer has it open) is read through them, read-only. Raises :class:`ArenaError` (one line,
    status 409) for a damaged file or one that is not an arena file."""
    path = Path(path)
    wal, shm = (path.with_name(path.name + suffix) for suffix in ("-wal", "-shm"))
    mode = "mode=ro" if wal.exists() and shm.exists() else "immutable=1"
    try:
        db = sqlite3.connect(f"{path.absolute().as_uri()}?{mode}", uri=True, timeout=BUSY_TIMEOUT_S)
        try:
            names = [r[0] for r in db.execute("SELECT name FROM arenas ORDER BY name")]
            labels = dict(db.execute("SELECT arena, COUNT(DISTINCT label) FROM responses GROUP BY arena").fetchall())
            prompts = dict(
                db.execute("SELECT arena, COUNT(DISTINCT prompt_id) FROM responses GROUP BY arena").fetchall()
            )
            votes = dict(
                db.execute(
                    "SELECT m.arena, COUNT(*) FROM votes v JOIN matches m ON m.id = v.match_id GROUP BY m.arena"
                ).fetchall()
            )
            pairs = {n: _pair_counts(db, n) for n in names}
        finally:
            db.close()
    except sqlite3.DatabaseError as e:  # not a database, a damaged one, or one without the arena tables
        raise ArenaError(
            f"{path} is not a readable arena file ({e}); prepare it again with `pickaxe arena`", 409
        ) from None
    return [
        ArenaSummary(n, int(labels.get(n, 0)), int(prompts.get(n, 0)), int(votes.get(n, 0)), *pairs[n]) for n in names
    ]


def label_order(label: str) -> tuple[int, int, str]:
    """Sort key of checkpoint labels: ``step N`` by N, then the words (``final``, ``latest``) by name."""
    digits = label.removeprefix("step ")
    return (0, int(digits), "") if digits.isdigit() else (1, 0, label)


def check_voter(voter: Any) -> str:
    """``voter`` as stored: a non-empty string of at most :data:`MAX_VOTER_CHARS` printable characters."""
    if not isinstance(voter, str) or not voter.strip():
        raise ArenaError("voter must be a non-empty string (the page keeps a random id in localStorage)")
    if len(voter) > MAX_VOTER_CHARS or not voter.isprintable():
        raise ArenaError(f"voter must be at most {MAX_VOTER_CHARS} printable characters")
    return voter.strip()


class ArenaStore:
    """The arena's SQLite file at ``path`` (created with its tables when missing).

    Safe with several writer threads and processes: WAL journal (readers never block the writer), a connection
    per operation with a 30 s busy timeout, and every write one short ``BEGIN IMMEDIATE`` transaction, so the
    check of a match and the vote that depends on it cannot interleave with another writer. Votes are committed with
    ``synchronous=FULL``: a vote that was answered "stored" survives a power cut (issued matches are not fsynced:
    losing one costs nothing).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write_lock = threading.Lock()
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            with self._write(db):
                for statement in _SCHEMA:
                    db.execute(statement)
        # held open for the store's life: when the last connection to a WAL file closes, SQLite checkpoints and
        # removes the WAL (an fsync per operation here); with this one open, only the automatic checkpoints run
        self._keeper = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
        self._keeper.execute("PRAGMA schema_version").fetchone()  # a read opens the WAL; the connection now holds it

    @contextlib.contextmanager
    def _connect(self, durable: bool = True) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            yield db
        finally:
            db.close()

    @contextlib.contextmanager
    def _write(self, db: sqlite3.Connection) -> Iterator[None]:
        # threads of this process queue on a lock (woken at once) rather than on SQLite's busy handler, which
        # sleeps in growing steps; other processes still meet the busy timeout
        with self._write_lock:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def close(self) -> None:
        """Close the store's held connection (operations open their own; the store stays usable)."""
        self._keeper.close()

    def journal_mode(self) -> str:
        """The file's journal mode (``wal``)."""
        with self._connect() as db:
            return str(db.execute("PRAGMA journal_mode").fetchone()[0])

    # ---- responses
    def add_arena(self, name: str, source: Mapping[str, Any] | None = None) -> None:
        """Create arena ``name`` (or update its ``source``: where its responses came from, e.g. run and settings)."""
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise ArenaError("an arena name is a non-empty string of at most 200 characters")
        with self._connect() as db, self._write(db):
            db.execute(
                "INSERT INTO arenas (name, created, source) VALUES (?, ?, ?) "
                "ON CONFLICT(name) DO UPDATE SET source = excluded.source",
                (name, time.time(), json.dumps(dict(source or {}), sort_keys=True, default=str)),
            )

    def add_responses(self, arena: str, rows: Iterable[tuple[int, str, str, str]]) -> int:
        """Store ``(prompt_id, prompt, label, response)`` rows of ``arena`` (replacing a row of the same prompt id
        and checkpoint label); returns how many."""
        rows = [(arena, int(i), str(p), str(lab), str(r)) for i, p, lab, r in rows]
        with self._connect() as db, self._write(db):
            if db.execute("SELECT 1 FROM arenas WHERE name = ?", (arena,)).fetchone() is None:
                raise ArenaError(f"no arena named {arena!r}; create it with add_arena first", 404)
            db.executemany(
                "INSERT OR REPLACE INTO responses (arena, prompt_id, prompt, label, response) VALUES (?, ?, ?, ?, ?)",
                rows,
            )
        return len(rows)

    def has_response(self, arena: str, prompt_id: int, label: str) -> bool:
        """Whether the response of checkpoint ``label`` to prompt ``prompt_id`` is stored."""
        with self._connect() as db:
            row = db.execute(
                "SELECT 1 FROM responses WHERE arena = ? AND prompt_id = ? AND label = ?", (arena, prompt_id, label)
            ).fetchone()
        return row is not None

    def arenas(self) -> list[str]:
        """The arena names in this file."""
        with self._connect() as db:
            return [r[0] for r in db.execute("SELECT name FROM arenas ORDER BY name")]

    def source(self, arena: str) -> dict[str, Any]:
        """The ``source`` record of ``arena`` ({} when unknown)."""
        with self._connect() as db:
            row = db.execute("SELECT source FROM arenas WHERE name = ?", (arena,)).fetchone()
        return json.loads(row[0]) if row else {}

    def labels(self, arena: str) -> list[str]:
        """The checkpoint labels with responses in ``arena``."""
        with self._connect() as db:
            rows = db.execute("SELECT DISTINCT label FROM responses WHERE arena = ?", (arena,)).fetchall()
        return sorted((r[0] for r in rows), key=label_order)

    def prompts(self, arena: str) -> dict[int, str]:
        """The prompts of ``arena`` by prompt id."""
        with self._connect() as db:
            rows = db.execute("SELECT DISTINCT prompt_id, prompt FROM responses WHERE arena = ?", (arena,)).fetchall()
        return {int(i): p for i, p in rows}

    def prompt_count(self, arena: str) -> int:
        """How many prompts ``arena`` has responses for."""
        with self._connect() as db:
            return int(
                db.execute("SELECT COUNT(DISTINCT prompt_id) FROM responses WHERE arena = ?", (arena,)).fetchone()[0]
            )

    # ---- matches and votes
    def issue_match(self, arena: str, voter: str) -> Match:
        """A new match of ``arena`` for ``voter``: a random prompt on which at least two checkpoints answered
        differently, a random pair of its checkpoints whose answers differ, in random left/right order. Two identical
        answers are never a match (a voter could only guess; :meth:`identical_pairs` counts what is skipped). Raises
        :class:`ArenaError` when the arena is unknown or has no such prompt."""
        voter = check_voter(voter)
        rng = secrets.SystemRandom()
        with self._connect(durable=False) as db:  # an issued match lost to a power cut is simply never voted on
            rows = db.execute(
                "SELECT prompt_id, label, response FROM responses WHERE arena = ? ORDER BY prompt_id, label", (arena,)
            ).fetchall()
            by_prompt: dict[int, list[tuple[str, str]]] = {}
            for pid, label, response in rows:
                by_prompt.setdefault(pid, []).append((label, response))
            playable = [pid for pid, answers in by_prompt.items() if len({r for _, r in answers}) >= 2]
            if not playable:
                known = db.execute("SELECT 1 FROM arenas WHERE name = ?", (arena,)).fetchone()
                if known is None:
                    raise ArenaError(f"no arena named {arena!r}", 404)
                if any(len(answers) >= 2 for answers in by_prompt.values()):
                    raise ArenaError(
                        f"arena {arena!r} has no prompt on which two checkpoints answered differently: every pair "
                        "of answers is identical, so there is nothing to vote on",
                        409,
                    )
                raise ArenaError(
                    f"arena {arena!r} has no prompt answered by two checkpoints; prepare it with `pickaxe arena`", 409
                )
            pid = rng.choice(playable)
            answers = by_prompt[pid]
            pairs = [(a, b) for i, (a, ra) in enumerate(answers) for b, rb in answers[i + 1 :] if ra != rb]
            left, right = rng.choice(pairs)
            if rng.random() < 0.5:
                left, right = right, left
            match_id = secrets.token_urlsafe(12)
            with self._write(db):
                db.execute(
                    "INSERT INTO matches (id, arena, prompt_id, left_label, right_label, voter, issued) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (match_id, arena, pid, left, right, voter, time.time()),
                )
            texts = dict(
                db.execute(
                    "SELECT label, response FROM responses WHERE arena = ? AND prompt_id = ? AND label IN (?, ?)",
                    (arena, pid, left, right),
                ).fetchall()
            )
            prompt = db.execute(
                "SELECT prompt FROM responses WHERE arena = ? AND prompt_id = ? LIMIT 1", (arena, pid)
            ).fetchone()[0]
        return Match(match_id, arena, prompt, texts[left], texts[right])

    def identical_pairs(self, arena: str) -> tuple[int, int]:
        """``(identical, pairs)``: how many of ``arena``'s (prompt, pair of checkpoints) have the same answer twice
        (never issued as a match) out of all of them."""
        with self._connect() as db:
            return _pair_counts(db, arena)

    def record_vote(self, match_id: Any, voter: Any, choice: Any, arena: str | None = None) -> bool:
        """Record ``voter``'s ``choice`` on match ``match_id``; True when stored, False when this exact vote was
        already stored (repeating a request is harmless). Raises :class:`ArenaError` (one line, nothing stored) for
        a choice not in :data:`CHOICES`, an unknown match, a match issued to another voter, a match of another
        arena than ``arena`` (when given: the arena the voter named), or a match that already has a different
        vote."""
        if not isinstance(choice, str) or choice not in CHOICES:
            raise ArenaError(f"choice must be one of {', '.join(CHOICES)}, got {choice!r}", 422)
        if not isinstance(match_id, str) or not match_id or len(match_id) > 100:
            raise ArenaError("match must be the id string /api/arena/match returned", 422)
        voter = check_voter(voter)
        with self._connect() as db, self._write(db):
            row = db.execute("SELECT voter, arena FROM matches WHERE id = ?", (match_id,)).fetchone()
            if row is None:
                raise ArenaError(f"unknown match {match_id!r}; ask for a new match", 404)
            if row[0] != voter:
                raise ArenaError("this match was issued to another voter; ask for a new match", 403)
            if arena is not None and row[1] != arena:
                raise ArenaError(
                    f"match {match_id!r} belongs to arena {row[1]!r}, not {arena!r}; vote in the arena it came from",
                    409,
                )
            done = db.execute("SELECT voter, choice FROM votes WHERE match_id = ?", (match_id,)).fetchone()
            if done is not None:
                if done[1] == choice:
                    return False
                raise ArenaError(f"match {match_id!r} already has a vote ({done[1]}); ask for a new match", 409)
            db.execute(
                "INSERT INTO votes (match_id, voter, choice, time) VALUES (?, ?, ?, ?)",
                (match_id, voter, choice, time.time()),
            )
        return True

    def votes(self, arena: str) -> list[Vote]:
        """Every vote of ``arena`` as ``(left label, right label, choice)``, oldest first."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT m.left_label, m.right_label, v.choice FROM votes v JOIN matches m ON m.id = v.match_id "
                "WHERE m.arena = ? ORDER BY v.time, v.rowid",
                (arena,),
            ).fetchall()
        return [Vote(*r) for r in rows]

    def vote_count(self, arena: str | None = None) -> int:
        """How many votes ``arena`` (None: every arena) holds."""
        with self._connect() as db:
            if arena is None:
                return int(db.execute("SELECT COUNT(*) FROM votes").fetchone()[0])
            return int(
                db.execute(
                    "SELECT COUNT(*) FROM votes v JOIN matches m ON m.id = v.match_id WHERE m.arena = ?", (arena,)
                ).fetchone()[0]
            )

    def leaderboard(self, arena: str, n_boot: int = 1000, seed: int = 0) -> list[Rating]:
        """:func:`leaderboard` of ``arena``'s votes, listing every checkpoint with responses."""
        return self.leaderboard_of(arena, self.votes(arena), n_boot, seed)

    def leaderboard_of(self, arena: str, votes: Sequence[Vote], n_boot: int = 1000, seed: int = 0) -> list[Rating]:
        """:func:`leaderboard` of ``votes`` (read from ``arena`` before), listing every checkpoint with responses."""
        return leaderboard(votes, self.labels(arena), n_boot, seed)
