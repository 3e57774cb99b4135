"""benchmarks/offline_step.py builds every offline recipe's algorithm on its env's spaces, and its hash is a pure
function of the steps taken (what makes it a check that a speed change changed no number)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_modules import load_benchmark


def test_every_case_builds_and_the_hash_repeats() -> None:
    bench = load_benchmark("offline_step")
    for case in bench.CASES:
        algo, batches = bench.build(case)
        assert batches[0].batch_size[0] == 8 * algo.config.batch_size
    assert bench.hash_case("bcq", 8) == bench.hash_case("bcq", 8) != bench.hash_case("bcq", 16)
    assert bench.time_case("bc-box-mse", 8, 1) > 0
