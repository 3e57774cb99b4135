"""What every offline algorithm shares (``OfflineAlgorithm``: a batch of dataset transitions cut into minibatches,
one guarded gradient step each) and behaviour cloning (``BC``) on it.

The batch comes from the dataset sampler (``pickaxe.offline.sampler``), never from a replay buffer: the dataset is
the replay, so ``update`` only learns. Each algorithm's gradient step is one backward pass and one fused Adam step
over all its networks (parameter groups with their own learning rates; each loss reaches only its own parameters),
read once on the host by ``clip_and_step``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pickaxe.algos.base import Algorithm, clear_grads, clip_and_step
from pickaxe.algos.core import adam, discounts
from pickaxe.algos.offline_configs import BCConfig
from pickaxe.algos.offline_core import bc_squared_error, categorical_nll, gaussian_nll
from pickaxe.algos.sac import SACPolicy
from pickaxe.algos.td3 import TD3Policy
from pickaxe.data.batch import Batch
from pickaxe.errors import ConfigError
from pickaxe.models.continuous import ActionScale, CategoricalActor, DeterministicActor, GaussianActor, box_action_dim
from pickaxe.models.mlp import single_spaces
from pickaxe.models.normalize import frozen_obs_norm


def split_minibatches(batch: Batch | dict[str, torch.Tensor], batch_size: int) -> list[dict[str, torch.Tensor]]:
    """``batch`` (1-D, or any shape: flattened; or a dict of 1-D fields of one length) cut into consecutive
    minibatches of ``batch_size`` as plain tensors (a last shorter one is kept)."""
    flat = batch if isinstance(batch, dict) or batch.batch_dims == 1 else batch.reshape(-1)
    keys = list(flat.keys())
    parts = {k: flat[k].split(batch_size) for k in keys}
    return [{k: parts[k][i] for k in keys} for i in range(len(parts[keys[0]]))]


class OfflineAlgorithm(Algorithm):
    """An algorithm that learns from dataset batches: subclasses set ``learned`` (every trained parameter, one
    module), ``optimizer``, ``prefix`` and ``metric_names``, and define ``losses(mb) -> (total, stats)`` (``stats``:
    one value per metric name) and, optionally, ``after_step`` (target updates) and ``set_learning_rates``."""

    prefix = "offline"
    metric_names: tuple[str, ...] = ()
    learned: nn.Module
    optimizer: torch.optim.Optimizer
    num_updates = 0
    reward_scale = 1.0
    """Every minibatch's rewards are multiplied by this before ``losses`` (``reward_scale return-range``: the offline
    trainer sets it from the dataset once; part of the state, so a resume and an online continuation keep it)."""

    def losses(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss to minimise, detached stats [len(metric_names)])`` of one minibatch."""
        raise NotImplementedError

    def after_step(self) -> None:
        """After every gradient step (targets' Polyak updates)."""

    def set_learning_rates(self) -> None:
        """Read the learning rates afresh before every gradient step (``pickaxe set``, schedules); the default sets
        every group to ``config.lr``."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.lr

    def update(self, batch: Batch) -> dict[str, float]:
        """One gradient step per ``batch_size`` transitions of ``batch``; metrics are means over the steps.

        What every step would compute again from the dataset's fields is computed here for the whole batch at
        once, element by element, so the values each minibatch would compute: with Box actions the actions in the
        policy's ``[-1, 1]`` box (``unit_action``), and for TD targets the ``discount`` ``gamma * (1 -
        terminated)`` (``core.discounts``)."""
        flat = batch if batch.batch_dims == 1 else batch.reshape(-1)
        fields = dict(flat.items())
        scale = getattr(self.policy, "scale", None)
        if scale is not None:
            fields["unit_action"] = scale.to_unit(fields["action"])
        gamma = getattr(self.config, "gamma", None)
        if gamma is not None:
            fields["discount"] = discounts(fields["reward"], fields["terminated"], gamma)
        return self.learn(split_minibatches(fields, self.config.batch_size))

    def unit_action(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """The minibatch's actions in the policy's ``[-1, 1]`` box: ``update``'s ``unit_action``, or computed here
        (minibatches from a replay buffer)."""
        unit = mb.get("unit_action")
        return self.policy.scale.to_unit(mb["action"]) if unit is None else unit

    def learn(self, minibatches: Iterable[dict[str, torch.Tensor]]) -> dict[str, float]:
        """One guarded gradient step per minibatch (from a dataset batch, or a replay buffer when the algorithm
        trains online); metrics are means over the steps."""
        cfg = self.config
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
        sums, steps, name = np.zeros(len(self.metric_names) + 1), 0, f"{self.prefix} loss"
        for mb in minibatches:
            self.set_learning_rates()
            if self.reward_scale != 1.0:
                mb = {**mb, "reward": mb["reward"] * self.reward_scale}
            total, stats = self.losses(mb)
            clear_grads(self.optimizer)
            total.backward()
            sums += clip_and_step(self.learned, self.optimizer, max_norm, sums=stats, name=name)
            self.after_step()
            self.num_updates += 1
            steps += 1
        names = (f"{self.prefix}/grad_norm", *self.metric_names)
        return {k: float(v) for k, v in zip(names, sums / max(steps, 1), strict=True)}

    def state_dict(self) -> dict[str, Any]:
        """Every network, the optimizer, the update counter and the reward scale."""
        return {
            **{name: net.state_dict() for name, net in self.networks().items()},
            "learned": self.learned.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "num_updates": self.num_updates,
            "reward_scale": self.reward_scale,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (a state saved before the reward scale existed: 1)."""
        for name, net in self.networks().items():
            net.load_state_dict(state[name])
        self.learned.load_state_dict(state["learned"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.num_updates = int(state["num_updates"])
        self.reward_scale = float(state.get("reward_scale", 1.0))


class BC(OfflineAlgorithm):
    """Behaviour cloning: the policy maximises the likelihood of the dataset's actions (categorical on Discrete,
    Gaussian with a tanh mean on Box, in the normalised box ``[-1, 1]^A``); given a ``DeterministicActor`` (Box,
    ``box_loss mse``) it regresses the actions by their squared error instead."""

    prefix = "bc"

    def __init__(self, actor: nn.Module, action_space: gym.Space, config: BCConfig | None = None) -> None:
        self.config = cfg = config or BCConfig()
        self.regression = isinstance(actor, DeterministicActor)
        self.policy = TD3Policy(actor, action_space, noise=0.0) if self.regression else SACPolicy(actor, action_space)
        self.discrete = not self.regression and self.policy.discrete
        self.metric_names = ("loss/policy", "bc/accuracy" if self.discrete else "bc/mean_sq_error")
        self.actor = actor
        self.learned = actor
        self.policy.to(next(actor.parameters()).device)
        self.optimizer = adam(list(actor.parameters()), lr=cfg.lr)

    def losses(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Negative log-likelihood, or the squared error of a deterministic actor; the second stat is the greedy
        accuracy (Discrete) or the mean's (the action's) squared error (Box)."""
        if self.regression:
            loss = bc_squared_error(self.actor(mb["obs"]), self.unit_action(mb))
            with torch.no_grad():
                return loss, torch.stack([loss, loss])
        if self.discrete:
            logprobs = self.actor(mb["obs"])
            loss = categorical_nll(logprobs, mb["action"])
            with torch.no_grad():  # reported only: no graph for it
                return loss, torch.stack([loss, (logprobs.argmax(-1) == mb["action"].long()).float().mean()])
        mean, log_std = self.actor(mb["obs"])
        a = self.unit_action(mb)
        loss = gaussian_nll(mean, log_std, a)
        with torch.no_grad():
            return loss, torch.stack([loss, (mean - a).pow(2).mean()])

    def networks(self) -> dict[str, nn.Module]:
        """The actor (what acts)."""
        return {"actor": self.actor}


def actor_for(obs_space: gym.Space, action_space: gym.Space, model: Any, regression: bool = False) -> nn.Module:
    """A likelihood policy for ``action_space``: ``CategoricalActor`` (Discrete) or ``GaussianActor`` (Box, bounded);
    with ``regression`` (Box actions) a ``DeterministicActor`` instead."""
    hidden, activation = tuple(model.hidden), model.activation
    if isinstance(action_space, gym.spaces.Discrete):
        return CategoricalActor(obs_space, int(action_space.n), hidden, activation)
    dim = box_action_dim(action_space)
    ActionScale(action_space)  # refuses unbounded Boxes before anything is built
    return (DeterministicActor if regression else GaussianActor)(obs_space, dim, hidden, activation)


def build_bc(config: BCConfig, envs: Any, model: Any, device: torch.device, seed: int) -> BC:
    """Behaviour cloning sized from ``envs``' spaces (or a dataset sampler's) with ``model``'s hidden sizes: the
    likelihood policy of ``actor_for``, or with ``box_loss mse`` a ``DeterministicActor`` (Box actions only)."""
    obs_space, action_space = single_spaces(envs)
    regression = config.box_loss == "mse"
    if regression and not isinstance(action_space, gym.spaces.Box):
        raise ConfigError(
            f"--algo.box-loss mse regresses Box actions; this dataset's are {type(action_space).__name__}; fix: "
            "drop --algo.box-loss (Discrete actions are cloned by their likelihood)"
        )
    actor = actor_for(obs_space, action_space, model, regression)
    normalized_inputs(config, obs_space, actor)
    return BC(actor.to(device), action_space, config)


def normalized_inputs(config: Any, obs_space: gym.Space, *nets: nn.Module) -> None:
    """With ``config.normalize_obs``: frozen dataset statistics in front of every network of ``nets``
    (``models.normalize.frozen_obs_norm``; the offline trainer fits them to the dataset, a weights file loads them).
    Called before an algorithm copies its targets, so they carry the statistics too."""
    if getattr(config, "normalize_obs", False):
        frozen_obs_norm(obs_space, *nets)
