"""Q-network and the epsilon-greedy acting policy for value-based algorithms (the DQN family)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import gymnasium as gym
import torch
from torch import nn

from pickaxe.models.encoders import FlatEncoder, encode, encoder_for
from pickaxe.models.mlp import ACTIVATIONS, mlp, single_spaces

DISTRIBUTIONAL = ("none", "c51", "qr")


def dueling_combine(value: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """The dueling head's ``V + A - mean_a(A)``: ``value`` ``[B, 1, atoms]``, ``advantage`` ``[B, A, atoms]``
    (per atom for the distributional heads)."""
    return value + advantage - advantage.mean(dim=1, keepdim=True)


class NoisyLinear(nn.Module):
    """A linear layer with factorised Gaussian parameter noise (Fortunato et al. 2018, NoisyNet):
    ``W = mu_W + sigma_W * f(eps_out) f(eps_in)^T``, ``b = mu_b + sigma_b * f(eps_out)``, ``f(x) = sign(x) sqrt|x|``.

    The noise (``eps_in``, ``eps_out``, buffers kept in the state dict) changes only in :meth:`reset_noise`, from
    the caller's generator; with ``noise`` off the layer uses the mean weights.
    """

    def __init__(self, in_features: int, out_features: int, sigma0: float = 0.5) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(in_features)
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features).uniform_(-bound, bound))
        self.weight_sigma = nn.Parameter(torch.full((out_features, in_features), sigma0 * bound))
        self.bias_mu = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound))
        self.bias_sigma = nn.Parameter(torch.full((out_features,), sigma0 * bound))
        self.register_buffer("eps_in", torch.zeros(in_features))
        self.register_buffer("eps_out", torch.zeros(out_features))
        self.noise = True

    @staticmethod
    def scaled(x: torch.Tensor) -> torch.Tensor:
        """NoisyNet's ``f(x) = sign(x) sqrt(|x|)``."""
        return x.sign() * x.abs().sqrt()

    @torch.no_grad()
    def reset_noise(self, generator: torch.Generator) -> None:
        """Draw new factorised noise from ``generator`` (a CPU generator)."""
        self.eps_in.copy_(self.scaled(torch.randn(self.eps_in.shape, generator=generator)))
        self.eps_out.copy_(self.scaled(torch.randn(self.eps_out.shape, generator=generator)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x W^T + b`` with the current noise (or the mean weights with ``noise`` off)."""
        if not self.noise:
            return nn.functional.linear(x, self.weight_mu, self.bias_mu)
        weight = self.weight_mu + self.weight_sigma * torch.outer(self.eps_out, self.eps_in)
        return nn.functional.linear(x, weight, self.bias_mu + self.bias_sigma * self.eps_out)


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
        noisy: bool = False,
        noisy_sigma: float = 0.5,
    ) -> None:
        super().__init__()
        if distributional not in DISTRIBUTIONAL:
            raise ValueError(f"unknown distributional head {distributional!r}; choose one of {DISTRIBUTIONAL}")
        self.n_actions = n_actions
        self.distributional = distributional
        self.atoms = 1 if distributional == "none" else atoms
        self.dueling = dueling
        self.noisy = noisy
        self.encoder, features = (FlatEncoder(obs), obs) if isinstance(obs, int) else encoder_for(obs)
        out = n_actions * self.atoms

        def linear(a: int, b: int, gain: float) -> nn.Module:
            return NoisyLinear(a, b, noisy_sigma) if noisy else _orthogonal(nn.Linear(a, b), gain)

        if not dueling and not noisy:
            self.net = mlp(features, hidden, out, activation)
        else:
            layers: list[nn.Module] = []
            for a, b in itertools.pairwise([features, *hidden]):
                layers += [linear(a, b, math.sqrt(2)), ACTIVATIONS[activation]()]
            width = hidden[-1] if hidden else features
            if dueling:
                self.net = nn.Sequential(*layers)
                self.value = linear(width, self.atoms, 1.0)
                self.advantage = linear(width, out, 1.0)
            else:
                self.net = nn.Sequential(*layers, linear(width, out, 1.0))
        if distributional == "c51":
            self.register_buffer("support", torch.linspace(v_min, v_max, atoms), persistent=False)

    @classmethod
    def for_env(cls, envs: gym.vector.VectorEnv | gym.Env, **kwargs) -> QNetwork:
        """Size the network from an env's spaces; the action space must be Discrete."""
        obs_space, act_space = single_spaces(envs)
        if not isinstance(act_space, gym.spaces.Discrete):
            raise ValueError(f"Q-networks need Discrete actions, got {act_space}; use PPO for continuous actions")
        return cls(obs_space, int(act_space.n), **kwargs)

    def noisy_layers(self) -> list[NoisyLinear]:
        """The network's NoisyNet layers (none unless ``noisy``)."""
        return [m for m in self.modules() if isinstance(m, NoisyLinear)]

    def reset_noise(self, generator: torch.Generator) -> None:
        """New noise in every NoisyNet layer, from ``generator``."""
        for layer in self.noisy_layers():
            layer.reset_noise(generator)

    def set_noise(self, on: bool) -> None:
        """Use the noisy weights (``on``) or the mean weights in every NoisyNet layer."""
        for layer in self.noisy_layers():
            layer.noise = on

    def dist(self, obs: torch.Tensor) -> torch.Tensor:
        """The head's output, ``[B, n_actions, atoms]``: Q-values (atoms = 1), C51 logits or QR quantiles."""
        h = self.net(encode(self.encoder, obs))
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
            return self.net(encode(self.encoder, obs))
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
        """Greedy or epsilon-random actions; no extras. Deterministic actions of a NoisyNet use its mean weights."""
        if deterministic and getattr(self.qnet, "noisy", False):
            self.qnet.set_noise(False)
            try:
                return self.qnet(obs).argmax(-1), {}
            finally:
                self.qnet.set_noise(True)
        greedy = self.qnet(obs).argmax(-1)
        if deterministic or self.epsilon <= 0.0:
            return greedy, {}
        explore = torch.rand(greedy.shape, device=greedy.device) < self.epsilon
        random_action = torch.randint(self.qnet.n_actions, greedy.shape, device=greedy.device)
        return torch.where(explore, random_action, greedy), {}
