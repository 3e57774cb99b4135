"""The Tianshou side-by-side benchmarks (benchmarks/tianshou_offline.py, tianshou_online.py, tianshou_her.py) run
end to end at a minimal budget and end with their JSON line; skipped where Tianshou is not installed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from bench_modules import BENCH, load_benchmark


def _last_json(out: str) -> dict[str, Any]:
    return json.loads(out.strip().splitlines()[-1])


def test_offline_bcq_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Discrete BCQ on a CartPole medium dataset, 5 gradient steps a side: every figure present for both."""
    pytest.importorskip("tianshou")
    monkeypatch.syspath_prepend(str(BENCH))
    bench = load_benchmark("tianshou_offline")
    monkeypatch.setattr(sys, "argv", ["tianshou_offline.py"])
    bench.cli(["--out", str(tmp_path), "--algos", "bcq", "--seeds", "1", "--steps", "5", "--source-steps", "1024"])
    result = _last_json(capsys.readouterr().out)
    assert result["steps"] == 5 and result["dataset"] == "medium"
    bcq = result["algos"]["bcq"]
    assert bcq["seeds"] == 1 and min(bcq[k] for k in ("wall_ratio", "cpu_ratio", "train_ratio", "train_cpu_ratio")) > 0
    for run in result["runs"]:  # the gradient steps alone: part of the whole run, which also evaluates
        if run["lib"] != "plain":
            assert 0 < run["train_s"] < run["wall_s"] and 0 < run["train_cpu_s"] < run["cpu_s"]
    assert [r["lib"] for r in result["runs"]] == ["pickaxe", "tianshou", "plain"]
    # the same steps as plain PyTorch: timed, and set against both libraries' training CPU
    assert result["runs"][2]["train_cpu_s"] > 0 and bcq["plain"]["train_cpu_s"]["median"] > 0
    assert bcq["pickaxe_over_plain"] > 0 and bcq["plain_over_tianshou"] > 0
    for lib in ("pickaxe", "tianshou"):
        assert 0 < bcq[lib]["eval_return"]["median"] <= 500
        assert bcq[lib]["score"]["median"] is not None


def test_offline_from_logs_summarises_earlier_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--from-logs reads the runs two earlier logs printed and summarises them without training: the mean's CI
    holds the mean, a library whose every seed outscores the other's has P(improvement) 1."""
    monkeypatch.syspath_prepend(str(BENCH))
    bench = load_benchmark("tianshou_offline")
    logs = []
    for part, (algo, base) in enumerate((("bc", 0.0), ("cql", 50.0))):
        lines = ["load average 0.10, tianshou 2.0.1"]
        for seed in range(5):
            for lib, score in (("pickaxe", base + 40 + seed), ("tianshou", base + 10 + seed)):
                run = {"algo": algo, "lib": lib, "seed": seed, "eval_return": -200.0, "wall_s": 2.0, "cpu_s": 2.0,
                       "train_s": 1.0, "train_cpu_s": 1.0 if lib == "pickaxe" else 2.0, "score": score}  # fmt: skip
                if algo == "cql":  # Tianshou's policy also on pickaxe's episodes: 5 points above its own, per seed
                    run["common_score"] = score if lib == "pickaxe" else score + 5.0
                lines.append(json.dumps(run))
            if algo == "bc":  # the same steps as plain PyTorch: 0.8 s
                lines.append(json.dumps({"algo": algo, "lib": "plain", "seed": seed, "train_cpu_s": 0.8}))
        log = tmp_path / f"run{part}.log"
        log.write_text("\n".join(lines) + "\n")
        logs.append(str(log))
    bench.cli(["--from-logs", *logs])
    result = _last_json(capsys.readouterr().out)
    assert set(result["algos"]) == {"bc", "cql"} and len(result["runs"]) == 25
    bc = result["algos"]["bc"]
    assert bc["pickaxe_over_plain"] == pytest.approx(1.25) and bc["plain_over_tianshou"] == pytest.approx(0.4)
    assert "plain" not in result["algos"]["cql"]
    cql = result["algos"]["cql"]
    ci = cql["pickaxe"]["score_ci"]
    assert ci["mean"] == pytest.approx(92.0) and ci["mean_low"] <= 92.0 <= ci["mean_high"]
    assert cql["p_improvement"] == {"value": 1.0, "low": 1.0, "high": 1.0}
    assert cql["train_cpu_ratio"] == pytest.approx(0.5) and cql["seeds"] == 5
    # scored on the same episodes, the difference is paired seed by seed: 30 - 5 on every seed, so its CI is a point
    same = cql["same_episodes"]
    assert same["difference"] == {"mean": pytest.approx(25.0), "low": pytest.approx(25.0), "high": pytest.approx(25.0)}
    assert same["tianshou"]["mean"] == pytest.approx(67.0) and "same_episodes" not in result["algos"]["bc"]
    (tmp_path / "empty.log").write_text("load average 0.10\n")
    with pytest.raises(SystemExit, match="no runs found"):
        bench.cli(["--from-logs", str(tmp_path / "empty.log")])
    with pytest.raises(SystemExit, match="no such log"):
        bench.cli(["--from-logs", str(tmp_path / "missing.log")])


