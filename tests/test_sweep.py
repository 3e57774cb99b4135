"""Sweeps: grid expansion and naming, and a 2-value x 3-seed CartPole sweep end to end."""

import json
from pathlib import Path

import pytest

from pickaxe.cli import main
from pickaxe.errors import ConfigError
from pickaxe.exp.sweep import expand_grid, parse_sweep_args


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


def test_two_value_three_seed_sweep_names_the_better_value(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    code = main([
        "sweep", "cartpole-ppo", "--algo.lr", "3e-3,1e-7", "--seeds", "3", "--workers", "2",
        "--trainer.total-steps", "8192", "--trainer.eval-every", "4096", "--sweep-dir", str(sweep),
    ])  # fmt: skip
    assert code == 0
    assert len(list(sweep.glob("*/seed-*/model.safetensors"))) == 6
    summary = json.loads((sweep / "compare" / "summary.json").read_text())
    assert "3e-3" in summary["winner"] or "0.003" in summary["winner"]
    assert (sweep / "compare" / "curves.png").is_file() and (sweep / "compare" / "summary.md").is_file()
    timing = json.loads((sweep / "sweep_timing.json").read_text())
    assert timing["runs"] == 6 and timing["failed"] == 0
    # running it again continues the same sweep: nothing to do, same answer
    assert (
        main(
            [
                "sweep",
                "cartpole-ppo",
                "--algo.lr",
                "3e-3,1e-7",
                "--seeds",
                "3",
                "--workers",
                "2",
                "--trainer.total-steps",
                "8192",
                "--trainer.eval-every",
                "4096",
                "--sweep-dir",
                str(sweep),
            ]
        )
        == 0
    )
