"""benchmarks/trl_pairs.py: the pickaxe side of a DPO and a reward-model measurement on tiny shapes, and the
one-JSON-line contract without TRL."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "trl_pairs.py"


def load_bench():
    """The benchmark script as a module."""
    spec = importlib.util.spec_from_file_location("bench_trl_pairs", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("part", ["dpo", "rm"])
def test_pickaxe_child_measures_each_step(tmp_path: Path, part: str) -> None:
    bench = load_bench()
    bench.save_model_folder(tmp_path / "model")
    spec = {"folder": str(tmp_path / "model"), "batch": 4, "lr": 1e-4, "beta": 0.1, "seed": 0, "steps": 2,
            "warmup": 1, "part": part}  # fmt: skip
    for lib in ("shared", "padded"):  # the child asserts the layout it asked for is the one in use
        out = bench.pickaxe_child({**spec, "lib": lib})
        assert len(out["rows"]["step"]) == 2 and all(t > 0 for t in out["rows"]["step"])
        assert out["peak"] > 0
    assert len(bench.preference_rows(spec)) == 12  # (warm-up + measured steps) x pairs a step


def test_without_trl_the_last_line_says_skipped() -> None:
    if importlib.util.find_spec("trl") is not None:
        pytest.skip("TRL is installed here")
    proc = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "benchmark": "trl_pairs",
        "skipped": "trl not installed",
    }
