"""Quantile networks of IQN and FQF: the return's quantile function at any fractions ``tau`` in (0, 1), through a
cosine embedding of ``tau`` multiplied into the state's features (Dabney et al. 2018), and FQF's fraction-proposal
network (Yang et al. 2019); the epsilon-greedy policy acting on their Q-values."""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import torch
from torch import nn

from pickaxe.models.encoders import encode, encoder_for
from pickaxe.models.mlp import ACTIVATIONS, mlp, single_spaces


def midpoint_taus(k: int, rows: int, device: torch.device | None = None) -> torch.Tensor:
    """The fixed fractions ``(j + 0.5) / k``, ``j < k``, for each of ``rows`` rows: ``[rows, k]``."""
    return ((torch.arange(k, device=device, dtype=torch.float32) + 0.5) / k).expand(rows, k)


class ImplicitQuantileNetwork(nn.Module):
    """``Z_tau(s, a)`` for any fractions: features ``psi(s)`` (encoder and the ``hidden`` layers), times the embedding
    ``phi(tau) = act(W [cos(pi i tau)]_{i < embedding_dim} + b)``, through a head MLP to one value per action.

    With ``fractions`` > 0 it also holds FQF's fraction-proposal layer, which maps the (detached) features to
    ``fractions`` widths summing to 1 (a softmax), their cumulative sums being the fractions ``tau_1 .. tau_N``.
    """

    def __init__(
        self,
        obs: gym.Space,
        n_actions: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "relu",
        embedding_dim: int = 64,
        fractions: int = 0,
    ) -> None:
        super().__init__()
        self.n_actions = n_actions
        self.encoder, features = encoder_for(obs)
        if hidden:
            torso = mlp(features, tuple(hidden[:-1]), hidden[-1], activation, out_gain=math.sqrt(2))
            self.torso: nn.Module = nn.Sequential(torso, ACTIVATIONS[activation]())
            width = hidden[-1]
        else:
            self.torso, width = nn.Identity(), features
        self.width = width
        self.register_buffer("freqs", math.pi * torch.arange(embedding_dim, dtype=torch.float32), persistent=False)
        self.embedding = nn.Sequential(nn.Linear(embedding_dim, width), ACTIVATIONS[activation]())
        self.head = mlp(width, (hidden[-1] if hidden else 512,), n_actions, activation)
        self.fractions = fractions
        if fractions:
            self.proposal = nn.Linear(width, fractions)
            nn.init.xavier_uniform_(self.proposal.weight, gain=0.01)
            nn.init.zeros_(self.proposal.bias)

    @classmethod
    def for_env(cls, envs: gym.vector.VectorEnv | gym.Env, **kwargs) -> ImplicitQuantileNetwork:
        """Size the network from an env's spaces; the action space must be Discrete."""
        obs_space, act_space = single_spaces(envs)
        if not isinstance(act_space, gym.spaces.Discrete):
            raise ValueError(f"quantile networks need Discrete actions, got {act_space}")
        return cls(obs_space, int(act_space.n), **kwargs)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """``psi(s)``: ``[B, width]``."""
        return self.torso(encode(self.encoder, obs))

    def quantiles(self, features: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        """``Z_tau(s, a)`` at fractions ``tau`` ``[B, N]`` of each row: ``[B, N, n_actions]``."""
        phi = self.embedding(torch.cos(tau.unsqueeze(-1) * self.freqs))  # [B, N, width]
        return self.head(features.unsqueeze(1) * phi)

    def propose(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """FQF's fractions for each row: ``(tau [B, N + 1]`` with ``tau_0 = 0, tau_N = 1``, their midpoints
        ``tau_hat [B, N]``, the entropy of the widths ``[B]``)``; gradients reach only the proposal layer."""
        logp = torch.log_softmax(self.proposal(features.detach()), dim=-1)
        widths = logp.exp()
        tau = torch.cat([torch.zeros_like(widths[:, :1]), widths.cumsum(-1)], dim=-1)
        tau = torch.cat([tau[:, :-1], torch.ones_like(tau[:, -1:])], dim=-1)  # exactly 1 at the end, whatever rounding
        tau_hat = (tau[:, :-1] + tau[:, 1:]) / 2
        return tau, tau_hat, -(widths * logp).sum(-1)

    def proposed_q(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """FQF's Q-values ``[B, n_actions]`` (the quantiles at the proposed midpoints, weighted by the widths), those
        midpoints ``tau_hat`` ``[B, N]`` and the widths ``[B, N]``, all detached from the proposal layer."""
        tau, tau_hat, _ = self.propose(features)
        widths, tau_hat = (tau[:, 1:] - tau[:, :-1]).detach(), tau_hat.detach()
        z = self.quantiles(features, tau_hat)
        return (widths.unsqueeze(-1) * z).sum(1), tau_hat, widths

    def q_values(self, obs: torch.Tensor, taus: int = 32, sample: bool = False) -> torch.Tensor:
        """Q-values ``[B, n_actions]``: with proposals (FQF) the width-weighted sum of the quantiles at the proposed
        midpoints; else (IQN) the mean of ``taus`` quantiles, at fractions drawn from U(0, 1) (``sample``, from
        torch's RNG) or at the fixed midpoints."""
        x = self.features(obs)
        if self.fractions:
            return self.proposed_q(x)[0]
        b = x.shape[0]
        tau = torch.rand(b, taus, device=x.device) if sample else midpoint_taus(taus, b, x.device)
        return self.quantiles(x, tau).mean(1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values at the fixed fractions (or FQF's proposals): ``[B, n_actions]``."""
        return self.q_values(obs)


class QuantileGreedy:
    """Acts greedily on a quantile network's Q-values (sampled fractions while training, the fixed midpoints when
    ``deterministic``), uniformly at random with probability ``epsilon`` (0 when deterministic)."""

    def __init__(self, qnet: ImplicitQuantileNetwork, taus: int = 32, epsilon: float = 1.0) -> None:
        self.qnet = qnet
        self.taus = taus
        self.epsilon = epsilon

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Greedy or epsilon-random actions; no extras."""
        greedy = self.qnet.q_values(obs, self.taus, sample=not deterministic).argmax(-1)
        if deterministic or self.epsilon <= 0.0:
            return greedy, {}
        explore = torch.rand(greedy.shape, device=greedy.device) < self.epsilon
        random_action = torch.randint(self.qnet.n_actions, greedy.shape, device=greedy.device)
        return torch.where(explore, random_action, greedy), {}
