"""Deep Q-Network with a target network, double-DQN targets and a linear epsilon schedule."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pickaxe.algos.base import Algorithm, guarded_step
from pickaxe.algos.configs import DQNConfig
from pickaxe.algos.core import adam, huber, linear_schedule, td_target
from pickaxe.data.batch import Batch
from pickaxe.data.buffers import ReplayBuffer
from pickaxe.models.q_network import EpsilonGreedy, QNetwork

_REPLAY_KEYS = ("obs", "action", "reward", "terminated", "next_obs")


@torch.no_grad()
def dqn_target(qnet: QNetwork, target: QNetwork, mb: Batch, cfg: DQNConfig) -> torch.Tensor:
    """TD targets ``r + gamma * (1 - terminated) * Q_target(s', a')`` of a replay minibatch.

    ``a'`` is the online network's argmax when ``cfg.double`` (double DQN), else the target network's.
    """
    next_q_target = target(mb["next_obs"])
    if cfg.double:  # online net picks the action, target net scores it
        next_action = qnet(mb["next_obs"]).argmax(-1, keepdim=True)
    else:
        next_action = next_q_target.argmax(-1, keepdim=True)
    next_value = next_q_target.gather(-1, next_action).squeeze(-1)
    return td_target(mb["reward"], next_value, mb["terminated"], cfg.gamma)


def dqn_loss(
    qnet: QNetwork, target: QNetwork, mb: Batch, cfg: DQNConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """TD loss (``cfg.loss``: Huber or MSE) on a replay minibatch against ``dqn_target``."""
    y = dqn_target(qnet, target, mb, cfg)
    q = qnet(mb["obs"]).gather(-1, mb["action"].long().unsqueeze(-1)).squeeze(-1)
    loss = huber(q, y) if cfg.loss == "huber" else F.mse_loss(q, y)
    return loss, {"loss/q": loss.detach(), "dqn/q_mean": q.detach().mean()}


class DQN(Algorithm):
    """DQN: stores each collected batch in a uniform replay buffer, then takes ``gradient_steps`` steps."""

    def __init__(self, qnet: QNetwork, config: DQNConfig | None = None, seed: int = 0) -> None:
        self.config = cfg = config or DQNConfig()
        self.qnet = qnet
        self.target = copy.deepcopy(qnet).requires_grad_(False)
        self.policy = EpsilonGreedy(qnet, cfg.eps_start)
        self.optimizer = adam(qnet.parameters(), lr=cfg.lr)
        device = next(qnet.parameters()).device
        self.buffer = ReplayBuffer(cfg.buffer_size, seed=seed, device=device)
        self.num_updates = 0

    def set_progress(self, step: int, total_steps: int) -> None:
        """Decay epsilon linearly over the first ``eps_fraction`` of training."""
        cfg = self.config
        progress = step / max(cfg.eps_fraction * total_steps, 1)
        self.policy.epsilon = linear_schedule(cfg.eps_start, cfg.eps_end, progress)

    def update(self, batch: Batch) -> dict[str, float]:
        """Store ``batch``; once ``learning_starts`` steps are stored, take ``gradient_steps`` TD steps."""
        cfg = self.config
        self.buffer.extend(batch.select(*_REPLAY_KEYS))
        metrics: dict[str, float] = {"dqn/epsilon": self.policy.epsilon, "dqn/lr": cfg.lr}
        if len(self.buffer) < cfg.learning_starts:
            return metrics
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr
        history = []
        for _ in range(cfg.gradient_steps):
            loss, stats = dqn_loss(self.qnet, self.target, self.buffer.sample(cfg.batch_size), cfg)
            guarded_step(loss, self.qnet, self.optimizer, cfg.max_grad_norm, "td loss")
            self.num_updates += 1
            if self.num_updates % cfg.target_update_every == 0:
                self._update_target()
            history.append(stats)
        metrics.update({k: float(torch.stack([h[k] for h in history]).mean()) for k in history[0]})
        return metrics

    @torch.no_grad()
    def _update_target(self) -> None:
        if self.config.tau >= 1.0:
            self.target.load_state_dict(self.qnet.state_dict())
            return
        for t, p in zip(self.target.parameters(), self.qnet.parameters(), strict=False):
            t.lerp_(p, self.config.tau)

    def networks(self) -> dict[str, nn.Module]:
        """Online and target Q-networks."""
        return {"q": self.qnet, "q_target": self.target}

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizer, replay buffer, update counter and epsilon."""
        return {
            "q": self.qnet.state_dict(),
            "q_target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "buffer": self.buffer.state_dict(),
            "num_updates": self.num_updates,
            "epsilon": self.policy.epsilon,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.qnet.load_state_dict(state["q"])
        self.target.load_state_dict(state["q_target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"])
        self.num_updates = int(state["num_updates"])
        self.policy.epsilon = float(state["epsilon"])


def build_dqn(config: DQNConfig, envs: Any, model: Any, device: torch.device, seed: int) -> DQN:
    """DQN with a ``QNetwork`` sized from ``envs``' spaces and shaped by ``model``; ``seed`` seeds the replay."""
    qnet = QNetwork.for_env(envs, hidden=tuple(model.hidden), activation=model.activation)
    return DQN(qnet.to(device), config, seed=seed)
