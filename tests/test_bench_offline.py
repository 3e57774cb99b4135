"""benchmarks/offline.py makes the very datasets the offline recipes make for themselves (recipes/datasets.py): per
env the same source recipe, source env steps and ``pickaxe collect`` options, so its measured figures are the
recipes' own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pickaxe.recipes import get_recipe
from pickaxe.recipes.datasets import DATASET_SOURCES

sys.path.insert(0, str(Path(__file__).parent))
from bench_modules import load_benchmark


def _flags(args: list[str]) -> dict[str, float]:
    """``["--episodes", "20", "--noise", "0.5"]`` -> ``{"episodes": 20.0, "noise": 0.5}``."""
    return {args[i].removeprefix("--"): float(args[i + 1]) for i in range(0, len(args), 2)}


@pytest.mark.parametrize("env", ["cartpole", "pendulum", "hopper", "halfcheetah"])
def test_benchmark_datasets_are_the_recipes(env: str) -> None:
    bench = load_benchmark("offline")
    spec = bench.ENVS[env]
    for algo in spec["algos"]:
        cfg = get_recipe(f"{env}-{algo}")
        source = DATASET_SOURCES[cfg.env.id]
        assert spec["source"] == source.recipe
        assert spec.get("source_steps") == cfg.data.source_steps
        assert set(spec["datasets"]) == set(source.kinds)
        for kind, args in spec["datasets"].items():
            assert _flags(args) == {k: float(v) for k, v in source.kinds[kind].items()}
