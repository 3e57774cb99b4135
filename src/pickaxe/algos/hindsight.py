"""The replay an off-policy algorithm (SAC, TD3, DDPG, REDQ) keeps: uniform, or with ``--algo.her`` hindsight
experience replay (``pickaxe.data.hindsight``) wired to the env's own goal functions."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch

from pickaxe.data.buffers import ReplayBuffer
from pickaxe.data.hindsight import GoalFunction, GoalLayout, HindsightReplay
from pickaxe.envs.spaces import GOAL_KEYS, GoalBox, SpaceError
from pickaxe.models.mlp import single_spaces


def goal_functions(envs: Any) -> tuple[GoalFunction, GoalFunction | None]:
    """The env's ``compute_reward`` and ``compute_terminated`` (None when it has none): the first sub-env's, when the
    sub-envs live in this process, else those of one env made here from the sub-envs' spec."""
    inner = getattr(getattr(envs, "unwrapped", envs), "envs", None)
    if inner:
        env = inner[0].unwrapped
    else:
        spec = envs.get_attr("spec")[0]
        env = gym.make(spec).unwrapped
    reward = getattr(env, "compute_reward", None)
    if reward is None:
        raise SpaceError(
            f"hindsight replay needs the env's compute_reward(achieved_goal, desired_goal, info); "
            f"{type(env).__name__} has none: use --algo.her none"
        )
    return reward, getattr(env, "compute_terminated", None)


def replay_for(config: Any, envs: Any, device: torch.device, seed: int) -> ReplayBuffer | HindsightReplay:
    """``config.her`` (``future``, ``final``, ``episode``) on a goal env: a ``HindsightReplay`` of
    ``config.buffer_size`` transitions over ``envs``' sub-envs; ``none``: the uniform ``ReplayBuffer``."""
    strategy = getattr(config, "her", "none")
    if strategy == "none":
        return ReplayBuffer(config.buffer_size, seed=seed, device=device)
    obs_space, _ = single_spaces(envs)
    if not isinstance(obs_space, GoalBox):
        raise SpaceError(
            f"--algo.her {strategy} needs goal observations (a Dict of {', '.join(GOAL_KEYS)}), the env gives "
            f"{obs_space}; use --algo.her none"
        )
    reward, terminated = goal_functions(envs)
    return HindsightReplay(
        config.buffer_size,
        envs.num_envs,
        GoalLayout(obs_space.observation, obs_space.goal),
        reward,
        terminated,
        strategy=strategy,
        k=config.her_k,
        seed=seed,
        device=device,
    )
