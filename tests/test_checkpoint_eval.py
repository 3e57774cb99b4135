"""``pickaxe eval RUN --checkpoints``: every kept step in the table and the files, CIs around the means, the logged
numbers again, the selection rule behind ``best``, a rerun served from the cache, and bad input as one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pickaxe.cli import main
from pickaxe.exp import checkpoint_eval
from pickaxe.runs.run import read_metrics
from pickaxe.train.build import train
from pickaxe.train.eval_metrics import eval_metric_names
from test_policies import classic_cfg, llm_cfg


@pytest.fixture(scope="module")
def classic_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("ckpt_eval") / "classic"
    train(classic_cfg(), run_dir=run_dir)
    return run_dir


def _report(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "eval" / "checkpoints.json").read_text())


def _count_builds(monkeypatch: pytest.MonkeyPatch, cls: type) -> list[int]:
    calls: list[int] = []
    build = cls._build

    def counted(self: Any) -> Any:
        if self._built is None:  # the model and envs are built once per command
            calls.append(1)
        return build(self)

    monkeypatch.setattr(cls, "_build", counted)
    return calls


def _logged_eval_metrics(run_dir: Path) -> set[str]:
    """The ``eval/`` metrics the run logged (not their CI ends, not the marker of the evaluation before training)."""
    return {
        k
        for r in read_metrics(run_dir)
        for k in r
        if k.startswith("eval/") and not k.endswith(("_ci_low", "_ci_high")) and k != "eval/phase_before"
    }


_NO_TORCH = """
import sys
from pickaxe.cli import main

