"""Branching DQN: the branch Q-values' dueling form and padding, the TD target's combinations against hand values,
per-dimension exploration, the discretised action wrapper, learning a factored task and Pendulum (slow), exact
resume, and the action-space check naming the fix."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from pickaxe.algos.bdq import branching_loss, branching_target
from pickaxe.algos.extra_configs import BranchingDQNConfig
from pickaxe.envs.discretize import DiscretizeActions
from pickaxe.envs.spaces import SpaceError
from pickaxe.models.branching import BranchingEpsilonGreedy, BranchingQNetwork
from pickaxe.recipes import get_recipe
from pickaxe.train.build import build_trainer
from pickaxe.train.config import CollectorConfig, EnvConfig, ModelConfig, TrainConfig, TrainerConfig


def test_target_combines_the_dimensions_next_values_as_configured() -> None:
    # 2 transitions, 2 dimensions of 3 choices; the online net picks, the target net scores (double DQN per dimension)
    online = torch.tensor([[[0.0, 9.0, 1.0], [5.0, 0.0, 0.0]], [[1.0, 0.0, 0.0], [0.0, 0.0, 7.0]]])
    target = torch.tensor([[[10.0, 2.0, 30.0], [4.0, 50.0, 60.0]], [[6.0, 1.0, 1.0], [1.0, 1.0, -2.0]]])
    reward, discount = torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.0])  # the second transition terminated
    # chosen next values: [2, 4] and [6, -2]
    mean = branching_target(reward, discount, target, online, "mean")
    torch.testing.assert_close(mean, torch.tensor([[1.0 + 0.5 * 3.0] * 2, [0.0, 0.0]]))
    torch.testing.assert_close(branching_target(reward, discount, target, online, "max")[0], torch.tensor([3.0, 3.0]))
    torch.testing.assert_close(
        branching_target(reward, discount, target, online, "independent")[0], torch.tensor([2.0, 3.0])
    )
    q = torch.tensor([[[1.0, 2.0, 3.0], [0.0, 0.0, 4.0]]])
    loss = branching_loss(q, torch.tensor([[2, 2]]), torch.tensor([[1.0, 1.0]]))  # ((3 - 1)^2 + (4 - 1)^2) / 2
    assert loss.item() == pytest.approx(6.5)


def test_branch_q_values_are_dueling_per_dimension_and_padded_past_each_dimensions_choices() -> None:
    torch.manual_seed(0)
    net = BranchingQNetwork(gym.spaces.Box(-1, 1, (3,)), [2, 4], hidden=(8,))
    obs = torch.randn(5, 3)
    q = net(obs)
    assert q.shape == (5, 2, 4) and torch.isinf(q[:, 0, 2:]).all() and torch.isfinite(q[:, 1]).all()
    value = net.value(net.torso(net.encoder(obs)))
    # mean over each dimension's own choices is V(s): the advantages are centred
    torch.testing.assert_close(q[:, 0, :2].mean(-1), value.squeeze(-1))
    torch.testing.assert_close(q[:, 1].mean(-1), value.squeeze(-1))


def test_exploration_is_per_dimension_and_actions_keep_the_space_start() -> None:
    torch.manual_seed(0)
    space = gym.spaces.MultiDiscrete([2, 4], start=[1, -2])
    net = BranchingQNetwork(gym.spaces.Box(-1, 1, (3,)), [2, 4], hidden=(8,))
    policy = BranchingEpsilonGreedy(net, space, epsilon=0.5)
    obs = torch.zeros(4000, 3)
    greedy = policy.act(obs, deterministic=True)[0]
    assert (greedy == greedy[0]).all() and all(space.contains(a) for a in greedy[:5].numpy())
    acts = policy.act(obs)[0]
    assert all(space.contains(a) for a in acts[:50].numpy())
    differs = acts != greedy  # each dimension leaves the greedy choice with p = 0.5 * (1 - 1/n) on its own
    assert differs[:, 0].float().mean().item() == pytest.approx(0.25, abs=0.03)
    assert differs[:, 1].float().mean().item() == pytest.approx(0.375, abs=0.03)
    assert (differs[:, 0] & differs[:, 1]).float().mean().item() == pytest.approx(0.25 * 0.375, abs=0.02)


def test_discretized_actions_map_bins_to_the_box() -> None:
    env = DiscretizeActions(gym.make("Pendulum-v1"), bins=5)
    assert env.action_space == gym.spaces.MultiDiscrete([5])
    np.testing.assert_allclose(env.action(np.array([0])), [-2.0])
    np.testing.assert_allclose(env.action(np.array([3])), [1.0])
    made = gym.make("pickaxe/Discretized-v0", task="Pendulum-v1", bins=3)
    assert made.action_space == gym.spaces.MultiDiscrete([3])


class PickThree(gym.Env):
    """One-step task with 3 action dimensions of 4 choices: reward 1 per dimension whose choice matches the
    observation's one-hot target for it (max 3); 4^3 = 64 joint actions, 12 branch outputs."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0, 1, (12,), np.float32)
        self.action_space = gym.spaces.MultiDiscrete([4, 4, 4])
        self.goal = np.zeros(3, dtype=np.int64)

    def _obs(self) -> np.ndarray:
        obs = np.zeros(12, np.float32)
        obs[np.arange(3) * 4 + self.goal] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.goal = self.np_random.integers(0, 4, size=3)
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float((np.asarray(action) == self.goal).sum())
        return self._obs(), reward, True, False, {}


