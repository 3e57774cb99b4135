"""Branching dueling Q-network (Tavakoli et al. 2018) for MultiDiscrete actions, and its per-dimension
epsilon-greedy policy.

A shared torso feeds a state value ``V(s)`` and one advantage head per action dimension ``d``; the dimension's
Q-values are ``Q_d(s, a_d) = V(s) + A_d(s, a_d) - mean_a A_d(s, a)``. The outputs of dimensions with fewer choices
than the largest are padded with ``-inf`` (never the argmax) to one ``[B, D, max choices]`` tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pickaxe.models.encoders import encode, encoder_for
from pickaxe.models.mlp import ACTIVATIONS, mlp, single_spaces


class BranchingQNetwork(nn.Module):
    """Observations -> ``[B, D, max(nvec)]`` Q-values, one row per action dimension (``-inf`` past its choices)."""

    def __init__(
        self, obs: gym.Space, nvec: Sequence[int], hidden: Sequence[int] = (64, 64), activation: str = "relu"
    ) -> None:
        super().__init__()
        self.nvec = [int(n) for n in nvec]
        self.encoder, features = encoder_for(obs)
        if hidden:
            self.torso: nn.Module = nn.Sequential(
                mlp(features, tuple(hidden[:-1]), hidden[-1], activation, out_gain=2**0.5), ACTIVATIONS[activation]()
            )
            width = hidden[-1]
        else:
            self.torso, width = nn.Identity(), features
        head = (hidden[-1],) if hidden else (128,)
        self.value = mlp(width, head, 1, activation)
        self.advantages = nn.ModuleList(mlp(width, head, n, activation) for n in self.nvec)
        most = max(self.nvec)
        mask = torch.zeros(len(self.nvec), most, dtype=torch.bool)
        for d, n in enumerate(self.nvec):
            mask[d, :n] = True
        self.register_buffer("valid", mask, persistent=False)

    @classmethod
    def for_env(cls, envs: gym.vector.VectorEnv | gym.Env, **kwargs) -> BranchingQNetwork:
        """Size the network from an env's spaces; the action space must be MultiDiscrete."""
        obs_space, act_space = single_spaces(envs)
        if not isinstance(act_space, gym.spaces.MultiDiscrete):
            raise ValueError(f"branching Q-networks need MultiDiscrete actions, got {act_space}")
        return cls(obs_space, np.asarray(act_space.nvec).reshape(-1).tolist(), **kwargs)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``Q_d(s, a_d)``: ``[B, D, max(nvec)]``, ``-inf`` where ``a_d`` is past dimension ``d``'s choices."""
        h = self.torso(encode(self.encoder, obs))
        value = self.value(h)  # [B, 1]
        most = self.valid.shape[1]
        rows = []
        for head in self.advantages:
            a = head(h)
            a = a - a.mean(-1, keepdim=True)
            if a.shape[-1] < most:
                a = torch.cat([a, a.new_full((a.shape[0], most - a.shape[-1]), float("-inf"))], dim=-1)
            rows.append(a)
        return value.unsqueeze(-1) + torch.stack(rows, dim=1)


class BranchingEpsilonGreedy:
    """Acts greedily in every dimension of a ``BranchingQNetwork``; while exploring, each dimension independently
    takes a uniformly random choice with probability ``epsilon`` (0 when deterministic). Actions are offset by the
    space's ``start`` and shaped as the space."""

    def __init__(self, qnet: BranchingQNetwork, action_space: gym.spaces.MultiDiscrete, epsilon: float = 1.0) -> None:
        self.qnet = qnet
        self.epsilon = epsilon
        self.shape = tuple(action_space.shape)
        start = np.asarray(getattr(action_space, "start", 0)).reshape(-1)
        self.start = torch.as_tensor(np.broadcast_to(start, (len(qnet.nvec),)).copy(), dtype=torch.int64)
        self.n = torch.as_tensor(qnet.nvec, dtype=torch.int64)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``[B, *shape]`` actions; no extras."""
        greedy = self.qnet(obs).argmax(-1)  # [B, D]
        if not deterministic and self.epsilon > 0.0:
            n = self.n.to(greedy.device)
            explore = torch.rand(greedy.shape, device=greedy.device) < self.epsilon
            random_action = (torch.rand(greedy.shape, device=greedy.device) * n).long().clamp_max(n - 1)
            greedy = torch.where(explore, random_action, greedy)
        return (greedy + self.start.to(greedy.device)).reshape(-1, *self.shape), {}
