"""Actor-critic MLP for PPO-style algorithms: categorical (Discrete) or diagonal Gaussian (Box) actions."""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pickaxe.models.mlp import mlp, obs_dim, single_spaces

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs.

    Discrete actions use a categorical over logits; Box actions a Gaussian with a state-independent
    ``log_std`` (actions are unbounded here; the collector clips them to the space before stepping). The
    distributions are written out by hand: ``torch.distributions`` costs more than the MLP itself at the
    batch sizes of collection.
    """

    def __init__(
        self,
        obs_size: int,
        action_space: gym.Space,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        if isinstance(action_space, gym.spaces.Discrete):
            self.discrete = True
            out = int(action_space.n)
        elif isinstance(action_space, gym.spaces.Box):
            self.discrete = False
            out = int(np.prod(action_space.shape))
            self.log_std = nn.Parameter(torch.full((out,), float(log_std_init)))
        else:
            raise ValueError(f"ActorCritic supports Discrete and Box actions, got {action_space}")
        self.action_shape: tuple[int, ...] = () if self.discrete else tuple(action_space.shape)
        self.actor = mlp(obs_size, hidden, out, activation, out_gain=0.01)
        self.critic = mlp(obs_size, hidden, 1, activation, out_gain=1.0)

    @classmethod
    def for_env(cls, envs: gym.vector.VectorEnv | gym.Env, **kwargs) -> ActorCritic:
        """Size the networks from an env's single observation and action spaces."""
        obs_space, act_space = single_spaces(envs)
        return cls(obs_dim(obs_space), act_space, **kwargs)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values, shape ``[B]``."""
        return self.critic(obs.flatten(1)).squeeze(-1)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Sample (or take the mode of) the action distribution; extras are ``logprob`` and ``value``."""
        x = obs.flatten(1)
        out = self.actor(x)
        if self.discrete:
            logp_all = torch.log_softmax(out, -1)
            if deterministic:
                action = out.argmax(-1)
            else:  # Gumbel-max sampling
                u = torch.rand_like(out).clamp_(min=1e-20)
                action = (logp_all - torch.log(-torch.log(u))).argmax(-1)
            logprob = logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        else:
            std = self.log_std.exp()
            action = out if deterministic else out + std * torch.randn_like(out)
            logprob = self._gaussian_logprob(out, action)
            action = action.reshape(-1, *self.action_shape)
        return action, {"logprob": logprob, "value": self.critic(x).squeeze(-1)}

    def evaluate_actions(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logprob, entropy, value)`` of given actions under the current parameters."""
        x = obs.flatten(1)
        out = self.actor(x)
        if self.discrete:
            logp_all = torch.log_softmax(out, -1)
            logprob = logp_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        else:
            logprob = self._gaussian_logprob(out, action.flatten(1))
            entropy = (0.5 + _LOG_SQRT_2PI + self.log_std).sum().expand(out.shape[0])
        return logprob, entropy, self.critic(x).squeeze(-1)

    def _gaussian_logprob(self, mean: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        z = (action - mean) / self.log_std.exp()
        return (-0.5 * z.pow(2) - self.log_std - _LOG_SQRT_2PI).sum(-1)
