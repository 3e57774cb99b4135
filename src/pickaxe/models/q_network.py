"""Q-network and the epsilon-greedy acting policy for value-based algorithms (the DQN family)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import gymnasium as gym
import torch
from torch import nn

from pickaxe.models.encoders import FlatEncoder, encoder_for
from pickaxe.models.mlp import ACTIVATIONS, mlp, single_spaces

DISTRIBUTIONAL = ("none", "c51", "qr")


def dueling_combine(value: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """The dueling head's ``V + A - mean_a(A)``: ``value`` ``[B, 1, atoms]``, ``advantage`` ``[B, A, atoms]``
    (per atom for the distributional heads)."""
    return value + advantage - advantage.mean(dim=1, keepdim=True)


class QNetwork(nn.Module):
    """From observations to Q-values, through ``encoder_for(observation space)`` and an MLP.

    ``obs`` is a flat size (an int) or the observation space (images get the Nature CNN). The head is one value per
    action (``distributional="none"``), or per action ``atoms`` logits of a categorical distribution over the fixed
    returns ``support`` = linspace(v_min, v_max, atoms) (``"c51"``) or ``atoms`` quantiles of the return (``"qr"``).
    ``dueling`` splits the head into a state value and advantages. ``forward`` is always the expected Q-value per
    action (what acting and evaluation use); ``dist`` the raw head.
    """

    def __init__(
        self,
        obs: int | gym.Space,
        n_actions: int,
        hidden: Sequence[int] = (256, 256),
        activation: str = "relu",
        dueling: bool = False,
        distributional: str = "none",
        atoms: int = 51,
        v_min: float = -10.0,
        v_max: float = 10.0,
    ) -> None:
        super().__init__()
        if distributional not in DISTRIBUTIONAL:
            raise ValueError(f"unknown distributional head {distributional!r}; choose one of {DISTRIBUTIONAL}")
        self.n_actions = n_actions
        self.distributional = distributional
        self.atoms = 1 if distributional == "none" else atoms
        self.dueling = dueling
        self.encoder, features = (FlatEncoder(obs), obs) if isinstance(obs, int) else encoder_for(obs)
        out = n_actions * self.atoms
        if not dueling:
            self.net = mlp(features, hidden, out, activation)
        else:
            layers: list[nn.Module] = []
            for a, b in itertools.pairwise([features, *hidden]):
                layers += [_orthogonal(nn.Linear(a, b), math.sqrt(2)), ACTIVATIONS[activation]()]
            self.net = nn.Sequential(*layers)
            width = hidden[-1] if hidden else features
            self.value = _orthogonal(nn.Linear(width, self.atoms), 1.0)
            self.advantage = _orthogonal(nn.Linear(width, out), 1.0)
        if distributional == "c51":
            self.register_buffer("support", torch.linspace(v_min, v_max, atoms), persistent=False)

    @classmethod
    def for_env(cls, envs: gym.vector.VectorEnv | gym.Env, **kwargs) -> QNetwork:
        """Size the network from an env's spaces; the action space must be Discrete."""
        obs_space, act_space = single_spaces(envs)
        if not isinstance(act_space, gym.spaces.Discrete):
            raise ValueError(f"Q-networks need Discrete actions, got {act_space}; use PPO for continuous actions")
        return cls(obs_space, int(act_space.n), **kwargs)

    def dist(self, obs: torch.Tensor) -> torch.Tensor:
        """The head's output, ``[B, n_actions, atoms]``: Q-values (atoms = 1), C51 logits or QR quantiles."""
        h = self.net(self.encoder(obs))
        if not self.dueling:
            return h.view(-1, self.n_actions, self.atoms)
        value = self.value(h).view(-1, 1, self.atoms)
        return dueling_combine(value, self.advantage(h).view(-1, self.n_actions, self.atoms))

    def q_values(self, head: torch.Tensor) -> torch.Tensor:
        """Expected Q-values ``[B, n_actions]`` from the head's output ``head`` (as :meth:`dist` returns it)."""
        if self.distributional == "c51":
            return (head.softmax(-1) * self.support).sum(-1)
        if self.distributional == "qr":
            return head.mean(-1)
        return head.squeeze(-1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values, shape ``[B, n_actions]``."""
        if self.distributional == "none" and not self.dueling:
            return self.net(self.encoder(obs))
        return self.q_values(self.dist(obs))


def _orthogonal(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


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