def test_online_npg_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """NPG on CartPole at a 1,024-step budget a side: both runs recorded, unsolved seeds as null."""
    pytest.importorskip("tianshou")
    bench = load_benchmark("tianshou_online")
    bench.cli(["--out", str(tmp_path), "--algos", "npg", "--seeds", "1", "--budget", "npg=1024"])
    result = _last_json(capsys.readouterr().out)
    npg = result["algos"]["npg"]
    assert npg["budget"] == 1024 and npg["settings_tianshou"]["trust_region_size"] == 0.5
    for lib in ("pickaxe", "tianshou"):
        assert npg[lib]["solved"] in (0, 1)
        assert len(npg[lib]["steps"]) == 1 and npg[lib]["best_return"][0] > 0
    runs = {r["lib"]: r for r in result["runs"]}
    assert runs["tianshou"]["trained_steps"] >= 1024 and runs["pickaxe"]["trained_steps"] == 1024


def test_online_also_target_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """IQN at a 1,024-step budget with --also-target iqn=5 (any CartPole episode lasts 8+ steps): both libraries
    report env steps to 5 from the same run, within the budget, while the 475 target stays unreached."""
    pytest.importorskip("tianshou")
    bench = load_benchmark("tianshou_online")
    bench.cli(
        ["--out", str(tmp_path), "--algos", "iqn", "--seeds", "1", "--budget", "iqn=1024", "--also-target", "iqn=5"]
    )
    out = capsys.readouterr().out
    result = _last_json(out)
    iqn = result["algos"]["iqn"]
    assert iqn["also_target"] == 5.0 and "| iqn to 5 |" in out
    runs = {r["lib"]: r for r in result["runs"]}
    for lib in ("pickaxe", "tianshou"):
        assert iqn[lib]["solved"] == 0 and iqn[lib]["steps"] == [None]
        (steps,) = iqn[lib]["steps_also"]
        assert steps is not None and 0 <= steps <= runs[lib]["trained_steps"]


def test_online_also_target_rejects_unknown_algo(tmp_path: Path) -> None:
    """--also-target names an algorithm of the script and a number; anything else stops with a fix."""
    pytest.importorskip("tianshou")
    bench = load_benchmark("tianshou_online")
    for bad in ("dqn=195", "iqn=high"):
        with pytest.raises(SystemExit, match="bad --also-target"):
            bench.cli(["--out", str(tmp_path), "--algos", "iqn", "--also-target", bad])


@pytest.mark.slow
def test_her_ddpg_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """DDPG + HER on PointGoal at a 1,000-step budget a side: both runs evaluated by success rate, unsolved as null."""
    pytest.importorskip("tianshou")
    bench = load_benchmark("tianshou_her")
    bench.cli(["--out", str(tmp_path), "--seeds", "1", "--budget", "1000"])
    doc = _last_json(capsys.readouterr().out)
    result = doc["result"]
    assert result["budget"] == 1000 and result["settings_tianshou"]["her_future_k"] == 5
    for lib in ("pickaxe", "tianshou"):
        assert result[lib]["solved"] in (0, 1) and len(result[lib]["steps"]) == 1
        assert 0.0 <= result[lib]["best_success"][0] <= 1.0
    runs = {r["lib"]: r for r in doc["runs"]}
    assert runs["tianshou"]["trained_steps"] >= 1000 and runs["pickaxe"]["trained_steps"] >= 1000
