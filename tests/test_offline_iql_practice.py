"""IQL's MuJoCo practice: rewards scaled by ``1000 / (max - min)`` of the dataset's episode returns
(``--algo.reward-scale return-range``, every offline algorithm with a critic) and a cosine decay of the policy's
learning rate (``--algo.actor-lr-schedule cosine``). Known answers: the scale of a hand-made dataset, the learning
rate after ``k`` of ``N`` steps, a scaled update equal to an update on scaled rewards; a killed run with both resumes
bit-exact, and an online continuation carries the scale."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from classic_runs import assert_killed_run_resumes_exactly
from cli_errors import train_error
from pickaxe.algos.iql import build_iql
from pickaxe.algos.offline_configs import IQLConfig, IQLOnlineConfig
from pickaxe.algos.offline_core import return_range_scale
from pickaxe.cli import main
from pickaxe.errors import ConfigError
from pickaxe.offline.dataset import Episode, read, write
from pickaxe.offline.sampler import DatasetSampler
from pickaxe.recipes import RECIPES
from pickaxe.runs.checkpoint import load_checkpoint
from pickaxe.runs.run import read_metrics
from pickaxe.train.build import build_trainer
from pickaxe.train.config import ModelConfig, OnlineStartConfig

pytest.importorskip("minari")

RETURNS = (6.0, -0.5, 10.0, 2.25)
"""The hand-made dataset's episode returns: a range of 10.5, a scale of 1000 / 10.5."""


def _episode(rewards: list[float], rng: np.random.Generator) -> Episode:
    t = len(rewards)
    obs = rng.uniform(-1, 1, (t + 1, 3)).astype(np.float32)
    action = rng.uniform(-2, 2, (t, 1)).astype(np.float32)
    trunc = np.zeros(t, bool)
    trunc[-1] = True
    return Episode(obs, action, np.asarray(rewards, np.float64), np.zeros(t, bool), trunc)


