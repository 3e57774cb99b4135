"""Discrete batch-constrained Q-learning (Fujimoto et al. 2019, "Benchmarking batch deep reinforcement learning
algorithms") on dataset batches.

A Q-network with a Polyak target and a behaviour-cloning head (a second network's logits over the actions, trained
by cross-entropy on the dataset's actions with a small penalty on the logits, ``offline_core.bcq_imitation_loss``).
Both the TD target and acting take the argmax of Q only over the actions the head deems likely enough,
``pi_bc(a|s) / max_a' pi_bc(a'|s) >= threshold`` (``bcq_allowed``, ``bcq_argmax``): the target is
``r + gamma Q'(s', argmax_{allowed} Q(s', .))`` (the online network picks, the target evaluates, as double DQN), and the
TD loss is the Huber loss, as in the paper.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from pickaxe.algos.core import adam, td_target
from pickaxe.algos.offline import OfflineAlgorithm, normalized_inputs
from pickaxe.algos.offline_configs import BCQConfig
from pickaxe.algos.offline_core import bcq_allowed, bcq_argmax, bcq_imitation_loss
from pickaxe.errors import ConfigError
from pickaxe.models.continuous import polyak
from pickaxe.models.mlp import single_spaces
from pickaxe.models.q_network import QNetwork


class BCQPolicy:
    """Acts by ``bcq_argmax``: the highest-valued action among those the behaviour-cloning head lets through
    (deterministic; the filter reads ``config.threshold`` afresh at every call)."""

    def __init__(self, qnet: QNetwork, imitation: QNetwork, config: BCQConfig) -> None:
        self.qnet, self.imitation, self.config = qnet, imitation, config

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Filtered greedy actions ``[B]``; no extras."""
        logprobs = torch.log_softmax(self.imitation(obs), dim=-1)
        return bcq_argmax(self.qnet(obs), logprobs, self.config.threshold), {}


class _Learned(nn.Module):
    def __init__(self, qnet: QNetwork, imitation: QNetwork) -> None:
        super().__init__()
        self.qnet, self.imitation = qnet, imitation


class BCQ(OfflineAlgorithm):
    """Discrete BCQ: a filtered double-DQN target and a behaviour-cloning head, one fused Adam step."""

    prefix = "bcq"
    metric_names = ("loss/td", "loss/imitation", "bcq/q_mean", "bcq/allowed_fraction")

    def __init__(self, qnet: QNetwork, imitation: QNetwork, config: BCQConfig | None = None) -> None:
        self.config = cfg = config or BCQConfig()
        self.qnet, self.imitation = qnet, imitation
        self.learned = _Learned(qnet, imitation)
        self.target = copy.deepcopy(qnet).requires_grad_(False)
        self.policy = BCQPolicy(qnet, imitation, cfg)
        self.optimizer = adam(list(self.learned.parameters()), lr=cfg.lr)

    def losses(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Huber TD error to the filtered target plus the behaviour-cloning head's loss.

        Both networks run with a graph on ``s`` only: their values at ``s'`` pick the target's action and are
        constants to the loss, so they are computed without one (the backward pass then covers the minibatch's
        rows, not twice as many). The filter's mask is computed once, for the target and the reported fraction."""
        cfg = self.config
        obs, next_obs, action = mb["obs"], mb["next_obs"], mb["action"]
        q_all = self.qnet(obs)
        logits = self.imitation(obs)
        with torch.no_grad():
            next_logprobs = torch.log_softmax(self.imitation(next_obs), dim=-1)
            allowed = bcq_allowed(next_logprobs, cfg.threshold)
            next_a = bcq_argmax(self.qnet(next_obs), next_logprobs, cfg.threshold, allowed=allowed)
            next_value = self.target(next_obs).gather(-1, next_a.reshape(-1, 1)).squeeze(-1)
            y = td_target(mb["reward"], next_value, mb["terminated"], cfg.gamma, mb.get("discount"))
        q = q_all.gather(-1, action.long().reshape(-1, 1)).squeeze(-1)
        td = F.smooth_l1_loss(q, y)
        imitation = bcq_imitation_loss(logits, action, cfg.imitation_penalty)
        with torch.no_grad():
            stats = torch.stack([td, imitation, q.mean(), allowed.float().mean()])
        return td + imitation, stats

    def after_step(self) -> None:
        """Polyak update of the target Q-network."""
        polyak(self.target, self.qnet, self.config.tau)

    def networks(self) -> dict[str, nn.Module]:
        """The Q-network and the behaviour-cloning head (both act), then the target."""
        return {"q": self.qnet, "imitation": self.imitation, "q_target": self.target}


def build_bcq(config: BCQConfig, envs: Any, model: Any, device: torch.device, seed: int) -> BCQ:
    """Discrete BCQ sized from ``envs``' spaces (or a dataset sampler's): two networks of ``model``'s sizes."""
    obs_space, action_space = single_spaces(envs)
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(
            f"bcq is discrete BCQ and takes Discrete actions, not {type(action_space).__name__}; for Box actions use "
            "td3-bc, iql or cql"
        )
    hidden, activation, n = tuple(model.hidden), model.activation, int(action_space.n)
    qnet = QNetwork(obs_space, n, hidden, activation)
    imitation = QNetwork(obs_space, n, hidden, activation)
    normalized_inputs(config, obs_space, qnet, imitation)
    return BCQ(qnet.to(device), imitation.to(device), config)
