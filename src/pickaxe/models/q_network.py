"""Q-network and the epsilon-greedy acting policy for value-based algorithms (DQN)."""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import torch
from torch import nn

from pickaxe.models.mlp import mlp, obs_dim, single_spaces


class QNetwork(nn.Module):
    """MLP from observations to one Q-value per discrete action."""

    def __init__(self, obs_size: int, n_actions: int, hidden: Sequence[int] = (256, 256), activation: str = "relu"):
        super().__init__()
        self.n_actions = n_actions
        self.net = mlp(obs_size, hidden, n_actions, activation)

    @classmethod
    def for_env(cls, envs: gym.vector.VectorEnv | gym.Env, **kwargs) -> QNetwork:
        """Size the network from an env's spaces; the action space must be Discrete."""
        obs_space, act_space = single_spaces(envs)
        if not isinstance(act_space, gym.spaces.Discrete):
            raise ValueError(f"Q-networks need Discrete actions, got {act_space}; use PPO for continuous actions")
        return cls(obs_dim(obs_space), int(act_space.n), **kwargs)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values, shape ``[B, n_actions]``."""
        return self.net(obs.flatten(1))


class EpsilonGreedy:
    """Acts greedily on a Q-network, uniformly at random with probability ``epsilon`` (0 when deterministic)."""

    def __init__(self, qnet: QNetwork, epsilon: float = 1.0) -> None:
        self.qnet = qnet
        self.epsilon = epsilon

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Greedy or epsilon-random actions; no extras."""
        greedy = self.qnet(obs).argmax(-1)
        if deterministic or self.epsilon <= 0.0:
            return greedy, {}
        explore = torch.rand(greedy.shape, device=greedy.device) < self.epsilon
        random_action = torch.randint(self.qnet.n_actions, greedy.shape, device=greedy.device)
        return torch.where(explore, random_action, greedy), {}
