"""A classic run's policy loaded from its folder, ready to act: what ``pickaxe.load`` returns for classic runs.

:class:`ClassicPolicy` rebuilds the run's networks from its ``config.json`` as training built them, loads the chosen
weights through :func:`pickaxe.runs.model.load_model` (digests verified; the observation statistics of
``normalize_obs`` are buffers of those weights, so observations are normalised as in training) and acts on one
observation or a batch, in the run's own eval envs (:meth:`ClassicPolicy.evaluate`: the numbers the run logged for
the same weights) or in any gymnasium env (:meth:`ClassicPolicy.play`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pickaxe.algos.base import Algorithm
from pickaxe.algos.multiagent_configs import is_multiagent
from pickaxe.envs.make import make, split_env_id
from pickaxe.envs.spaces import GoalBox, adapt_observations, goal_vector
from pickaxe.errors import PickaxeError
from pickaxe.models.recurrent import is_recurrent
from pickaxe.runs.model import checkpoint_choice, load_model
from pickaxe.runs.policies import acting_networks
from pickaxe.train.build import build_algorithm, run_eval_envs
from pickaxe.train.config import TrainConfig
from pickaxe.train.evaluate import evaluate
from pickaxe.utils import resolve_device, set_torch_threads

__all__ = ["ClassicPolicy", "Episodes"]


@dataclass(frozen=True)
class Episodes:
    """Whole episodes played by a policy: each one's return and length, in the order they ended."""

    returns: np.ndarray
    lengths: np.ndarray

    @property
    def mean_return(self) -> float:
        """The mean episode return (NaN for no episode)."""
        return float(np.mean(self.returns)) if len(self.returns) else float("nan")


