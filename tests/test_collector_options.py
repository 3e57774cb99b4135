"""Each branch of the Collector takes effect: action clipping, one-step rollouts, counters, extras, dtypes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from pickaxe.rollout.collector import Collector


class CountEnv(gym.Env):
    """Float64 observations ``[t, last action]``, reward = the action it received, episodes of ``length`` steps."""

    def __init__(self, length: int = 3, low: float = -1.0, high: float = 1.0) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float64)
        self.action_space = gym.spaces.Box(low, high, shape=(1,), dtype=np.float32)
        self.length = length
        self.received: list[float] = []
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, 0.0]), {}

    def step(self, action):
        a = float(np.asarray(action).reshape(-1)[0])
        self.received.append(a)
        self.t += 1
        return np.array([float(self.t), a]), a, False, self.t >= self.length, {}


class ConstantPolicy:
    """Always the same action; extras say which call produced them."""

    def __init__(self, action: float) -> None:
        self.action = action
        self.calls = 0

    def act(self, obs: torch.Tensor, deterministic: bool = False):
        self.calls += 1
        n = obs.shape[0]
        extra = {"logprob": torch.full((n,), -float(self.calls)), "value": torch.full((n,), 10.0 * self.calls)}
        return torch.full((n, 1), self.action), extra


def _envs(n: int = 2, **kwargs) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv([lambda: CountEnv(**kwargs) for _ in range(n)])


def test_box_actions_are_clipped_for_the_env_but_stored_as_sampled() -> None:
    envs = _envs(low=-0.5, high=0.5)
    batch = Collector(envs, ConstantPolicy(3.0), steps=4).collect()
    received = [a for env in envs.envs for a in env.received]
    assert received and all(a == pytest.approx(0.5) for a in received)  # the env never sees 3.0
    assert torch.all(batch["reward"] == 0.5)
    assert torch.all(batch["action"] == 3.0)  # log-probs belong to the sampled action, so it is what is stored


def test_one_step_per_env_rollouts_have_the_right_shape() -> None:
    collector = Collector(_envs(n=3), ConstantPolicy(0.25), steps=3)
    batch = collector.collect()
    assert batch.batch_size == torch.Size([1, 3])
    assert torch.equal(batch["next_obs"][0, :, 0], torch.ones(3, dtype=torch.float32))


def test_counters_episode_statistics_and_speed() -> None:
    collector = Collector(_envs(n=2, length=3), ConstantPolicy(0.5), steps=8)
    collector.collect()  # 4 steps per env: one episode of 3 steps each, one step into the next
    assert collector.total_steps == 8 and collector.total_episodes == 2
    assert collector.episodes == [(1.5, 3), (1.5, 3)]
    m = collector.metrics()
    assert m["rollout/return_mean"] == 1.5 and m["rollout/length_mean"] == 3.0 and m["rollout/episodes"] == 2.0
    assert m["time/collect_steps_per_s"] > 0
    collector.collect()  # steps 5-8: the second episodes end at step 6
    assert collector.total_steps == 16 and collector.total_episodes == 4
    assert collector.state_dict()["ep_length"].tolist() == [2, 2]


def test_policy_extras_are_stored_per_step_and_observations_are_float32() -> None:
    batch = Collector(_envs(n=2), ConstantPolicy(0.0), steps=6).collect()
    assert torch.equal(batch["logprob"][:, 0], torch.tensor([-1.0, -2.0, -3.0]))
    assert torch.equal(batch["value"][:, 1], torch.tensor([10.0, 20.0, 30.0]))
    assert batch["obs"].dtype == torch.float32 and batch["next_obs"].dtype == torch.float32
    # the third step ended the episode: next_obs holds the true final observation, obs the reset one
    assert batch["next_obs"][2, 0, 0] == 3.0 and batch["truncated"][2].all()
