"""Networks of the off-policy actor-critic algorithms (SAC, TD3, DDPG): a deterministic tanh actor, a
tanh-squashed Gaussian actor, an ensemble of Q critics (twin or single), and discrete SAC's categorical actor and
all-actions critics.

Every network starts with ``encoder_for(observation space)`` and puts MLPs (``pickaxe.models.mlp.mlp``, its init
included) on top. Actors work in the normalised action box ``[-1, 1]^A``; :class:`ActionScale` maps it to the env's
bounds and back, so the replay holds actions in env units while the critics see them in ``[-1, 1]``.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Iterator, Sequence

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pickaxe.models.encoders import encode, encoder_for
from pickaxe.models.mlp import ACTIVATIONS, IN_PLACE, functional, mlp

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_LOG_2 = math.log(2.0)


def tanh_log_det(u: torch.Tensor) -> torch.Tensor:
    """``log(1 - tanh(u)^2)`` elementwise, in the stable form ``2 (log 2 - u - softplus(-2u))`` (no
    ``1 - tanh^2`` that rounds to 0 for large ``|u|``)."""
    return 2.0 * (_LOG_2 - u - F.softplus(-2.0 * u))


def squashed_gaussian_logprob(u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Log-density of ``a = tanh(u)`` for ``u ~ N(mean, exp(log_std))``, summed over the last axis: the Gaussian's
    log-density of ``u`` minus the log-determinant of the tanh Jacobian."""
    z = (u - mean) * torch.exp(-log_std)
    gaussian = -0.5 * z.pow(2) - log_std - _LOG_SQRT_2PI
    return (gaussian - tanh_log_det(u)).sum(-1)


class ActionScale(nn.Module):
    """The affine map between the normalised box ``[-1, 1]^A`` and a bounded Box action space."""

    def __init__(self, space: gym.spaces.Box) -> None:
        super().__init__()
        low, high = np.asarray(space.low, dtype=np.float64), np.asarray(space.high, dtype=np.float64)
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ValueError(
                f"SAC/TD3/DDPG need a bounded action Box, got low={space.low} high={space.high}; wrap the env in "
                "gymnasium.wrappers.RescaleAction (or ClipAction) to give it finite bounds"
            )
        self.shape: tuple[int, ...] = tuple(space.shape)
        # buffers, not parameters: moved with .to(device), not trained, not in the optimizer
        self.register_buffer("center", torch.as_tensor((high + low) / 2, dtype=torch.float32).reshape(-1))
        self.register_buffer("half_range", torch.as_tensor((high - low) / 2, dtype=torch.float32).reshape(-1))

    def to_env(self, a: torch.Tensor) -> torch.Tensor:
        """``[B, A]`` in ``[-1, 1]`` -> ``[B, *shape]`` in env units."""
        return (self.center + self.half_range * a).reshape(-1, *self.shape)

    def to_unit(self, a: torch.Tensor) -> torch.Tensor:
        """``[B, *shape]`` in env units -> ``[B, A]`` in ``[-1, 1]``."""
        return ((a.reshape(a.shape[0], -1) - self.center) / self.half_range).clamp(-1.0, 1.0)


def box_action_dim(space: gym.Space) -> int:
    """Flat size of a Box action space; other spaces are refused with the fix."""
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"this network takes Box actions, got {space}; use SAC (discrete) or DQN for Discrete ones")
    return int(np.prod(space.shape))


class DeterministicActor(nn.Module):
    """TD3/DDPG's actor: encoder, MLP, tanh: ``obs -> a`` in ``[-1, 1]^A``."""

    def __init__(
        self, obs_space: gym.Space, action_dim: int, hidden: Sequence[int] = (256, 256), activation: str = "relu"
    ) -> None:
        super().__init__()
        self.encoder, features = encoder_for(obs_space)
        self.net = mlp(features, hidden, action_dim, activation, out_gain=0.01)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, *obs_shape]`` -> ``[B, A]`` in ``[-1, 1]``."""
        return torch.tanh(self.net(encode(self.encoder, obs)))


class SquashedGaussianActor(nn.Module):
    """SAC's actor: encoder, MLP to a mean and a log-std (clamped to ``[log_std_min, log_std_max]``), a Gaussian
    sample squashed by tanh into ``[-1, 1]^A``."""

    def __init__(
        self,
        obs_space: gym.Space,
        action_dim: int,
        hidden: Sequence[int] = (256, 256),
        activation: str = "relu",
        log_std_min: float = -5.0,
        log_std_max: float = 2.0,
    ) -> None:
        super().__init__()
        self.encoder, features = encoder_for(obs_space)
        self.net = mlp(features, hidden, 2 * action_dim, activation, out_gain=0.01)
        self.log_std_min, self.log_std_max = log_std_min, log_std_max

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, log_std)`` of the pre-tanh Gaussian, each ``[B, A]``."""
        mean, log_std = self.net(encode(self.encoder, obs)).chunk(2, dim=-1)
        return mean, log_std.clamp(self.log_std_min, self.log_std_max)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised sample ``a = tanh(mean + std * eps)`` (``[B, A]``) and its log-density ``[B]``."""
        mean, log_std = self(obs)
        u = mean + log_std.exp() * torch.randn_like(mean)
        return torch.tanh(u), squashed_gaussian_logprob(u, mean, log_std)

    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action ``tanh(mean)``."""
        return torch.tanh(self(obs)[0])


