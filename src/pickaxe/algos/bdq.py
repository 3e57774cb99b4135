"""Branching dueling Q-network (Tavakoli et al. 2018, "Action Branching Architectures for Deep RL") for MultiDiscrete
actions, on the DQN family's pieces (replay, target network, epsilon decay, the guarded step).

Each action dimension ``d`` has its own Q-values ``Q_d(s, a_d)`` (``pickaxe.models.branching``). The next value of
dimension ``d`` is the target network's ``Q_d(s', argmax Q_d^online(s', .))`` (double DQN per dimension), and the TD
target combines the dimensions' next values (:func:`branching_target`): their mean (the paper's choice, one target
for all dimensions), their max, or each its own. The loss is the squared TD error averaged over dimensions.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from pickaxe.algos.base import Algorithm, clip_and_step
from pickaxe.algos.core import adam, linear_schedule
from pickaxe.algos.dqn import discount_of, load_replay_q_state, replay_q_state
from pickaxe.algos.extra_configs import BranchingDQNConfig
from pickaxe.data.batch import Batch
from pickaxe.data.buffers import ReplayBuffer
from pickaxe.models.branching import BranchingEpsilonGreedy, BranchingQNetwork
from pickaxe.models.mlp import single_spaces

REPLAY_KEYS = ("obs", "action", "reward", "terminated", "next_obs")


def branching_target(
    reward: torch.Tensor,
    discount: torch.Tensor,
    next_q_target: torch.Tensor,
    next_q_online: torch.Tensor,
    mode: str = "mean",
) -> torch.Tensor:
    """TD targets ``[B, D]``: ``r + discount * combine_d(Q_d^target(s', a*_d))`` with ``a*_d = argmax Q_d^online(s',
    .)``; ``combine`` is the mean over the dimensions (``mode="mean"``, the same target for every dimension), the
    max, or none (``"independent"``: each dimension its own). ``next_q_*``: ``[B, D, choices]``; ``discount``:
    ``[B]`` (``gamma^k``, 0 where the episode terminated)."""
    best = next_q_online.argmax(-1, keepdim=True)
    value = next_q_target.gather(-1, best).squeeze(-1)  # [B, D]
    if mode == "mean":
        value = value.mean(-1, keepdim=True).expand_as(value)
    elif mode == "max":
        value = value.max(-1, keepdim=True).values.expand_as(value)
    return reward.unsqueeze(-1) + discount.unsqueeze(-1) * value


def branching_loss(q: torch.Tensor, action: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``mean_B mean_d (Q_d(s, a_d) - y_d)^2``: ``q`` ``[B, D, choices]``, ``action`` ``[B, D]`` (indices from 0),
    ``target`` ``[B, D]``."""
    chosen = q.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
    return (chosen - target).pow(2).mean()


class BranchingDQN(Algorithm):
    """Branching DQN: stores each collected batch in a uniform replay, then takes ``gradient_steps`` steps of
    :func:`branching_loss` against :func:`branching_target`, copying the online network into the target every
    ``target_update_every`` of them."""

    def __init__(
        self,
        qnet: BranchingQNetwork,
        action_space: gym.spaces.MultiDiscrete,
        config: BranchingDQNConfig | None = None,
        seed: int = 0,
    ) -> None:
        self.config = cfg = config or BranchingDQNConfig()
        self.qnet = qnet
        self.target = copy.deepcopy(qnet).requires_grad_(False)
        self.policy = BranchingEpsilonGreedy(qnet, action_space, cfg.eps_start)
        self.optimizer = adam(qnet.parameters(), lr=cfg.lr)
        self.buffer = ReplayBuffer(cfg.buffer_size, seed=seed, device=next(qnet.parameters()).device)
        self.num_updates = 0

    def set_progress(self, step: int, total_steps: int) -> None:
        """Decay epsilon linearly over the first ``eps_fraction`` of training."""
        cfg = self.config
        self.policy.epsilon = linear_schedule(cfg.eps_start, cfg.eps_end, step / max(cfg.eps_fraction * total_steps, 1))

    def loss(self, mb: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The minibatch loss and its stats ``[loss, mean chosen Q]``."""
        cfg = self.config
        d = len(self.qnet.nvec)
        action = mb["action"].long().reshape(-1, d) - self.policy.start.to(mb["action"].device)
        obs, next_obs = mb["obs"], mb["next_obs"]
        b = obs.shape[0]
        both = self.qnet(torch.cat([obs, next_obs]))  # one online pass: Q(s) and the next actions' choice
        q, next_online = both[:b], both[b:].detach()
        with torch.no_grad():
            y = branching_target(
                mb["reward"], discount_of(mb, cfg.gamma), self.target(next_obs), next_online, cfg.target
            )
        loss = branching_loss(q, action, y)
        chosen = q.detach().gather(-1, action.unsqueeze(-1)).mean()
        return loss, torch.stack([loss.detach(), chosen])

    def update(self, batch: Batch) -> dict[str, float]:
        """Store ``batch``; once ``learning_starts`` transitions are stored, take ``gradient_steps`` steps (one host
        read each)."""
        cfg = self.config
        self.buffer.extend(batch.select(*REPLAY_KEYS))
        metrics: dict[str, float] = {"bdq/epsilon": self.policy.epsilon}
        if len(self.buffer) < max(cfg.learning_starts, 1):
            return metrics
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr
        totals = torch.zeros(4, dtype=torch.float64)
        for _ in range(cfg.gradient_steps):
            loss, stats = self.loss(self.buffer.sample(cfg.batch_size))
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            values = clip_and_step(self.qnet, self.optimizer, cfg.max_grad_norm, loss, sums=stats, name="bdq loss")
            totals += torch.tensor(values, dtype=torch.float64)
            self.num_updates += 1
            if self.num_updates % cfg.target_update_every == 0:
                self.target.load_state_dict(self.qnet.state_dict())
        grad_norm, _, loss_mean, q_mean = (totals / cfg.gradient_steps).tolist()
        metrics.update({"grad_norm": grad_norm, "loss/q": loss_mean, "bdq/q_mean": q_mean})
        return metrics

    def networks(self) -> dict[str, nn.Module]:
        """Online and target branching networks."""
        return {"q": self.qnet, "q_target": self.target}

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizer, replay buffer (with its sampler), update counter, epsilon."""
        return replay_q_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        load_replay_q_state(self, state)


def build_bdq(config: BranchingDQNConfig, envs: Any, model: Any, device: torch.device, seed: int) -> BranchingDQN:
    """Branching DQN with a ``BranchingQNetwork`` sized from ``envs``' spaces (MultiDiscrete actions) and shaped by
    ``model``; ``seed`` seeds the replay."""
    _, action_space = single_spaces(envs)
    qnet = BranchingQNetwork.for_env(envs, hidden=tuple(model.hidden), activation=model.activation)
    return BranchingDQN(qnet.to(device), action_space, config, seed=seed)
