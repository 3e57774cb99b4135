"""benchmarks/rlhf.py's analysis: gold against KL read from run folders, matched-KL gains, best-of-n points."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "rlhf.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_rlhf", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(stage: Path, records: list[dict]) -> None:
    stage.mkdir(parents=True)
    (stage / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_matched_kl_gains_interpolate_within_each_run_and_never_extrapolate(tmp_path: Path) -> None:
    bench = _bench()
    for seed, start in ((0, 0.8), (1, 0.7)):
        root = tmp_path / f"seed-{seed}"
        _write(root / "ppo", [
            {"step": 0, "eval/kl": 0.0, "eval/sampled/gold": start, "eval/sampled/proxy": 0.0},
            {"step": 64, "loss/policy": 0.1},  # a training record: no evaluation
            {"step": 128, "eval/kl": 2.0, "eval/sampled/gold": start + 0.1, "eval/sampled/proxy": 1.0},
            {"step": 192, "eval/kl": 4.0, "eval/sampled/gold": start - 0.2, "eval/sampled/proxy": 3.0},
        ])  # fmt: skip
        _write(root / "bon", [
            {"step": 1, "eval/kl": 0.0, "eval/reward/gold": start, "eval/reward/proxy": 0.1},
            {"step": 4, "eval/kl": 0.64, "eval/reward/gold": start + 0.05, "eval/reward/proxy": 1.5},
        ])  # fmt: skip
    out = bench.summarize([tmp_path / "seed-0", tmp_path / "seed-1"], [1.0, 3.0, 8.0])
    ppo = out["ppo"]["matched_gold"]
    assert ppo["1.0"]["mean"] == pytest.approx(0.05) and ppo["1.0"]["runs"] == 2  # halfway to +0.1, both seeds
    assert ppo["3.0"]["mean"] == pytest.approx(-0.05)  # halfway between +0.1 and -0.2
    assert "8.0" not in ppo  # beyond the measured KL: not extrapolated
    assert out["ppo"]["peak_kl"] == [2.0, 2.0] and out["ppo"]["final_proxy"] == [3.0, 3.0]
    assert "1.0" not in out["bon"]["matched_gold"]  # best-of-n reached KL 0.64 only
    assert "rloo" not in out and "dpo" not in out  # stages that did not run are left out
