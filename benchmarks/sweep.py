"""Sweep throughput: wall time of `pickaxe sweep cartpole-ppo` (2 values x 5 seeds) to the comparison table,
and the queue's overhead: the share of worker-slot time not spent inside training processes.

Usage: ``python benchmarks/sweep.py [--seeds 5] [--workers 2] [--steps 30000]``; the last line printed is
one JSON object. Target: overhead < 5%.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    """Run the sweep in a subprocess, exactly as a user would, and report its timing."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=30_000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp) / "sweep"
        cmd = [
            sys.executable, "-m", "pickaxe.cli", "sweep", "cartpole-ppo", "--algo.lr", "3e-3,3e-4",
            "--seeds", str(args.seeds), "--workers", str(args.workers), "--trainer.total-steps", str(args.steps),
            "--sweep-dir", str(sweep),
        ]  # fmt: skip
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        timing = json.loads((sweep / "sweep_timing.json").read_text())
        winner = json.loads((sweep / "compare" / "summary.json").read_text()).get("winner")
    slot_s = args.workers * timing["wall_s"]
    overhead = 1.0 - timing["job_s"] / slot_s
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print(f"runs: {timing['runs']} ({2} values x {args.seeds} seeds), workers: {args.workers}")
    print(f"wall time, command start to comparison table: {wall:.1f} s")
    print(f"wall time of the worker (queue + runs):         {timing['wall_s']:.1f} s")
    print(f"time inside training processes (sum):           {timing['job_s']:.1f} s")
    print(f"queue overhead (slot time outside processes):   {100 * overhead:.1f} %   (target < 5 %)")
    print(f"winner: {winner}")
    print(
        json.dumps(
            {
                "sweep_wall_s": round(wall, 2),
                "worker_wall_s": timing["wall_s"],
                "job_s": timing["job_s"],
                "queue_overhead_fraction": round(overhead, 4),
                "runs": timing["runs"],
                "winner": winner,
            }
        )
    )


if __name__ == "__main__":
    main()