class ClassicPolicy:
    """A classic run's policy at one checkpoint (see the module docstring). ``act`` takes observations as the run's
    env gives them: one (the env's observation shape, or any observation of a Discrete/Dict/Tuple space, flattened as
    training flattened it, or already flattened) or a batch of them (a leading axis; a list for non-Box spaces) and
    returns actions as numpy (one action, or a batch). A recurrent policy carries its memory from call to call
    (``reset()`` clears it).
    """

    def __init__(self, run_dir: Path, config: TrainConfig, algo: Algorithm, which: str | int, device: torch.device,
                 raw_space: gym.Space, space: gym.Space, action_space: gym.Space) -> None:  # fmt: skip
        self.run_dir = run_dir
        self.config = config
        self.algo = algo
        self.checkpoint = which
        self.device = device
        self.raw_observation_space = raw_space
        """The env's own observation space."""
        self.observation_space = space
        """What the network takes (a non-Box space flattened to float32)."""
        self.action_space = action_space
        self._state: Any = None
        self._batch = 0

    @classmethod
    def load(cls, run_dir: str | Path, config: TrainConfig, checkpoint: str | int = "best",
             device: str | torch.device = "cpu") -> ClassicPolicy:  # fmt: skip
        """``config``'s networks (the run's ``config.json``) with the weights of ``checkpoint`` of ``run_dir``
        (``"final"``, ``"latest"``, ``"best"`` or an env step, as :func:`pickaxe.runs.model.load_model` takes it),
        verified, on ``device``. A missing or damaged weights file is a one-line ``PickaxeError``, and so is a
        multi-agent run (its policies act for several agents at once: ``pickaxe.load`` gives a
        ``MultiAgentPolicy``)."""
        if is_multiagent(config.algo):
            raise PickaxeError(
                f"{config.algo_name()} is a multi-agent run: load it with pickaxe.load (a MultiAgentPolicy, acting "
                "for every agent at once), not ClassicPolicy.load"
            )
        run_dir = Path(run_dir)
        which = checkpoint_choice(checkpoint)
        set_torch_threads(config.torch_threads)
        dev = resolve_device(device)
        config = replace(config, device=str(dev))  # the networks are built on it
        envs = make(config.env.id, 1, 0, evaluation=True, **config.env.kwargs)
        try:
            space, action_space = envs.single_observation_space, envs.single_action_space
            algo = build_algorithm(config, envs)
        finally:
            envs.close()
        raw = _raw_observation_space(config, space)
        try:
            load_model(run_dir, acting_networks(algo.networks()), dev, checkpoint=which)
        except FileNotFoundError as e:  # a file that vanished under us: the same one line
            raise PickaxeError(str(e)) from None
        return cls(run_dir, config, algo, which, dev, raw, space, action_space)

    @property
    def module(self) -> nn.Module:
        """The policy network (an ``nn.Module`` with ``act(obs_tensor, deterministic)``)."""
        return self.algo.policy

    def reset(self) -> None:
        """Forget a recurrent policy's memory (the next ``act`` starts episodes afresh); nothing for others."""
        self._state = None

    def _as_batch(self, obs: Any) -> tuple[np.ndarray, bool]:
        """``obs`` as a float32 ``[B, *shape]`` array in the network's space, and whether it was one observation."""
        raw = self.raw_observation_space
        shape = tuple(self.observation_space.shape)
        flat_already = isinstance(obs, np.ndarray) and obs.shape[obs.ndim - len(shape) :] == shape
        if raw is not self.observation_space and not flat_already:
            single = raw.contains(obs) if not isinstance(obs, list) else False
            items = [obs] if single else list(obs)
            goals = isinstance(self.observation_space, GoalBox)  # laid out by GoalObservation, not in key order
            flat = np.stack([goal_vector(o) if goals else gym.spaces.flatten(raw, o) for o in items])
            flat = flat.astype(np.float32)
            return flat, single
        array = np.asarray(obs, dtype=np.float32)
        if array.shape == shape:
            return array[None], True
        if array.shape[1:] == shape:
            return array, False
        raise PickaxeError(
            f"act takes one observation of shape {shape} or a batch of shape (B, {', '.join(map(str, shape))}), "
            f"got shape {array.shape}"
        )

    def act(self, obs: Any, deterministic: bool = True) -> Any:
        """The action for one observation, or the actions for a batch (numpy; actions of a Box space clipped to its
        bounds, as evaluation clips them). ``deterministic=False`` samples from the policy instead."""
        batch, single = self._as_batch(obs)
        x = torch.as_tensor(batch, device=self.device)
        with torch.no_grad():
            if is_recurrent(self.module):
                if self._state is None or self._batch != len(batch):
                    self._state, self._batch = self.module.initial_state(len(batch), self.device), len(batch)
                action, _, self._state = self.module.act_recurrent(x, self._state, deterministic=deterministic)
            else:
                action, _ = self.module.act(x, deterministic=deterministic)
        actions = action.cpu().numpy()
        if isinstance(self.action_space, gym.spaces.Box):
            actions = np.clip(actions, self.action_space.low, self.action_space.high)
        return actions[0] if single else actions

    def evaluate(self, episodes: int | None = None) -> Episodes:
        """Play ``episodes`` (default the run's ``trainer.eval_episodes``) in the run's own eval envs (its eval seed
        and count): the returns the run logged as ``eval/return_mean`` for the same weights."""
        episodes = episodes or self.config.trainer.eval_episodes
        envs = run_eval_envs(self.config)
        try:
            returns, lengths = evaluate(self.module, envs, episodes, self.device)
        finally:
            envs.close()
        return Episodes(returns, lengths)

    def play(self, env: gym.Env | None = None, episodes: int = 1, seed: int | None = 0,
             deterministic: bool = True) -> Episodes:  # fmt: skip
        """Play ``episodes`` whole episodes in ``env`` (a gymnasium env, e.g. made with ``render_mode="human"``; its
        observations are flattened as training flattened them; default: the run's env, made here and closed) and
        return their returns and lengths. Episode ``k`` starts from ``env.reset(seed=seed + k)`` (``seed`` None:
        unseeded)."""
        own = env is None
        if env is None:
            env_id = split_env_id(self.config.env.id)[1]
            make(self.config.env.id, 1, 0, **self.config.env.kwargs).close()  # imports a module:EnvId's module
            env = adapt_observations(gym.make(env_id, **self.config.env.kwargs))
        returns, lengths = [], []
        try:
            for k in range(episodes):
                self.reset()
                obs, _ = env.reset(seed=None if seed is None else seed + k)
                total, length, done = 0.0, 0, False
                while not done:
                    obs, reward, terminated, truncated, _ = env.step(self._env_action(obs, deterministic))
                    total += float(reward)
                    length += 1
                    done = bool(terminated or truncated)
                returns.append(total)
                lengths.append(length)
        finally:
            if own:
                env.close()
        return Episodes(np.array(returns), np.array(lengths))

    def _env_action(self, obs: Any, deterministic: bool) -> Any:
        action = self.act(obs, deterministic)
        return action.item() if isinstance(self.action_space, gym.spaces.Discrete) else action

    def __repr__(self) -> str:
        return (f"ClassicPolicy({str(self.run_dir)!r}, checkpoint={self.checkpoint!r}, "
                f"algo={self.config.algo_name()!r}, env={self.config.env.id!r})")  # fmt: skip


def _raw_observation_space(config: TrainConfig, adapted: gym.Space) -> gym.Space:
    """The env's own observation space (before pickaxe flattened it); ``adapted`` when that is the env's own."""
    kwargs = {k: v for k, v in config.env.kwargs.items() if k != "atari_wrappers"}
    try:
        env = gym.make(split_env_id(config.env.id)[1], **kwargs)
    except Exception:  # an env that only pickaxe's backends make: its observations are the adapted ones
        return adapted
    try:
        return adapted if isinstance(env.observation_space, gym.spaces.Box) else env.observation_space
    finally:
        env.close()
