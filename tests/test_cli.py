"""The pickaxe CLI: a working train/eval round trip, and one clear line for every user error."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pickaxe.cli import main


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pickaxe: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_train_then_eval_round_trip(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "run"
    argv = [
        "train",
        "cartpole-ppo",
        "--trainer.total-steps",
        "512",
        "--run-dir",
        str(run_dir),
        "--no-progress",
        "--seed",
        "3",
        "--algo.lr",
        "5e-4",
        "--model.hidden",
        "32",
        "32",
        "--env.num_envs",
        "4",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 512 and summary["run_dir"] == str(run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["seed"] == 3 and config["algo"]["lr"] == 5e-4 and config["model"]["hidden"] == [32, 32]
    assert config["env"]["num_envs"] == 4 and config["algo_name"] == "ppo"
    assert main(["eval", str(run_dir), "--episodes", "3"]) == 0
    out = json.loads(capsys.readouterr().out.strip())
    assert out["episodes"] == 3 and out["return_mean"] > 0


def test_recipes_lists_one_line_each(capsys) -> None:
    assert main(["recipes"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == [
        "cartpole-ppo", "cartpole-dqn", "pendulum-ppo", "arith-sft", "arith-grpo", "reverse-grpo",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train", "cartpole-pp"], "unknown recipe 'cartpole-pp'; did you mean 'cartpole-ppo'"),
        (["train", "cartpole-ppo", "--algo.lrr", "3"], "unknown config key --algo.lrr; did you mean --algo.lr?"),
        (["train", "cartpole-ppo", "--algo.epoch", "3"], "did you mean --algo.epochs?"),
        (["train", "cartpole-ppo", "--algo.lr", "fast"], "--algo.lr takes float, got 'fast'"),
        (["train", "cartpole-ppo", "--seed", "1.5"], "--seed takes int, got '1.5'"),
        (["train", "cartpole-ppo", "--algo.lr-schedule", "cosine"], "must be one of constant, linear"),
        (
            ["train", "cartpole-ppo", "--env.id", "CartPol-v1"],
            "unknown environment id 'CartPol-v1'; did you mean 'CartPole-v1'",
        ),
        (["train"], "needs a recipe name"),
        (["trian", "cartpole-ppo"], "unknown command 'trian'; did you mean 'train'?"),
        (["eval", "/nonexistent/run"], "is not a run directory"),
    ],
)
def test_user_errors_are_one_clear_line(capsys, tmp_path: Path, argv: list[str], expected: str) -> None:
    argv = [a.replace("RUN", str(tmp_path)) for a in argv]
    assert expected in _error(capsys, argv)


def test_unknown_env_creates_no_run_directory(capsys, tmp_path: Path) -> None:
    _error(capsys, ["train", "cartpole-ppo", "--env.id", "Nope-v0", "--run-dir", str(tmp_path / "r")])
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_gpu_is_a_clear_error(capsys) -> None:
    assert "torch sees no GPU" in _error(capsys, ["train", "cartpole-ppo", "--device", "cuda"])


def test_installed_command_exits_2_without_traceback() -> None:
    proc = subprocess.run([sys.executable, "-m", "pickaxe.cli", "train", "cartpole-pp"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "pickaxe: error: unknown recipe 'cartpole-pp'; did you mean 'cartpole-ppo'? (`pickaxe recipes` lists all)"
    )