def _rewards(total: float, length: int) -> list[float]:
    """``length`` rewards summing to ``total`` exactly (in binary: multiples of 1/4)."""
    return [total - 0.25 * (length - 1), *([0.25] * (length - 1))]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four Pendulum-shaped episodes of 50 transitions whose returns are ``RETURNS``."""
    root = tmp_path_factory.mktemp("iqlpractice")
    rng = np.random.default_rng(0)
    episodes = [_episode(_rewards(r, 50), rng) for r in RETURNS]
    env = gym.make("Pendulum-v1")
    path = write(root / "data", episodes, env.observation_space, env.action_space, "t/pendulum-v0", {}, "Pendulum-v1")
    env.close()
    return path


def test_the_scale_is_1000_over_the_range_of_the_episode_returns(data: Path) -> None:
    assert list(read(data).episode_returns) == list(RETURNS)
    assert return_range_scale(read(data).episode_returns) == 1000.0 / 10.5
    assert return_range_scale([3.0, -1.0]) == 250.0
    for flat in ([5.0], [2.0, 2.0, 2.0], []):  # no range: refused, never a division by zero
        with pytest.raises(ConfigError, match=r"drop --algo\.reward-scale"):
            return_range_scale(flat)


def _iql(data: Path, **config: object) -> tuple[object, DatasetSampler]:
    torch.manual_seed(0)
    sampler = DatasetSampler(read(data), 256, seed=1)
    algo = build_iql(IQLConfig(batch_size=64, **config), sampler, ModelConfig(hidden=(16, 16)), torch.device("cpu"), 0)
    return algo, sampler


def test_a_scaled_update_is_the_update_on_scaled_rewards(data: Path) -> None:
    scaled, sampler = _iql(data)
    scaled.reward_scale = 1000.0 / 10.5
    batch = sampler.collect()
    plain, _ = _iql(data)
    by_hand = batch.clone()
    by_hand["reward"] = batch["reward"] * (1000.0 / 10.5)
    m_scaled, m_plain = scaled.update(batch), plain.update(by_hand)
    assert m_scaled == m_plain
    for a, b in zip(scaled.learned.parameters(), plain.learned.parameters(), strict=True):
        assert torch.equal(a, b)
    assert m_scaled["iql/q_mean"] != _iql(data)[0].update(batch)["iql/q_mean"]  # the scale does change the update


def test_the_actor_lr_after_k_of_n_steps_is_the_cosine(data: Path) -> None:
    algo, sampler = _iql(data, actor_lr_schedule="cosine", lr=3e-4, critic_lr=1e-3)
    n = 10
    algo.set_progress(0, n * 64)  # the run: 10 gradient steps of 64 transitions
    groups = algo.optimizer.param_groups
    for k in (0, 3, 7, n):
        while algo.num_updates < k:
            algo.update(sampler.collect(64))
        assert algo.actor_lr() == pytest.approx(3e-4 * 0.5 * (1 + math.cos(math.pi * k / n)), rel=1e-12, abs=0)
        if k:  # the step just taken used the rate of step k - 1; the value and the critics keep theirs
            assert groups[2]["lr"] == pytest.approx(3e-4 * 0.5 * (1 + math.cos(math.pi * (k - 1) / n)), rel=1e-12)
            assert (groups[0]["lr"], groups[1]["lr"]) == (1e-3, 3e-4)
    assert algo.actor_lr() == pytest.approx(0.0, abs=1e-20)  # k = N: decayed to zero
    constant, _ = _iql(data, lr=3e-4)
    constant.set_progress(0, n * 64)
    constant.update(sampler.collect(64))
    assert constant.optimizer.param_groups[2]["lr"] == 3e-4


BOTH = ["--algo.reward-scale", "return-range", "--algo.actor-lr-schedule", "cosine"]


def test_a_killed_run_with_both_resumes_exactly(data: Path, tmp_path: Path) -> None:
    args = [
        "--data.dataset", str(data), *BOTH, "--algo.normalize-obs", "true", "--trainer.total-steps", "4096",
        "--collector.steps", "256", "--algo.batch-size", "64", "--trainer.eval-every", "2048",
        "--trainer.eval-episodes", "1", "--env.eval-envs", "1", "--save-every", "1024",
    ]  # fmt: skip
    _, b = assert_killed_run_resumes_exactly("pendulum-iql", args, tmp_path, "iteration:10")
    events = (b / "events.jsonl").read_text()
    assert "resume is exact" in events
    # the scale is recorded in the run and kept in its state; pendulum-iql's lr 1e-3 decayed over the 64 steps
    recorded = [json.loads(line) for line in events.splitlines() if "reward_scale" in line]
    assert recorded and all(r["reward_scale"] == 1000.0 / 10.5 and r["episodes"] == 4 for r in recorded)
    assert load_checkpoint(b)[0]["algo"]["reward_scale"] == 1000.0 / 10.5
    lrs = [r["iql/actor_lr"] for r in read_metrics(b) if "iql/actor_lr" in r]
    assert lrs[-1] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 63 / 64)), rel=1e-12)
    # evaluation stays in the env's units: Pendulum's returns are negative, never 1000 / 10.5 times larger
    assert all(-2000 < r["eval/return_mean"] < 0 for r in read_metrics(b) if "eval/return_mean" in r)
    config = json.loads((b / "config.json").read_text())["algo"]
    assert (config["reward_scale"], config["actor_lr_schedule"]) == ("return-range", "cosine")

    # an online continuation takes the scale with the offline run's state and records the setting
    cfg = RECIPES["pendulum-iql-online"].make()
    cfg.warm_start = OnlineStartConfig(run=str(b))
    cfg.check()
    assert cfg.algo.reward_scale == "return-range"
    trainer = build_trainer(cfg)
    try:
        assert trainer.algo.inner.reward_scale == 1000.0 / 10.5
    finally:
        trainer.close()


def test_what_cannot_scale_or_decay_is_refused(data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = ["--run-dir", str(tmp_path / "never")]
    err = train_error(capsys, "pendulum-iql-online", "--algo.reward-scale", "return-range", *out)
    assert "add --warm-start.run DIR or drop --algo.reward-scale" in err
    with pytest.raises(ConfigError, match=r"drop --algo\.actor-lr-schedule"):
        IQLOnlineConfig(actor_lr_schedule="cosine")
    flat = tmp_path / "flat"
    rng = np.random.default_rng(1)
    env = gym.make("Pendulum-v1")
    write(flat, [_episode(_rewards(3.0, 20), rng)] * 2, env.observation_space, env.action_space, "t/flat-v0", {},
          "Pendulum-v1")  # fmt: skip
    env.close()
    err = train_error(capsys, "pendulum-iql", "--data.dataset", str(flat), "--algo.reward-scale", "return-range", *out)
    assert "needs episodes of different returns" in err
    # TD3 learns from the env's rewards: a TD3+BC run whose critics learned scaled ones is no start for it
    scaled = tmp_path / "td3-bc"
    short = ["--trainer.total-steps", "2048", "--trainer.eval-every", "2048", "--trainer.eval-episodes", "1"]
    args = ["--data.dataset", str(data), "--algo.reward-scale", "return-range", *short, "--run-dir", str(scaled)]
    assert main(["train", "pendulum-td3-bc", *args, "--no-progress"]) == 0
    capsys.readouterr()
    err = train_error(capsys, "pendulum-td3", "--warm-start.run", str(scaled), *out)
    assert "scaled its rewards" in err and "warm-start from a run without reward scaling" in err
    assert not (tmp_path / "never").exists()
