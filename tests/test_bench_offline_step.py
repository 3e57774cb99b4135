"""benchmarks/offline_step.py builds every offline recipe's algorithm on its env's spaces, and its hash is a pure
function of the steps taken (what makes it a check that a speed change changed no number)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_modules import load_benchmark
from pickaxe.algos.offline import split_minibatches


def test_every_case_builds_and_the_hash_repeats() -> None:
    bench = load_benchmark("offline_step")
    for case in bench.CASES:
        algo, batches = bench.build(case)
        assert batches[0].batch_size[0] == 8 * algo.config.batch_size
    assert bench.hash_case("bcq", 8) == bench.hash_case("bcq", 8) != bench.hash_case("bcq", 16)
    assert bench.time_case("bc-box-mse", 8, 1) > 0


def test_the_plain_pytorch_steps_compute_what_pickaxe_computes() -> None:
    """``--plain``'s loops are a timing reference only if they do the same work: from the same weights, on the same
    minibatches, their losses are pickaxe's and they reach pickaxe's weights after one iteration of 8 steps."""
    bench = load_benchmark("offline_step")
    for case in bench.PLAIN:
        algo, batches = bench.build(case)
        step, weights = bench.plain_step(case, algo)
        losses = [float(step(mb)) for mb in split_minibatches(batches[0], algo.config.batch_size)]
        metrics = bench.iteration(algo, batches[0])
        total = metrics["loss/td"] + metrics["loss/imitation"] if case == "bcq" else metrics["loss/policy"]
        assert abs(sum(losses) / len(losses) - total) < 1e-5 * max(1.0, abs(total)), case
        trained = list(algo.learned.parameters())
        assert len(trained) == len(weights)
        for mine, theirs in zip(trained, weights, strict=True):
            assert (mine.detach() - theirs.detach()).abs().max() < 1e-6, case
