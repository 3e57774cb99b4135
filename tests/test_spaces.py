"""Every gymnasium space a user can hand in: observations adapted by ``make`` (one-hot, concatenated, flattened),
actions taken by PPO's ActorCritic (and DQN for Discrete), and one clear line for what no network takes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from pickaxe.algos.configs import DQNConfig, PPOConfig
from pickaxe.algos.dqn import build_dqn
from pickaxe.algos.ppo import build_ppo
from pickaxe.cli import main
from pickaxe.envs.make import make
from pickaxe.envs.spaces import SpaceError, check_action_space
from pickaxe.rollout.collector import Collector
from pickaxe.train.config import ModelConfig

ENV_ID = "PickaxeSpacesTest-v0"


class SpacesEnv(gym.Env):
    """Observations drawn from ``observation_space`` (seeded); reward 1 when the action's first entry is 0; 5 steps."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.t = 0
        self.last_obs: Any = None

    def _obs(self) -> Any:
        self.last_obs = self.observation_space.sample()
        return self.last_obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        assert self.action_space.contains(np.asarray(action, dtype=self.action_space.dtype)), action
        self.t += 1
        reward = float(np.asarray(action).flat[0] == 0)
        return self._obs(), reward, False, self.t >= 5, {}


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=SpacesEnv)

BOX2 = spaces.Box(-1.0, 1.0, (2,), np.float32)
OBSERVATIONS = {
    "discrete": (spaces.Discrete(5), 5),
    "multidiscrete": (spaces.MultiDiscrete([2, 3]), 5),
    "multibinary": (spaces.MultiBinary(4), 4),
    "dict": (spaces.Dict(a=spaces.Discrete(3), b=BOX2), 5),
    "tuple": (spaces.Tuple((spaces.Discrete(2), spaces.MultiBinary(3))), 5),
    "nested": (spaces.Dict(a=spaces.Tuple((spaces.Discrete(2), BOX2)), b=spaces.MultiDiscrete([2])), 6),
    "image-in-dict": (spaces.Dict(img=spaces.Box(0, 255, (3, 4, 4), np.uint8), x=BOX2), 50),
}


def _envs(obs_space: gym.Space, act_space: gym.Space, n: int = 2):
    return make(ENV_ID, n, 0, observation_space=obs_space, action_space=act_space)


@pytest.mark.parametrize("name", sorted(OBSERVATIONS))
def test_observations_are_flattened_to_float_vectors(name: str) -> None:
    space, size = OBSERVATIONS[name]
    envs = _envs(space, spaces.Discrete(2))
    try:
        assert envs.single_observation_space == spaces.Box(
            envs.single_observation_space.low, envs.single_observation_space.high, (size,), np.float32
        )
        obs, _ = envs.reset()
        raw = envs.env.envs[0].unwrapped.last_obs
        assert obs.dtype == np.float32 and obs.shape == (2, size)
        np.testing.assert_array_equal(obs[0], spaces.flatten(space, raw).astype(np.float32))
    finally:
        envs.close()


def test_discrete_observation_is_one_hot() -> None:
    envs = make("FrozenLake-v1", 1, 0)
    try:
        obs, _ = envs.reset()
        np.testing.assert_array_equal(obs[0], np.eye(16, dtype=np.float32)[0])  # FrozenLake starts in state 0
    finally:
        envs.close()


def _collect_and_update(algo: Any, envs: Any, steps: int = 32) -> dict[str, float]:
    collector = Collector(envs, algo.policy, steps=steps)
    batch = collector.collect()
    return batch, algo.update(batch)


@pytest.mark.parametrize("name", ["discrete", "dict", "tuple", "multibinary"])
def test_ppo_and_dqn_update_on_each_observation_kind(name: str) -> None:
    space, _ = OBSERVATIONS[name]
    envs = _envs(space, spaces.Discrete(3))
    try:
        torch.manual_seed(0)
        ppo = build_ppo(PPOConfig(epochs=1, minibatch_size=16), envs, ModelConfig(hidden=(8,)), torch.device("cpu"), 0)
        _, metrics = _collect_and_update(ppo, envs)
        assert np.isfinite(metrics["loss/value"]) and metrics["ppo/gradient_steps"] == 2
        dqn = build_dqn(
            DQNConfig(learning_starts=0, batch_size=8, buffer_size=64), envs, ModelConfig(hidden=(8,)), "cpu", 0
        )
        _, metrics = _collect_and_update(dqn, envs)
        assert np.isfinite(metrics["loss/q"])
    finally:
        envs.close()


