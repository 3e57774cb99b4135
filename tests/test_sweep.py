"""Sweeps: grid expansion and naming, and a 2-value x 4-seed CartPole sweep end to end."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pickaxe.cli import main
from pickaxe.errors import ConfigError
from pickaxe.exp.sweep import default_sweep_dir, expand_grid, parse_sweep_args, sweep_spec


def test_parse_splits_axes_fixed_flags_and_options() -> None:
    axes, fixed, options = parse_sweep_args(
        ["--algo.lr", "1e-3,3e-4", "--algo.clip=0.1,0.2", "--trainer.total-steps", "5000", "--seeds", "5",
         "--workers", "2", "--model.hidden", "32 32"]
    )  # fmt: skip
    assert axes == {"algo.lr": ["1e-3", "3e-4"], "algo.clip": ["0.1", "0.2"]}
    assert fixed == ["--trainer.total-steps", "5000", "--model.hidden", "32 32"]
    assert options == {"seeds": "5", "workers": "2"}
    with pytest.raises(ConfigError, match="--seeds N"):
        parse_sweep_args(["--seed", "3"])


def test_grid_expansion_and_names() -> None:
    points = expand_grid({"algo.lr": ["1e-3", "3e-4"], "algo.clip": ["0.1", "0.2"]}, seeds=3)
    assert len(points) == 12
    names = sorted({p.point for p in points})
    assert names == ["lr=1e-3_clip=0.1", "lr=1e-3_clip=0.2", "lr=3e-4_clip=0.1", "lr=3e-4_clip=0.2"]
    assert sorted(p.seed for p in points if p.point == names[0]) == [0, 1, 2]
    assert points[0].args() == ["--algo.lr", "1e-3", "--algo.clip", "0.1", "--seed", "0"]
    assert points[0].run_dir(Path("s")) == Path("s/lr=1e-3_clip=0.1/seed-0")
    # keys sharing a last part keep their full dotted name
    clash = expand_grid({"algo.lr": ["1"], "other.lr": ["2"]}, seeds=1)
    assert clash[0].point == "algo.lr=1_other.lr=2"
    assert [p.seed for p in expand_grid({}, seeds=2, seed_offset=10)] == [10, 11]


def test_bad_sweep_flag_fails_before_anything_runs(tmp_path: Path, capsys) -> None:
    code = main(["sweep", "cartpole-ppo", "--algo.lrr", "1e-3,3e-4", "--sweep-dir", str(tmp_path / "s")])
    assert code == 2 and "unknown config key --algo.lrr; did you mean --algo.lr?" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_default_sweep_dir_is_a_function_of_the_sweep() -> None:
    spec = sweep_spec("cartpole-ppo", {"algo.lr": ["1e-3", "3e-4"]}, ["--trainer.total-steps", "5000"], 3, 0)
    same = sweep_spec("cartpole-ppo", {"algo.lr": ["1e-3", "3e-4"]}, ["--trainer.total-steps", "5000"], 3, 0)
    assert default_sweep_dir(spec) == default_sweep_dir(same)
    folder = default_sweep_dir(spec)
    assert folder.parent == Path("runs") and folder.name.startswith("sweep-cartpole-ppo-")
    others = [
        sweep_spec("cartpole-dqn", {"algo.lr": ["1e-3", "3e-4"]}, ["--trainer.total-steps", "5000"], 3, 0),
        sweep_spec("cartpole-ppo", {"algo.lr": ["1e-3", "1e-4"]}, ["--trainer.total-steps", "5000"], 3, 0),
        sweep_spec("cartpole-ppo", {"algo.lr": ["1e-3", "3e-4"]}, ["--trainer.total-steps", "6000"], 3, 0),
        sweep_spec("cartpole-ppo", {"algo.lr": ["1e-3", "3e-4"]}, ["--trainer.total-steps", "5000"], 4, 0),
        sweep_spec("cartpole-ppo", {"algo.lr": ["1e-3", "3e-4"]}, ["--trainer.total-steps", "5000"], 3, 1),
    ]
    assert len({default_sweep_dir(o) for o in [spec, *others]}) == 6


def _pickaxe(args: list[str], cwd: Path) -> str:
    """``python -m pickaxe.cli ARGS`` in a fresh interpreter, as a user runs it (this test process may hold Ray's
    threads, with which the sweep would rightly not fork its runs); its stderr, after asserting exit 0."""
    done = subprocess.run([sys.executable, "-m", "pickaxe.cli", *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def test_two_value_four_seed_sweep_names_the_better_value_and_continues(tmp_path: Path) -> None:
    command = [
        "sweep", "cartpole-ppo", "--algo.lr", "3e-3,1e-7", "--seeds", "4", "--workers", "2",
        "--trainer.total-steps", "8192", "--trainer.eval-every", "4096",
    ]  # fmt: skip
    err = _pickaxe(command, tmp_path)
    (sweep,) = (tmp_path / "runs").glob("sweep-cartpole-ppo-*")  # the default folder, derived from the command
    models = sorted(sweep.glob("*/seed-*/model.safetensors"))
    assert len(models) == 8
    progress = [ln for ln in err.splitlines() if ln.startswith("pickaxe: [")]
    assert len(progress) == 8 and progress[-1].startswith("pickaxe: [8/8]")  # a line per finished run
    assert all("succeeded" in ln and "eval/return_mean" in ln for ln in progress)
    summary = json.loads((sweep / "compare" / "summary.json").read_text())
    assert "3e-3" in summary["winner"] or "0.003" in summary["winner"]
    assert (sweep / "compare" / "curves.png").is_file() and (sweep / "compare" / "summary.md").is_file()
    timing = json.loads((sweep / "sweep_timing.json").read_text())
    assert timing["runs"] == 8 and timing["failed"] == 0
    stamps = [m.stat().st_mtime_ns for m in models]

    # the same command again finds the same sweep: nothing reruns, and the answer is the same
    err = _pickaxe(command, tmp_path)
    assert f"in {Path('runs') / sweep.name}" in err and "8 already finished" in err
    assert not [ln for ln in err.splitlines() if ln.startswith("pickaxe: [")]
    assert [m.stat().st_mtime_ns for m in models] == stamps
    assert list((tmp_path / "runs").iterdir()) == [sweep]
    again = json.loads((sweep / "compare" / "summary.json").read_text())
    assert again["winner"] == summary["winner"] and again["groups"] == summary["groups"]