run, missing = sys.argv[1], sys.argv[2]
assert main(["eval", run, "--checkpoints", "all"]) == 0
assert main(["eval", missing, "--checkpoints", "all"]) == 2
assert main(["eval", run, "--checkpoints", "newest"]) == 2
assert main(["eval", run, "--checkpoints"]) == 2
assert "torch" not in sys.modules, "imported torch"
print("ok")
"""


def _assert_cached_eval_imports_no_torch(run_dir: Path, tmp_path: Path) -> None:
    """A fully cached ``eval --checkpoints all`` (and a missing run folder, a bad or missing --checkpoints value) in a
    fresh interpreter never imports torch."""
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, str(run_dir), str(tmp_path / "missing")],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
    assert "from the cache" in proc.stdout


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pickaxe: error: ") and "\n" not in err
    return err


def test_all_checkpoints_table_files_and_cache(
    classic_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(classic_run, run_dir)
    builds = _count_builds(monkeypatch, checkpoint_eval._Classic)
    assert main(["eval", str(run_dir), "--checkpoints", "all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["step", "source", "eval/return_mean", "eval/return_iqm"]
    assert [ln.split()[0] for ln in lines[1:5]] == ["1024", "2048", "3072", "4096"]
    report = _report(run_dir)
    assert report["kind"] == "classic" and report["settings"]["episodes"] == 6
    assert [(r["step"], r["source"]) for r in report["rows"]] == [(s, "policy") for s in (1024, 2048, 3072, 4096)]
    logged = {r["step"]: r for r in read_metrics(run_dir) if "eval/return_mean" in r}
    for row in report["rows"]:
        for name, e in row["metrics"].items():
            assert e["low"] <= e["mean"] <= e["high"], (row["step"], name)
        mean = row["metrics"]["eval/return_mean"]
        record = logged[row["step"]]  # the same episodes as the run's evaluation: the same numbers, CI included
        assert (mean["mean"], mean["low"], mean["high"], mean["n"]) == (
            record["eval/return_mean"], record["eval/return_mean_ci_low"], record["eval/return_mean_ci_high"], 6,
        )  # fmt: skip
    selection = json.loads((run_dir / "selection.json").read_text())
    assert report["best"]["step"] == selection["step"] and report["best"]["rule"] == "undominated"
    means = sorted((r["metrics"]["eval/return_mean"]["mean"], r["step"]) for r in report["rows"])
    pair = report["pairs"][0]
    assert {pair["a"], pair["b"]} == {means[-1][1], means[-2][1]} and pair["metric"] == "eval/return_mean"
    assert pair["more_samples"] is None or pair["more_samples"] >= 0
    csv_lines = (run_dir / "eval" / "checkpoints.csv").read_text().splitlines()
    assert len(csv_lines) == 5 and csv_lines[0].startswith("step,source,sha256,eval/return_mean,")
    assert (run_dir / "eval" / "plots" / "eval_return_mean.png").stat().st_size > 1000
    assert len(builds) == 1
    # a rerun is served from the cache: no environment or network is built
    assert main(["eval", str(run_dir), "--checkpoints", "all"]) == 0
    assert "4 of 4 from the cache" in capsys.readouterr().out and len(builds) == 1
    assert _report(run_dir)["rows"] == report["rows"]
    assert main(["eval", str(run_dir), "--checkpoints", "2048", "--no-cache"]) == 0
    assert "0 of 1 from the cache" in capsys.readouterr().out and len(builds) == 2
    _assert_cached_eval_imports_no_torch(run_dir, tmp_path)


def test_the_metrics_a_select_metric_may_name_are_those_the_run_logs(classic_run: Path) -> None:
    names, prefixes = eval_metric_names(classic_cfg())
    assert _logged_eval_metrics(classic_run) == names and prefixes == ()


def test_checkpoints_without_a_value_is_an_error_not_a_plain_eval(
    classic_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["--checkpoints"], ["--checkpoints", "--episodes", "2"], ["--episodes", "2", "--checkpoints"]):
        err = _error(capsys, ["eval", str(classic_run), *argv])
        assert "--checkpoints needs at least one value: all, best, latest, final or env steps" in err
    assert not (classic_run / "eval").exists()


def test_best_says_so_when_the_selection_metric_is_not_logged(
    classic_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(classic_run, run_dir, ignore=shutil.ignore_patterns("eval", "selection.json"))
    config = json.loads((run_dir / "config.json").read_text())
    config["select"]["metric"] = "eval/accuracy"  # a config from before --select.metric was checked
    (run_dir / "config.json").write_text(json.dumps(config))
    err = _error(capsys, ["eval", str(run_dir), "--checkpoints", "best"])
    assert "the selection metric eval/accuracy is logged at none of its 4 evaluated steps with kept weights" in err
    assert "eval/return_mean" in err and not (run_dir / "eval").exists()


def test_without_matplotlib_the_report_says_how_to_get_plots(
    classic_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(classic_run, run_dir)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the core install has no plots extra
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    assert main(["eval", str(run_dir), "--checkpoints", "latest"]) == 0
    assert "(+ .csv, no plots: pip install 'pickaxe[plots]' for them)" in capsys.readouterr().out
    assert (run_dir / "eval" / "checkpoints.json").is_file() and not (run_dir / "eval" / "plots").exists()


def test_best_follows_the_runs_selection_rule(
    classic_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(classic_run, run_dir, ignore=shutil.ignore_patterns("eval"))
    selection = json.loads((run_dir / "selection.json").read_text())
    assert main(["eval", str(run_dir), "--checkpoints", "best"]) == 0
    capsys.readouterr()
    assert [r["step"] for r in _report(run_dir)["rows"]] == [selection["step"]]
    # another rule recorded in selection.json: best follows it (here the lowest mean return)
    shutil.rmtree(run_dir / "eval")
    (run_dir / "selection.json").write_text(json.dumps({**selection, "rule": "max-mean", "mode": "min"}))
    logged = {r["step"]: r["eval/return_mean"] for r in read_metrics(run_dir) if "eval/return_mean" in r}
    lowest = min(logged, key=lambda s: (logged[s], s))
    assert main(["eval", str(run_dir), "--checkpoint", "best"]) == 0  # the older flag: the same choice
    capsys.readouterr()
    assert [r["step"] for r in _report(run_dir)["rows"]] == [lowest]


def test_bad_input_is_one_line_and_exit_2(
    classic_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(classic_run)
    assert "keeps no weights at env step 999; kept steps: 1024, 2048, 3072, 4096" in _error(
        capsys, ["eval", run, "--checkpoints", "999"]
    )
    assert "is not a run directory" in _error(capsys, ["eval", str(tmp_path), "--checkpoints", "all"])
    assert "--samples and --pass-k are for LLM runs" in _error(
        capsys, ["eval", run, "--checkpoints", "all", "--pass-k", "2"]
    )
    assert "--checkpoints must be final, best, latest or an env step" in _error(
        capsys, ["eval", run, "--checkpoints", "newest"]
    )
    assert not (classic_run / "eval").exists()


def test_llm_checkpoints_with_cis_and_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "llm"
    train(llm_cfg(), run_dir=run_dir)
    builds = _count_builds(monkeypatch, checkpoint_eval._LLM)
    assert main(["eval", str(run_dir), "--checkpoints", "all"]) == 0
    capsys.readouterr()
    report = _report(run_dir)
    assert report["kind"] == "llm" and [r["step"] for r in report["rows"]] == [0, 16, 32]
    logged = {r["step"]: r for r in read_metrics(run_dir) if "eval/accuracy" in r}
    for row in report["rows"]:
        m = row["metrics"]
        assert {"eval/accuracy", "eval/pass@1", "eval/pass@2", "eval/kl", "eval/entropy", "eval/sampled_length"} <= set(
            m
        )
        for name, e in m.items():
            assert e["low"] <= e["mean"] <= e["high"], (row["step"], name)
        for name in ("eval/accuracy", "eval/pass@2", "eval/kl", "eval/entropy", "eval/completion_length"):
            assert m[name]["mean"] == logged[row["step"]][name]  # the run's own evaluator, one code path
        assert m["eval/accuracy"]["n"] == 12 and m["eval/sampled_length"]["n"] == 48
    assert report["best"]["metric"] == "eval/accuracy" and len(builds) == 1
    assert main(["eval", str(run_dir), "--checkpoints", "all"]) == 0
    assert "3 of 3 from the cache" in capsys.readouterr().out and len(builds) == 1
    _assert_cached_eval_imports_no_torch(run_dir, tmp_path)
    names, prefixes = eval_metric_names(llm_cfg())
    assert _logged_eval_metrics(run_dir) == names and prefixes == ()
    assert main(["eval", str(run_dir), "--checkpoints", "latest", "--samples", "2", "--pass-k", "2"]) == 0
    capsys.readouterr()
    assert _report(run_dir)["settings"]["samples"] == 2 and len(builds) == 2  # other settings: evaluated afresh


def test_the_cache_is_keyed_by_the_runs_settings(classic_run: Path, tmp_path: Path) -> None:
    """The same weights under other evaluation settings (episodes) or another run config (an env capped at 20
    steps) are evaluated afresh, never served the cached numbers of the first settings; the same settings again
    are served from the cache."""
    from pickaxe.recipes.args import load_run_config

    run_dir = tmp_path / "run"
    shutil.copytree(classic_run, run_dir)
    cfg = load_run_config(run_dir)
    first = checkpoint_eval.evaluate_checkpoints(run_dir, cfg, ["latest"])
    assert first.cached == 0 and first.rows[0]["metrics"]["eval/return_mean"]["mean"] > 20
    assert [r["step"] for r in first.rows] == [4096]  # latest: the newest kept weights
    assert checkpoint_eval.evaluate_checkpoints(run_dir, cfg, ["latest"]).cached == 1
    fewer = checkpoint_eval.evaluate_checkpoints(run_dir, cfg, ["latest"], episodes=3)
    assert fewer.cached == 0 and fewer.rows[0]["metrics"]["eval/return_mean"]["n"] == 3
    capped = load_run_config(run_dir)
    capped.env.kwargs = {"max_episode_steps": 20}
    report = checkpoint_eval.evaluate_checkpoints(run_dir, capped, ["latest"])
    assert report.cached == 0 and report.rows[0]["metrics"]["eval/return_mean"]["mean"] <= 20
    assert report.settings["cache_key"] != first.settings["cache_key"]
    assert checkpoint_eval.evaluate_checkpoints(run_dir, cfg, ["latest"]).cached == 1  # the first entry is kept


def test_best_prefers_checkpoint_results_needs_kept_weights_and_pairs_follow_the_mode(
    classic_run: Path, tmp_path: Path
) -> None:
    """``best`` reads an earlier ``--checkpoints`` evaluation before the run's logged ones, never names a step
    whose weights were not kept (a logged evaluation at step 512 with a huge return), and under mode=min the top
    pair and the best are the lowest means."""
    from pickaxe.recipes.args import load_run_config

    run_dir = tmp_path / "run"
    shutil.copytree(classic_run, run_dir, ignore=shutil.ignore_patterns("eval"))
    cfg = load_run_config(run_dir)
    refs = checkpoint_eval.list_candidates(run_dir)
    logged = {r["step"]: r["eval/return_mean"] for r in read_metrics(run_dir) if "eval/return_mean" in r}
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 512, "eval/return_mean": 1e6}) + "\n")
    assert checkpoint_eval.best_step(run_dir, cfg, refs) == json.loads((run_dir / "selection.json").read_text())["step"]
    worst = min(logged, key=lambda s: (logged[s], s))
    rows = [{"step": s, "metrics": {"eval/return_mean": {"mean": 1.0 + (s == worst), "low": None, "high": None}}}
            for s in logged]  # fmt: skip
    (run_dir / "eval").mkdir()
    (run_dir / "eval" / "checkpoints.json").write_text(json.dumps({"rows": rows}))
    assert checkpoint_eval.best_step(run_dir, cfg, refs) == worst  # the --checkpoints results decide
    (run_dir / "eval" / "checkpoints.json").unlink()
    selection = json.loads((run_dir / "selection.json").read_text())
    (run_dir / "selection.json").write_text(json.dumps({**selection, "rule": "max-mean", "mode": "min"}))
    report = checkpoint_eval.evaluate_checkpoints(run_dir, cfg, ["all"])
    ranked = sorted(logged, key=lambda s: (logged[s], s))
    assert report.best is not None and report.best["step"] == ranked[0]
    assert (report.pairs[0]["a"], report.pairs[0]["b"]) == (ranked[0], ranked[1])
