"""Offline-to-online for IQL and CQL: ``pickaxe train pendulum-iql-online --warm-start.run DIR`` continues a finished
IQL (CQL) run as IQL (CQL) trained online: the offline run's weights and optimizer state, its dataset in the replay,
a step-0 evaluation equal to the offline run's last one; a killed continuation resumes exactly; a warm start from a
run it cannot continue is one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from classic_runs import assert_killed_run_resumes_exactly
from cli_errors import train_error
from offline_data import random_dataset
from pickaxe.cli import main
from pickaxe.offline.dataset import read
from pickaxe.recipes import RECIPES
from pickaxe.runs.checkpoint import load_checkpoint
from pickaxe.runs.run import read_metrics
from pickaxe.train.build import build_trainer
from pickaxe.train.config import OnlineStartConfig

pytest.importorskip("minari")

EVAL = ["--trainer.eval-episodes", "2", "--env.eval-envs", "2"]
"""The offline and the online runs evaluate alike, so the continuation's step-0 evaluation can repeat the last one."""


@pytest.fixture(scope="module")
def offline_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Random-action datasets of Pendulum (2 episodes, 400 transitions) and CartPole (12 episodes), and an 8-step
    IQL and CQL run on each."""
    root = tmp_path_factory.mktemp("o2o-iql-cql")
    out = {"pendulum-data": random_dataset(root / "pendulum-data", "Pendulum-v1")}
    out["cartpole-data"] = random_dataset(root / "cartpole-data", "CartPole-v1", tuple(range(12)))
    for env in ("pendulum", "cartpole"):
        for algo in ("iql", "cql"):
            run = root / f"{env}-{algo}"
            args = ["--data.dataset", str(out[f"{env}-data"]), "--algo.batch-size", "32", "--collector.steps", "128"]
            args += ["--trainer.total-steps", "256", "--trainer.eval-every", "256", *EVAL]
            assert main(["train", f"{env}-{algo}", *args, "--run-dir", str(run), "--no-progress"]) == 0
            out[f"{env}-{algo}"] = run
    return out


@pytest.mark.parametrize("env", ["pendulum", "cartpole"])
@pytest.mark.parametrize("algo", ["iql", "cql"])
def test_the_continuation_starts_from_the_offline_state_with_the_dataset_in_its_replay(
    offline_runs: dict[str, Path], env: str, algo: str, tmp_path: Path
) -> None:
    source = offline_runs[f"{env}-{algo}"]
    cfg = RECIPES[f"{env}-{algo}-online"].make()
    cfg.warm_start = OnlineStartConfig(run=str(source))
    cfg.algo.batch_size = 32
    cfg.trainer.total_steps, cfg.trainer.eval_every = 32, 32
    cfg.trainer.eval_episodes, cfg.env.eval_envs = 2, 2
    cfg.check()
    trainer = build_trainer(cfg)
    try:
        # every network of the final model, and the rest of the final checkpoint's training state (optimizer
        # moments, CQL's temperature)
        saved = load_file(str(source / "model.safetensors"))
        for name, net in trainer.algo.networks().items():
            for key, value in net.state_dict().items():
                assert torch.equal(value, saved[f"{name}.{key}"]), f"{name}.{key}"
        offline_state, _ = load_checkpoint(source)
        inner = trainer.algo.inner
        assert inner.num_updates == offline_state["algo"]["num_updates"] == 8
        moments = [s["exp_avg"] for s in inner.optimizer.state_dict()["state"].values()]
        expected = [s["exp_avg"] for s in offline_state["algo"]["optimizer"]["state"].values()]
        assert len(moments) == len(expected) > 0
        assert all(torch.equal(a, b) for a, b in zip(moments, expected, strict=True))
        for key, value in inner.learned.state_dict().items():
            assert torch.equal(value, offline_state["algo"]["learned"][key]), key
        # the dataset's transitions, each once, shuffled
        data = read(offline_runs[f"{env}-data"])
        stored = trainer.algo.buffer.state_dict()["storage"]
        assert len(trainer.algo.buffer) == len(data)
        assert np.allclose(np.sort(stored["reward"].numpy()), np.sort(data.arrays["reward"]))
        order = np.lexsort(stored["obs"].numpy().T)
        assert np.allclose(stored["obs"].numpy()[order], data.arrays["obs"][np.lexsort(data.arrays["obs"].T)])
        # its step-0 evaluation is the offline run's final one (same seed, same eval settings)
        result = trainer.fit()
        offline_final = [r for r in read_metrics(source) if "eval/return_mean" in r][-1]
        assert result.history[0]["step"] == 0
        assert result.history[0]["eval/return_mean"] == offline_final["eval/return_mean"]
        assert result.steps == 32 and len(trainer.algo.buffer) == len(data) + 32
    finally:
        trainer.close()


def test_bad_continuations_are_one_line(
    offline_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--run-dir", str(tmp_path / "never")]
    err = train_error(capsys, "pendulum-iql-online", "--warm-start.run", str(offline_runs["pendulum-cql"]), *out)
    assert "is a cql run; iql-online continues iql runs only" in err
    err = train_error(capsys, "pendulum-cql-online", "--warm-start.run", str(offline_runs["cartpole-cql"]), *out)
    assert "trained on CartPole-v1, this run is on Pendulum-v1: use --env.id CartPole-v1" in err
    err = train_error(capsys, "pendulum-td3", "--warm-start.run", str(offline_runs["pendulum-iql"]), *out)
    assert "is a iql run; td3 continues td3-bc runs only" in err
    assert "sac cannot continue an offline run" in train_error(
        capsys, "pendulum-sac", "--warm-start.run", str(offline_runs["pendulum-iql"]), *out
    )
    bare = tmp_path / "bare"  # a finished run whose checkpoints were deleted: no optimizer state to continue
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "model.json"):
        shutil.copy(offline_runs["pendulum-iql"] / name, bare / name)
    err = train_error(capsys, "pendulum-iql-online", "--warm-start.run", str(bare), *out)
    assert "keeps no checkpoint, whose optimizer state iql-online continues" in err
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("recipe", ["pendulum-cql", "cartpole-iql"])
def test_a_killed_continuation_resumes_exactly(offline_runs: dict[str, Path], recipe: str, tmp_path: Path) -> None:
    args = [
        "--warm-start.run", str(offline_runs[recipe]), "--algo.batch-size", "32", "--algo.gradient-steps", "2",
        "--trainer.total-steps", "256", "--trainer.eval-every", "128", *EVAL, "--save-every", "64",
    ]  # fmt: skip
    assert_killed_run_resumes_exactly(f"{recipe}-online", args, tmp_path, "iteration:5")