gym.register("pickaxe-test/PickThree-v0", entry_point=PickThree)


def test_bdq_learns_a_factored_task() -> None:
    # ~2 s: random play scores 0.75 per episode, the optimum 3
    cfg = TrainConfig(
        algo=BranchingDQNConfig(
            lr=3e-3, gamma=0.0, batch_size=64, learning_starts=256, gradient_steps=8, target_update_every=50,
            eps_fraction=0.3,
        ),
        env=EnvConfig(id="pickaxe-test/PickThree-v0", num_envs=4, eval_envs=4),
        model=ModelConfig(hidden=(32,), activation="relu"),
        collector=CollectorConfig(steps=32),
        trainer=TrainerConfig(total_steps=3_000, eval_every=3_000, eval_episodes=40, save_at_eval=False),
    )  # fmt: skip
    result = build_trainer(cfg).fit()
    assert result.eval_return > 2.7, result.eval_return


def _cfg(steps: int, **trainer):
    cfg = get_recipe("pendulum-bdq")
    cfg.env = replace(cfg.env, eval_envs=2)
    cfg.trainer = replace(cfg.trainer, total_steps=steps, eval_episodes=2, **trainer)
    return cfg


def test_bdq_resume_is_exact(tmp_path: Path) -> None:
    from classic_runs import assert_classic_resume_is_exact

    cfg = _cfg(512, eval_every=256, target_return=None)
    # a constant epsilon: the helper's first segment runs with total_steps=cut, which would rescale a decay
    cfg.algo = replace(
        cfg.algo, learning_starts=128, gradient_steps=4, target_update_every=6, eps_start=0.3, eps_end=0.3
    )
    records = assert_classic_resume_is_exact(cfg, tmp_path, cut=256)
    assert any("loss/q" in r for r in records)


@pytest.mark.slow
def test_pendulum_bdq_recipe_solves_pendulum() -> None:
    # ~25 s on 2 busy cores: seed 0 reaches -250 at its second evaluation (4,000 env steps)
    cfg = get_recipe("pendulum-bdq")
    cfg.trainer = replace(cfg.trainer, total_steps=8_000, save_at_eval=False, keep_policies=False)
    result = build_trainer(cfg).fit()
    assert result.solved_step is not None and result.eval_return >= -250, result.eval_return


def test_box_actions_are_refused_for_bdq_with_the_fix() -> None:
    cfg = get_recipe("pendulum-bdq")
    cfg.env = EnvConfig(id="Pendulum-v1", num_envs=4)
    with pytest.raises(SpaceError, match=r"bdq takes MultiDiscrete actions.*Box actions.*a ppo or sac recipe"):
        cfg.check()  # what `pickaxe train` runs before a run folder exists (one line, exit status 2)
