"""``pickaxe compare``: loading run directories, grouping by config, statistics and reports."""

import csv
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from pickaxe.errors import PickaxeError
from pickaxe.exp import compare, group_runs, learning_curve, load_runs, main_compare
from pickaxe.exp.compare import flatten_config

GOOD, BAD = "algo.lr=0.001", "algo.lr=0.0003"


def make_run(path: Path, config: dict, evals: list[tuple[int, float | None]], tail: str = "") -> Path:
    """A fake run directory: config.json, manifest.json and metrics.jsonl with training and eval records."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    (path / "manifest.json").write_text(json.dumps({"seed": config.get("seed")}))
    with open(path / "metrics.jsonl", "w") as f:
        for step, value in evals:
            f.write(json.dumps({"step": step - 100, "loss/policy": 0.1, "time/elapsed_s": 1.0}) + "\n")
            f.write(json.dumps({"step": step, "eval/return_mean": value, "time/elapsed_s": 2.0}) + "\n")
        f.write(tail)
    return path


def config(lr: float, seed: int, clip: float = 0.2, **extra) -> dict:
    return {
        "algo": {"lr": lr, "clip": clip},
        "env": {"id": "CartPole-v1", "num_envs": 8},
        "model": {"hidden": [64, 64]},
        "seed": seed,
        "device": "cpu",
        "torch_threads": 1,
        "recipe": "cartpole-ppo",
        "kind": "classic",
        "algo_name": "ppo",
        **extra,
    }


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """2 configs x 4 seeds at different depths; lr=0.001 clearly better. Seed 2 ran on another device."""
    root = tmp_path / "sweep"
    for lr, level in ((0.001, 100.0), (0.0003, 20.0)):
        for seed in range(4):
            cfg = config(lr, seed, device="cuda" if seed == 2 else "cpu")
            evals = [(1000 * (i + 1), level * (i + 1) / 4 + seed) for i in range(4)]
            sub = root / f"lr={lr}" / (f"seed{seed}" if seed else "deeper/seed0")
            make_run(sub, cfg, evals, tail='{"step": 5000, "eval/ret' if seed == 1 else "")  # torn last line
    return root


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


# ------------------------------------------------------------------------------------------------- loading


def test_load_runs_finds_nested_runs_and_skips_torn_lines(sweep: Path):
    runs = load_runs([sweep])
    assert len(runs) == 8
    assert [r.path for r in runs] == sorted(r.path for r in runs)
    steps, _ = runs[1].series("eval/return_mean")
    np.testing.assert_array_equal(steps, [1000, 2000, 3000, 4000])
    assert runs[1].records[-1]["step"] == 4000  # the torn line is gone
    # a run dir given directly, and again inside its sweep, is loaded once
    assert len(load_runs([runs[0].path, sweep])) == 8
    assert len(load_runs([runs[0].path])) == 1


def test_series_skips_null_values(tmp_path: Path):
    run = make_run(tmp_path / "r", config(0.1, 0), [(10, 1.0), (20, None), (30, 3.0)])
    steps, values = load_runs([run])[0].series("eval/return_mean")
    np.testing.assert_array_equal(steps, [10, 30])
    np.testing.assert_array_equal(values, [1.0, 3.0])


def test_missing_or_empty_paths_are_clear_errors(tmp_path: Path):
    with pytest.raises(PickaxeError, match="nowhere does not exist"):
        load_runs([tmp_path / "nowhere"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(PickaxeError, match=r"no run directories .* at or below .*empty"):
        load_runs([tmp_path / "empty"])
    half = tmp_path / "half"
    half.mkdir()
    (half / "config.json").write_text("{}")
    with pytest.raises(PickaxeError, match=r"no metrics\.jsonl"):
        load_runs([half])


def test_malformed_files_name_the_file(tmp_path: Path):
    bad_cfg = make_run(tmp_path / "a", config(0.1, 0), [(10, 1.0)])
    (bad_cfg / "config.json").write_text("{not json")
    with pytest.raises(PickaxeError, match=r"a/config\.json"):
        load_runs([bad_cfg])
    (bad_cfg / "config.json").write_text("[1, 2]")
    with pytest.raises(PickaxeError, match="not a JSON object"):
        load_runs([bad_cfg])

    bad_line = make_run(tmp_path / "b", config(0.1, 0), [(10, 1.0)])
    text = (bad_line / "metrics.jsonl").read_text()
    (bad_line / "metrics.jsonl").write_text("garbage\n" + text)
    with pytest.raises(PickaxeError, match=r"b/metrics\.jsonl line 1 is not valid JSON"):
        load_runs([bad_line])
    (bad_line / "metrics.jsonl").write_text('{"loss": 1.0}\n' + text)
    with pytest.raises(PickaxeError, match="line 1 has no integer 'step'"):
        load_runs([bad_line])


def test_reads_what_run_writes(tmp_path: Path):
    from pickaxe.runs.run import Run
    from pickaxe.train.config import TrainConfig

    for lr in (1e-3, 3e-4):
        for seed in range(2):
            cfg = TrainConfig(seed=seed, device="cpu" if seed else "auto")
            cfg.algo.lr = lr
            with Run(tmp_path / f"lr{lr}-s{seed}", config=cfg.to_dict(), seed=seed, tensorboard=False) as run:
                run.log({"loss/policy": float("nan")}, step=100)
                run.log({"eval/return_mean": 10.0 * lr * 1e3 + seed}, step=200)
    groups = group_runs(load_runs([tmp_path]))
    assert sorted(g.label for g in groups) == ["algo.lr=0.0003", "algo.lr=0.001"]
    assert all(len(g.runs) == 2 for g in groups)


# ------------------------------------------------------------------------------------------------ grouping


def test_flatten_config():
    assert flatten_config({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": "x", "f": {}}) == {
        "a.b": 1,
        "a.c.d": [1, 2],
        "e": "x",
        "f": {},
    }


def test_group_runs_pools_seeds_and_devices_and_labels_by_differing_keys(sweep: Path):
    groups = group_runs(load_runs([sweep]))
    assert {g.label: len(g.runs) for g in groups} == {BAD: 4, GOOD: 4}
    assert all(g.varying == {"algo.lr": float(g.label.split("=")[1])} for g in groups)


def test_labels_show_every_differing_key(tmp_path: Path):
    for i, (lr, clip) in enumerate(((0.001, 0.1), (0.001, 0.2), (0.01, 0.1))):
        make_run(tmp_path / f"r{i}", config(lr, 0, clip=clip), [(10, 1.0)])
    labels = [g.label for g in group_runs(load_runs([tmp_path]))]
    assert labels == ["algo.lr=0.001, algo.clip=0.1", "algo.lr=0.001, algo.clip=0.2", "algo.lr=0.01, algo.clip=0.1"]


def test_single_group_is_labelled_by_recipe(tmp_path: Path):
    for seed in range(2):
        make_run(tmp_path / f"s{seed}", config(0.001, seed), [(10, 1.0)])
    (group,) = group_runs(load_runs([tmp_path]))
    assert group.label == "cartpole-ppo" and len(group.runs) == 2


# ------------------------------------------------------------------------------------------------- compare


def test_compare_names_the_better_config_and_writes_reports(sweep: Path, tmp_path: Path):
    out = tmp_path / "report"
    console = quiet()
    result = compare([sweep], out_dir=out, console=console)

    good = next(g for g in result.groups if g.label == GOOD)
    assert good.n_runs == 4
    assert good.final_values == [100.0, 101.0, 102.0, 103.0]  # last eval of each run (seeds 0, 1, 2, 3)
    assert good.final_iqm.value == pytest.approx(101.5)  # 4 runs: IQM cuts one at each end
    assert good.final_mean.low <= 101.5 <= good.final_mean.high
    assert good.best_values == [100.0, 101.0, 102.0, 103.0]
    assert result.best == result.winner == GOOD
    (pair,) = result.pairs
    assert (pair.a, pair.b, pair.better) == (GOOD, BAD, GOOD)
    assert pair.probability.value == 1.0 and pair.probability.low > 0.5

    assert sorted(p.name for p in out.iterdir()) == ["curves.png", "summary.csv", "summary.json", "summary.md"]
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["winner"] == GOOD and summary["metric"] == "eval/return_mean"
    assert {g["label"] for g in summary["groups"]} == {GOOD, BAD}
    assert summary["comparisons"][0]["better"] == GOOD
    with open(out / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["group"]: r["algo.lr"] for r in rows} == {GOOD: "0.001", BAD: "0.0003"}
    assert {r["group"]: r["is_winner"] for r in rows} == {GOOD: "True", BAD: "False"}
    md = (out / "summary.md").read_text()
    assert "| group | runs | final IQM |" in md and f"| {GOOD} * | 4 |" in md and "**Verdict:**" in md
    printed = console.file.getvalue()
    assert GOOD in printed and "better than every other group" in printed


def noisy_sweep(root: Path) -> Path:
    """2 configs x 5 seeds drawn from the same distribution."""
    rng = np.random.default_rng(0)
    for lr in (0.1, 0.2):
        for seed in range(5):
            make_run(root / f"{lr}-{seed}", config(lr, seed), [(100, float(rng.normal(50, 10)))])
    return root


def test_compare_is_deterministic_and_seeded(tmp_path: Path):
    root = noisy_sweep(tmp_path)
    a = compare([root], console=quiet()).to_dict()
    assert a == compare([root], console=quiet()).to_dict()
    b = compare([root], seed=1, console=quiet()).to_dict()
    assert a["groups"][0]["final"]["mean"]["value"] == b["groups"][0]["final"]["mean"]["value"]
    assert a["groups"][0]["final"]["mean"] != b["groups"][0]["final"]["mean"]  # other resamples


def test_compare_cannot_tell_overlapping_configs(tmp_path: Path):
    result = compare([noisy_sweep(tmp_path)], console=quiet())
    assert result.winner is None and result.pairs[0].better is None
    lo, hi = result.pairs[0].probability.low, result.pairs[0].probability.high
    assert lo < 0.5 < hi


def test_single_runs_give_no_verdict(tmp_path: Path):
    make_run(tmp_path / "a", config(0.1, 0), [(10, 1.0)])
    make_run(tmp_path / "b", config(0.2, 0), [(10, 9.0)])
    result = compare([tmp_path], console=quiet())
    assert result.best == "algo.lr=0.2" and result.winner is None and result.pairs[0].better is None
    assert any("needs at least 4 seeds per group" in n for n in result.notes)


def test_best_metric_is_the_maximum_over_evals(tmp_path: Path):
    for seed in range(2):
        make_run(tmp_path / f"s{seed}", config(0.1, seed), [(10, 5.0 + seed), (20, 50.0 + seed), (30, 1.0)])
    (group,) = compare([tmp_path], console=quiet()).groups
    assert group.final_values == [1.0, 1.0] and group.best_values == [50.0, 51.0]


def test_unknown_metric_suggests_the_closest(sweep: Path):
    with pytest.raises(PickaxeError, match=r"'eval/return_men'.*did you mean 'eval/return_mean'"):
        compare([sweep], metric="eval/return_men", console=quiet())


def test_learning_curve_interpolates_onto_a_common_grid(tmp_path: Path):
    make_run(tmp_path / "a", config(0.1, 0), [(0, 0.0), (10, 10.0)])
    make_run(tmp_path / "b", config(0.1, 1), [(0, 0.0), (5, 5.0), (10, 10.0), (15, 15.0)])
    curve = learning_curve(load_runs([tmp_path]), "eval/return_mean")
    np.testing.assert_array_equal(curve["step"], [0, 5, 10, 15])
    np.testing.assert_allclose(curve["iqm"], [0.0, 5.0, 10.0, 15.0])  # run a interpolated at step 5
    np.testing.assert_array_equal(curve["n"], [2, 2, 2, 1])  # no extrapolation past run a's last eval
    assert np.all(curve["low"] <= curve["iqm"]) and np.all(curve["iqm"] <= curve["high"])


def test_curves_png_marks_every_point_so_a_group_evaluated_once_shows(tmp_path: Path):
    pytest.importorskip("matplotlib")
    from pickaxe.exp.curves import curves_figure

    make_run(tmp_path / "long", config(0.1, 0), [(1000, 1.0), (2000, 2.0), (3000, 3.0)])
    for seed, value in ((0, 5.0), (1, 7.0)):  # both stopped at their first evaluation
        make_run(tmp_path / f"once-{seed}", config(0.5, seed), [(1000, value)])
    groups = group_runs(load_runs([tmp_path]))
    fig = curves_figure(groups, "eval/return_mean", reps=200, alpha=0.05, seed=0)
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    once = next(line for label, line in lines.items() if label.startswith("algo.lr=0.5"))
    assert list(once.get_xdata()) == [1000] and once.get_marker() == "o" and once.get_markersize() > 0
    assert all(line.get_marker() == "o" for line in lines.values())
    assert any(len(c.get_segments()) == 1 for c in ax.collections if hasattr(c, "get_segments"))  # its CI bar


# ------------------------------------------------------------------------------------------------------ CLI


def test_main_compare_writes_to_the_current_folder_by_default(
    sweep: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main_compare([str(sweep), "--seed", "3"]) == 0
    summary = json.loads((here / "compare" / "summary.json").read_text())
    assert summary["winner"] == GOOD and summary["seed"] == 3
    assert GOOD in capsys.readouterr().out
    assert not (sweep / "compare").exists()  # nothing is written inside the runs compared
    assert len(load_runs([sweep])) == 8


def test_too_few_seeds_give_no_verdict_and_say_how_many(tmp_path: Path):
    # 2 seeds per group, perfectly separated: the bootstrap alone would say P = 1 [1, 1]
    for seed in range(2):
        make_run(tmp_path / f"a{seed}", config(0.1, seed), [(10, 100.0 + seed)])
        make_run(tmp_path / f"b{seed}", config(0.2, seed), [(10, 1.0 + seed)])
    console = quiet()
    result = compare([tmp_path], console=console)
    assert result.best == "algo.lr=0.1" and result.winner is None and result.pairs[0].better is None
    assert any("needs at least 4 seeds per group" in n and "run 2 more" in n for n in result.notes)
    printed = console.file.getvalue()
    assert "better than every other group" not in printed and "no verdict" in printed
    assert compare([tmp_path], console=quiet(), min_seeds=2).winner == "algo.lr=0.1"  # the threshold is a choice


def test_repeated_seeds_are_counted_once_with_a_warning(tmp_path: Path):
    for seed in range(4):
        make_run(tmp_path / f"a{seed}", config(0.1, seed), [(10, 100.0 + seed)])
        make_run(tmp_path / f"b{seed}", config(0.2, seed), [(10, 1.0 + seed)])
    for copy in range(3):  # the same config and seed run three more times: not new samples
        make_run(tmp_path / f"a0-copy{copy}", config(0.1, 0), [(10, 100.0)])
    result = compare([tmp_path], console=quiet())
    good = next(g for g in result.groups if g.label == "algo.lr=0.1")
    assert good.n_runs == 4 and good.final_values == [100.0, 101.0, 102.0, 103.0]
    repeats = [n for n in result.notes if "repeats seed 0" in n]
    assert len(repeats) == 3 and all("counted once" in n for n in repeats)
    # only 1 distinct seed in a group: no verdict, however many copies
    only = tmp_path / "only"
    for copy in range(5):
        make_run(only / f"a{copy}", config(0.1, 0), [(10, 100.0)])
        make_run(only / f"b{copy}", config(0.2, copy), [(10, 1.0)])
    assert compare([only], console=quiet()).winner is None


def test_main_compare_options(sweep: Path, tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main_compare(["--help"])
    assert exit_.value.code == 0 and "usage: pickaxe compare" in capsys.readouterr().out
    out = tmp_path / "elsewhere"
    assert main_compare([f"--out={out}", str(sweep), "--metric", "eval/return_mean"]) == 0
    assert (out / "summary.md").is_file()
    with pytest.raises(PickaxeError, match="did you mean --metric"):
        main_compare([str(sweep), "--metrc", "x"])
    with pytest.raises(PickaxeError, match="--seed"):
        main_compare([str(sweep), "--seed", "x"])
    with pytest.raises(PickaxeError, match="--out"):
        main_compare([str(sweep), "--out"])
    with pytest.raises(PickaxeError, match="at least one run or sweep directory"):
        main_compare([])


def test_reports_without_matplotlib_or_with_a_bad_out_dir(sweep: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)  # import fails
    result = compare([sweep], out_dir=tmp_path / "r", console=quiet())
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["summary.csv", "summary.json", "summary.md"]
    assert "curves.png skipped" in json.loads((tmp_path / "r" / "summary.json").read_text())["notes"][-1]
    assert result.winner == GOOD
    (tmp_path / "file").write_text("")
    with pytest.raises(PickaxeError, match=r"cannot write the reports to .*file"):
        compare([sweep], out_dir=tmp_path / "file", console=quiet())