class GaussianActor(nn.Module):
    """Behaviour cloning's and IQL's actor on Box actions: encoder, MLP to a tanh mean in ``[-1, 1]^A`` and a learned
    state-independent log-std (clamped to ``[log_std_min, log_std_max]``); an unsquashed Gaussian, so the dataset's
    actions on the bounds keep a finite likelihood. Samples are clipped to the box."""

    def __init__(
        self,
        obs_space: gym.Space,
        action_dim: int,
        hidden: Sequence[int] = (256, 256),
        activation: str = "relu",
        log_std_min: float = -5.0,
        log_std_max: float = 2.0,
    ) -> None:
        super().__init__()
        self.encoder, features = encoder_for(obs_space)
        self.net = mlp(features, hidden, action_dim, activation, out_gain=0.01)
        self.log_std = nn.Parameter(torch.zeros(action_dim))
        self.log_std_min, self.log_std_max = log_std_min, log_std_max

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean [B, A], log_std [A])``."""
        return torch.tanh(self.net(encode(self.encoder, obs))), self.log_std.clamp(self.log_std_min, self.log_std_max)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A sample clipped to ``[-1, 1]^A`` and the Gaussian log-density of the unclipped sample, ``[B]``."""
        mean, log_std = self(obs)
        eps = torch.randn_like(mean)
        logp = (-0.5 * eps.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return (mean + log_std.exp() * eps).clamp(-1.0, 1.0), logp

    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action: the mean."""
        return self(obs)[0]


class QEnsemble(nn.Module):
    """``n`` Q-networks evaluated as one batched network (one ``baddbmm`` per layer for all of them).

    Continuous actions (``action_dim`` > 0): ``Q(s, a) -> [n, B]`` with ``a`` in ``[-1, 1]^A`` appended to the
    encoded observation. Discrete actions (``action_dim`` = 0, ``outputs`` = number of actions): ``Q(s) -> [n, B,
    outputs]``. Each member is initialised like its own ``mlp`` (orthogonal); the observation encoder is shared (it
    has no parameters on flat observations).
    """

    def __init__(
        self,
        obs_space: gym.Space,
        action_dim: int,
        n: int = 2,
        hidden: Sequence[int] = (256, 256),
        activation: str = "relu",
        outputs: int = 1,
    ) -> None:
        super().__init__()
        self.encoder, features = encoder_for(obs_space)
        self.n, self.action_dim, self.outputs = n, action_dim, outputs
        members = [mlp(features + action_dim, hidden, outputs, activation) for _ in range(n)]
        linears = [[m for m in member if isinstance(m, nn.Linear)] for member in members]
        self.weights = nn.ParameterList(
            nn.Parameter(torch.stack([ls[i].weight.detach().T for ls in linears]).contiguous())
            for i in range(len(linears[0]))
        )
        self.biases = nn.ParameterList(
            nn.Parameter(torch.stack([ls[i].bias.detach() for ls in linears]).unsqueeze(1))
            for i in range(len(linears[0]))
        )
        self.activation = ACTIVATIONS[activation]()

    def forward(self, obs: torch.Tensor, action: torch.Tensor | None = None) -> torch.Tensor:
        """``[n, B]`` values of ``(obs, action)``, or ``[n, B, outputs]`` for discrete critics (no action)."""
        x = encode(self.encoder, obs)
        if action is not None:
            x = torch.cat([x, action.reshape(action.shape[0], -1)], dim=-1)
        h = x.unsqueeze(0).expand(self.n, *x.shape)
        fn = functional(self.activation)
        activate = self.activation if fn is None else IN_PLACE[fn]  # in place on baddbmm's fresh output
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = torch.baddbmm(b, h, w)
            if i < last:
                h = activate(h)
        return h.squeeze(-1) if self.action_dim else h


class CategoricalActor(nn.Module):
    """Discrete SAC's actor: encoder and MLP to the logits of a categorical over the actions."""

    def __init__(self, obs_space: gym.Space, n: int, hidden: Sequence[int] = (256, 256), activation: str = "relu"):
        super().__init__()
        self.encoder, features = encoder_for(obs_space)
        self.net = mlp(features, hidden, n, activation, out_gain=0.01)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of every action, ``[B, n]``."""
        return torch.log_softmax(self.net(encode(self.encoder, obs)), dim=-1)


@contextlib.contextmanager
def frozen(module: nn.Module) -> Iterator[nn.Module]:
    """Within the block, ``module``'s parameters are constants to autograd (a loss through it, such as the actor's
    through the critic, leaves the critic's gradients alone); ``requires_grad`` is restored after."""
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield module
    finally:
        for p in params:
            p.requires_grad_(True)


POLYAK_PAIRS: weakref.WeakKeyDictionary[nn.Module, tuple[weakref.ref, list[torch.Tensor], list[torch.Tensor]]] = (
    weakref.WeakKeyDictionary()
)
"""Per target module: its online module (weakly) and both parameter lists, found on the first ``polyak`` call."""


@torch.no_grad()
def polyak(target: nn.Module, online: nn.Module, tau: float) -> None:
    """``target <- (1 - tau) target + tau online``, parameter by parameter (one fused call). The parameter lists of
    a (target, online) pair are found once (``POLYAK_PAIRS``), not walked at every call."""
    pair = POLYAK_PAIRS.get(target)
    if pair is None or pair[0]() is not online:
        pair = (weakref.ref(online), list(target.parameters()), list(online.parameters()))
        POLYAK_PAIRS[target] = pair
    t, o = pair[1], pair[2]
    if tau >= 1.0:
        torch._foreach_copy_(t, o)
    else:
        torch._foreach_lerp_(t, o, tau)