@pytest.mark.parametrize(
    "act_space", [spaces.MultiDiscrete([3, 2]), spaces.MultiDiscrete([2, 4], start=[1, -2]), spaces.MultiBinary(3)]
)
def test_ppo_acts_and_learns_in_multi_action_spaces(act_space: gym.Space) -> None:
    envs = _envs(BOX2, act_space)
    try:
        torch.manual_seed(0)
        ppo = build_ppo(PPOConfig(epochs=2, minibatch_size=16), envs, ModelConfig(hidden=(8,)), torch.device("cpu"), 0)
        batch, metrics = _collect_and_update(ppo, envs)  # every action went through the env's contains() check
        assert batch["action"].shape == (16, 2, *act_space.shape)
        assert np.isfinite(metrics["loss/value"]) and metrics["loss/entropy"] > 0
        logprob, _, _ = ppo.policy.evaluate_actions(batch["obs"].flatten(0, 1), batch["action"].flatten(0, 1))
        assert logprob.shape == (32,) and (logprob < 0).all()
    finally:
        envs.close()


def test_unsupported_observation_space_is_one_line() -> None:
    with pytest.raises(SpaceError, match=r"observations of space Text \(inside Dict\) cannot feed a network; fix"):
        _envs(spaces.Dict(a=spaces.Text(5), b=BOX2), spaces.Discrete(2))


def test_unsupported_action_spaces_name_the_fix() -> None:
    with pytest.raises(SpaceError, match="actions of space Text are not supported; fix: wrap the env"):
        check_action_space(spaces.Text(4), "ppo")
    with pytest.raises(SpaceError, match=r"dqn takes Discrete actions, .* has Box actions; fix: .*ppo or sac recipe"):
        check_action_space(BOX2, "dqn")
    with pytest.raises(SpaceError, match=r"dqn takes Discrete actions.*MultiDiscrete.*a ppo recipe"):
        check_action_space(spaces.MultiDiscrete([2, 2]), "dqn")
    check_action_space(spaces.MultiBinary(2), "ppo")  # PPO takes it


def _error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_cli_refuses_spaces_before_making_a_run_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    err = _error_line(capsys, ["train", "cartpole-dqn", "--env.id", "Pendulum-v1", "--run-dir", str(run_dir)])
    assert "dqn takes Discrete actions" in err and not run_dir.exists()
    text_env = "PickaxeTextObs-v0"
    if text_env not in gym.registry:
        gym.register(text_env, entry_point=SpacesEnv, kwargs={"observation_space": spaces.Text(5)})
    bad_kwargs = ["--env.kwargs", '{"action_space_n": 2}']
    err = _error_line(capsys, ["train", "cartpole-ppo", "--env.id", text_env, *bad_kwargs, "--run-dir", str(run_dir)])
    assert "keyword arguments" in err and not run_dir.exists()
    gym.registry[text_env].kwargs["action_space"] = spaces.Discrete(2)
    err = _error_line(capsys, ["train", "cartpole-ppo", "--env.id", text_env, "--run-dir", str(run_dir)])
    assert "observations of space Text cannot feed a network" in err and not run_dir.exists()


def test_cartpole_dqn_trains_on_frozen_lake(tmp_path: Path) -> None:
    run_dir = tmp_path / "fl"
    argv = ["train", "cartpole-dqn", "--env.id", "FrozenLake-v1", "--trainer.total-steps", "1536"]
    argv += ["--trainer.eval-every", "1536", "--trainer.eval-episodes", "2", "--env.eval-envs", "2"]
    argv += ["--algo.learning-starts", "512", "--algo.gradient-steps", "8", "--run-dir", str(run_dir)]
    assert main(argv) == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 1536 and "eval/return_mean" in records[-1]
    assert any(np.isfinite(r.get("loss/q", np.nan)) for r in records)  # gradient steps were taken
