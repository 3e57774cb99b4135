"""Arena vote round trips under concurrent voters against a real ``pickaxe ui`` server on 127.0.0.1.

A runs folder with one arena (``--checkpoints`` checkpoints x ``--prompts`` prompts, responses of ~200 characters)
is served by uvicorn in a child process (``pickaxe.ui.app.serve``, the ``pickaxe ui`` code path). ``--voters``
threads each cast ``--votes`` votes as the arena page does: ask for a match, vote, reload the leaderboard. Each
request is timed from the client; afterwards every acknowledged vote must be in the SQLite file (and nothing else).

    python benchmarks/arena.py [--voters 20] [--votes 25] [--checkpoints 5] [--prompts 50] [--think S] [--no-board]

``--think S``: each voter waits 0.5-1.5 x S seconds between seeing a match and voting, as a person reading would
(default 0: every voter sends its next request at once, the worst case).

Prints a report and, as its last line, one JSON object: ``vote_ms_p50/p95`` (POST /api/arena/vote),
``match_ms_p50/p95``, ``leaderboard_ms_p50/p95``, ``round_trip_ms_p50/p95`` (match + vote + leaderboard),
``votes_per_s``, ``votes_acknowledged``, ``votes_stored``, ``votes_lost`` (must be 0), ``errors``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from pickaxe.eval.arena import ArenaStore


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prepare(root: Path, checkpoints: int, prompts: int) -> None:
    run = root / "run"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"kind": "llm", "recipe": "bench", "algo_name": "ppo"}))
    store = ArenaStore(run / "arena.sqlite")
    store.add_arena("bench", {"run": str(run)})
    rng = random.Random(0)
    rows = []
    for i in range(prompts):
        for c in range(checkpoints):
            text = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "<b>x</b>"]) for _ in range(35))
            rows.append((i, f"prompt {i}: say something", f"step {100 * (c + 1)}", text))
    store.add_responses("bench", rows)


def _serve(root: Path, port: int) -> subprocess.Popen[bytes]:
    code = (
        "import sys; from pickaxe.ui.app import serve; "
        f"serve({str(root)!r}, port={port}, queue_db={str(root / 'queue.db')!r})"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/arena/arenas", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the server did not start: {proc.stderr.read().decode() if proc.stderr else ''}")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(np.array(xs) * 1000, q)), 2) if xs else None


def main() -> None:
    """Run the benchmark and print the report and the JSON line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--voters", type=int, default=20)
    ap.add_argument("--votes", type=int, default=25, help="votes per voter")
    ap.add_argument("--checkpoints", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--think", type=float, default=0.0, help="mean seconds a voter reads before voting (0: none)")
    ap.add_argument("--no-board", action="store_true", help="skip the leaderboard reload after each vote")
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cpus)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _prepare(root, args.checkpoints, args.prompts)
        port = _free_port()
        proc = _serve(root, port)
        base = f"http://127.0.0.1:{port}"
        times: dict[str, list[float]] = {"match": [], "vote": [], "leaderboard": [], "round_trip": []}
        acked: list[str] = []
        errors: list[str] = []
        lock = threading.Lock()
        barrier = threading.Barrier(args.voters)

        def voter(k: int) -> None:
            rng = random.Random(k)
            name = f"voter-{k}"
            mine: dict[str, list[float]] = {key: [] for key in times}
            ok: list[str] = []
            with httpx.Client(base_url=base, timeout=60) as client:
                barrier.wait()
                for _ in range(args.votes):
                    try:
                        t0 = time.perf_counter()
                        m = client.post("/api/arena/match", json={"arena": "run:bench", "voter": name})
                        m.raise_for_status()
                        match_s = time.perf_counter() - t0
                        if args.think > 0:  # a person reading the two answers
                            time.sleep(rng.uniform(0.5, 1.5) * args.think)
                        choice = rng.choice(["left", "right", "tie", "both_bad"])
                        body = {"arena": "run:bench", "match": m.json()["match"], "voter": name, "choice": choice}
                        t1 = time.perf_counter()
                        v = client.post("/api/arena/vote", json=body)
                        v.raise_for_status()
                        if v.json()["stored"] is True:
                            ok.append(body["match"])
                        t2 = time.perf_counter()
                        if not args.no_board:
                            b = client.get("/api/arena/leaderboard", params={"arena": "run:bench"})
                            b.raise_for_status()
                        t3 = time.perf_counter()
                    except (httpx.HTTPError, KeyError, ValueError) as e:
                        with lock:
                            errors.append(f"{type(e).__name__}: {e}")
                        continue
                    mine["match"].append(match_s)
                    mine["vote"].append(t2 - t1)
                    if not args.no_board:
                        mine["leaderboard"].append(t3 - t2)
                    mine["round_trip"].append(match_s + t3 - t1)
            with lock:
                for key in times:
                    times[key].extend(mine[key])
                acked.extend(ok)

        threads = [threading.Thread(target=voter, args=(k,)) for k in range(args.voters)]
        cpu0 = _cpu_s(proc.pid)
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        server_cpu = _cpu_s(proc.pid) - cpu0
        proc.terminate()
        proc.wait(timeout=30)
        store = ArenaStore(root / "run" / "arena.sqlite")
        with sqlite3.connect(store.path) as db:
            stored_ids = {r[0] for r in db.execute("SELECT match_id FROM votes")}
        lost = len(set(acked) - stored_ids)
        result = {
            "voters": args.voters,
            "votes_per_voter": args.votes,
            "checkpoints": args.checkpoints,
            "prompts": args.prompts,
            "think_s": args.think,
            **{f"{key}_ms_p50": _pct(xs, 50) for key, xs in times.items()},
            **{f"{key}_ms_p95": _pct(xs, 95) for key, xs in times.items()},
            "votes_per_s": round(len(acked) / wall, 1),
            "votes_acknowledged": len(acked),
            "votes_stored": len(stored_ids),
            "votes_lost": lost,
            "unacknowledged_stored": len(stored_ids - set(acked)),
            "server_cpu_ms_per_vote": round(1000 * server_cpu / max(len(acked), 1), 2),
            "load_average": round(os.getloadavg()[0], 2),
            "errors": len(errors),
            "wall_s": round(wall, 2),
        }
    print(f"{args.voters} voters x {args.votes} votes against {base} ({args.checkpoints} checkpoints)")
    for key in times:
        if times[key]:
            print(f"  {key:12s} p50 {result[f'{key}_ms_p50']:8.2f} ms   p95 {result[f'{key}_ms_p95']:8.2f} ms")
    print(f"  server CPU per vote (match + vote + leaderboard): {result['server_cpu_ms_per_vote']} ms")
    print(f"  {result['votes_per_s']} votes/s; acknowledged {len(acked)}, stored {len(stored_ids)}, lost {lost}")
    if errors:
        print(f"  {len(errors)} errors, first: {errors[0]}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
