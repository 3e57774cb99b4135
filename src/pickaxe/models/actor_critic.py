"""Actor-critic for PPO-style algorithms: categorical (Discrete), diagonal Gaussian (Box), independent categoricals
(MultiDiscrete) or independent Bernoullis (MultiBinary) actions, on vector or image observations."""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pickaxe.models.encoders import NatureCNN, is_image_space
from pickaxe.models.mlp import mlp, obs_dim, single_spaces
from pickaxe.models.policy import ActFn
from pickaxe.models.twin_mlp import TwinMLP

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def gaussian_logprob(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """``log N(action; mean, exp(log_std)^2)`` of a diagonal Gaussian, summed over the last axis (``log_std``
    broadcasts against ``mean``: one per dimension, or one per row and dimension)."""
    z = (action - mean) / log_std.exp()
    return (-0.5 * z.pow(2) - log_std - _LOG_SQRT_2PI).sum(-1)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """The entropy of a diagonal Gaussian with ``log_std``, summed over the last axis (it does not depend on the
    mean)."""
    return (0.5 + _LOG_SQRT_2PI + log_std).sum(-1)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs on vectors; a shared Nature CNN torso with separate actor and critic heads
    (``hidden`` layers, none for the standard Atari PPO) on images.

    Discrete actions use a categorical over logits; Box actions a Gaussian with a state-independent ``log_std``
    (actions are unbounded here; the collector clips them to the space before stepping); MultiDiscrete actions one
    categorical per dimension and MultiBinary actions one Bernoulli per bit, with log-probs and entropies summed
    over the dimensions. The distributions are written out by hand: ``torch.distributions`` costs more than the MLP
    itself at the batch sizes of collection.
    """

    def __init__(
        self,
        obs: int | gym.Space,
        action_space: gym.Space,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        self.kind = type(action_space).__name__
        self.action_dtype = torch.int64
        self.action_start: torch.Tensor | None = None
        if isinstance(action_space, gym.spaces.Discrete):
            out = int(action_space.n)
            self.action_shape: tuple[int, ...] = ()
        elif isinstance(action_space, gym.spaces.Box):
            out = int(np.prod(action_space.shape))
            self.log_std = nn.Parameter(torch.full((out,), float(log_std_init)))
            self.action_shape = tuple(action_space.shape)
        elif isinstance(action_space, gym.spaces.MultiDiscrete):
            self.nvec = [int(n) for n in action_space.nvec.flatten()]
            out = sum(self.nvec)
            self.action_shape = tuple(action_space.shape)
            start = np.asarray(action_space.start).flatten()
            if start.any():  # actions are offsets from start; kept as a buffer-free tensor attribute
                self.action_start = torch.as_tensor(start, dtype=torch.int64)
        elif isinstance(action_space, gym.spaces.MultiBinary):
            out = int(np.prod(action_space.shape))
            self.action_shape = tuple(action_space.shape)
            self.action_dtype = torch.int8
        else:
            raise ValueError(
                f"ActorCritic supports Discrete, Box, MultiDiscrete and MultiBinary actions, got {action_space}"
            )
        self.discrete = self.kind == "Discrete"
        self.torso: nn.Module | None = None
        if isinstance(obs, int):
            features = obs
        elif is_image_space(obs):
            self.torso = NatureCNN(tuple(obs.shape))
            features = self.torso.features
        else:
            features = obs_dim(obs)
        self.actor = mlp(features, hidden, out, activation, out_gain=0.01)
        self.critic = mlp(features, hidden, 1, activation, out_gain=1.0)

    @classmethod
    def for_env(cls, envs: gym.vector.VectorEnv | gym.Env, **kwargs) -> ActorCritic:
        """Size the networks from an env's single observation and action spaces (images get the CNN torso)."""
        obs_space, act_space = single_spaces(envs)
        return cls(obs_space if is_image_space(obs_space) else obs_dim(obs_space), act_space, **kwargs)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """What the heads see: the flattened observation, or the CNN torso's features for images."""
        return obs.flatten(1) if self.torso is None else self.torso(obs)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values, shape ``[B]``."""
        return self.critic(self.features(obs)).squeeze(-1)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Sample (or take the mode of) the action distribution; extras are ``logprob`` and ``value``."""
        x = self.features(obs)
        action, logprob = self._choose(self.actor(x), deterministic)
        return action, {"logprob": logprob, "value": self.critic(x).squeeze(-1)}

    def frozen_act(self) -> ActFn:
        """An ``act`` for a loop in which the weights do not change (one rollout), without autograd: the actor's and
        critic's hidden layers run as one op each (``models.twin_mlp``), from a copy of the weights taken now. Same
        values as ``act``; ``act`` itself where the two MLPs cannot be stacked."""
        if not TwinMLP.fits(self.actor, self.critic):
            return self.act
        heads = TwinMLP(self.actor, self.critic)

        def act(obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            out, value = heads(self.features(obs))
            action, logprob = self._choose(out, deterministic)
            return action, {"logprob": logprob, "value": value.squeeze(-1)}

        return act

    def _choose(self, out: torch.Tensor, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``(action, logprob)`` from the actor's output: a sample, or the mode when ``deterministic``."""
        if self.discrete:
            logp_all = torch.log_softmax(out, -1)
            action = out.argmax(-1) if deterministic else _gumbel_max(logp_all)
            logprob = logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        elif self.kind == "Box":
            std = self.log_std.exp()
            action = out if deterministic else out + std * torch.randn_like(out)
            logprob = gaussian_logprob(out, self.log_std, action)
            action = action.reshape(-1, *self.action_shape)
        elif self.kind == "MultiDiscrete":
            parts = [torch.log_softmax(o, -1) for o in out.split(self.nvec, -1)]
            chosen = [p.argmax(-1) if deterministic else _gumbel_max(p) for p in parts]
            logprob = sum(p.gather(-1, a.unsqueeze(-1)).squeeze(-1) for p, a in zip(parts, chosen, strict=True))
            action = torch.stack(chosen, -1)
            if self.action_start is not None:
                action = action + self.action_start.to(action.device)
            action = action.reshape(-1, *self.action_shape)
        else:  # MultiBinary
            bits = (out > 0) if deterministic else (torch.rand_like(out) < torch.sigmoid(out))
            logprob = self._bernoulli_logprob(out, bits.float())
            action = bits.to(self.action_dtype).reshape(-1, *self.action_shape)
        return action, logprob  # type: ignore[return-value]

    def evaluate_actions(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logprob, entropy, value)`` of given actions under the current parameters."""
        x = self.features(obs)
        out = self.actor(x)
        if self.discrete:
            logp_all = torch.log_softmax(out, -1)
            logprob = logp_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        elif self.kind == "Box":
            logprob = gaussian_logprob(out, self.log_std, action.flatten(1))
            entropy = gaussian_entropy(self.log_std).expand(out.shape[0])
        elif self.kind == "MultiDiscrete":
            a = action.long().flatten(1)
            if self.action_start is not None:
                a = a - self.action_start.to(a.device)
            parts = [torch.log_softmax(o, -1) for o in out.split(self.nvec, -1)]
            logprob = sum(p.gather(-1, a[:, i : i + 1]).squeeze(-1) for i, p in enumerate(parts))
            entropy = sum(-(p.exp() * p).sum(-1) for p in parts)
        else:  # MultiBinary
            logprob = self._bernoulli_logprob(out, action.flatten(1).float())
            p = torch.sigmoid(out)
            entropy = (F.binary_cross_entropy_with_logits(out, p, reduction="none")).sum(-1)
        return logprob, entropy, self.critic(x).squeeze(-1)  # type: ignore[return-value]

    @staticmethod
    def _bernoulli_logprob(logits: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
        return -F.binary_cross_entropy_with_logits(logits, bits, reduction="none").sum(-1)


def _gumbel_max(logp: torch.Tensor) -> torch.Tensor:
    """A sample of the categorical with log-probabilities ``logp`` (last axis), by the Gumbel-max trick."""
    gumbel_neg = torch.rand_like(logp).clamp_(min=1e-20).log_().neg_().log_()  # log(-log u): in place, same values
    return (logp - gumbel_neg).argmax(-1)
