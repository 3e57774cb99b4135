"""Running normalisation of observations and rewards, as Stable-Baselines3's ``VecNormalize`` does it, but with
statistics that change only between rollouts: the sampler and the learner see identical inputs.

``RunningMeanStd`` keeps mean, variance and count in float64 as module buffers (so they travel with the model
weights and the checkpoint) and merges a batch with Chan et al.'s parallel update, or takes a whole dataset's
statistics at once (``fit``). ``ObsNormalized`` puts one in front of an actor-critic; ``NormalizedEncoder`` puts one in
front of any network's observation encoder (``frozen_obs_norm``: the offline algorithms' dataset statistics);
``RewardScaler`` divides rewards by the running std of the discounted return.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from pickaxe.errors import ConfigError
from pickaxe.models.encoders import encode, is_image_space
from pickaxe.models.policy import ActFn, rollout_act


class RunningMeanStd(nn.Module):
    """Mean and (population) variance of everything seen so far, per feature, in float64.

    ``update(x)`` merges a batch ``[B, *shape]`` (Chan's parallel formula: exact, order-independent up to rounding);
    ``fit(x)`` replaces the statistics by exactly ``x``'s; ``forward(x)`` is ``clip((x - mean) / (sqrt(var + eps) +
    std_eps))`` in float32 (``std_eps`` 0, the default, is SB3's form; ``eps`` 0 and ``std_eps`` 1e-3 TD3+BC's
    ``(x - mean) / (std + 1e-3)``). Starts at mean 0, var 1 and a tiny count (as SB3), so the first batch's statistics
    dominate at once.
    """

    def __init__(
        self, shape: tuple[int, ...] = (), clip: float = 10.0, eps: float = 1e-8, std_eps: float = 0.0
    ) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.clip = clip
        self.eps = eps
        self.std_eps = std_eps

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge the batch ``x`` (leading axis = samples) into the statistics."""
        x = x.detach().to(self.mean.device, torch.float64).reshape(-1, *self.mean.shape)
        n = x.shape[0]
        if n == 0:
            return
        b_mean, b_var = x.mean(0), x.var(0, unbiased=False)
        total = self.count + n
        delta = b_mean - self.mean
        m2 = self.var * self.count + b_var * n + delta.pow(2) * self.count * n / total
        self.mean += delta * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    @torch.no_grad()
    def fit(self, x: torch.Tensor) -> None:
        """Set the statistics to those of ``x`` (leading axis = samples) alone, in float64: its mean, its population
        variance and its count."""
        x = x.detach().to(self.mean.device, torch.float64).reshape(-1, *self.mean.shape)
        if x.shape[0] == 0:
            raise ValueError("fit needs at least one sample")
        self.mean.copy_(x.mean(0))
        self.var.copy_(x.var(0, unbiased=False))
        self.count.fill_(x.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised and clipped ``x`` (float32)."""
        std = torch.sqrt(self.var + self.eps)
        z = (x.to(torch.float64) - self.mean) / (std + self.std_eps if self.std_eps else std)
        if math.isfinite(self.clip):
            z = z.clamp(-self.clip, self.clip)
        return z.to(torch.float32)


class ObsNormalized(nn.Module):
    """An actor-critic whose observations pass through a frozen ``RunningMeanStd`` first.

    ``act``, ``value`` and ``evaluate_actions`` are the inner policy's on normalised observations; the statistics
    change only when the algorithm calls ``obs_norm.update`` (once per collect, after learning from the rollout), so
    a rollout's sampler and its learner normalise identically. The statistics are buffers: they are in the model
    file, so evaluation after loading it normalises as training did.
    """

    def __init__(self, inner: nn.Module, obs_shape: tuple[int, ...], clip: float = 10.0) -> None:
        super().__init__()
        self.inner = inner
        self.obs_norm = RunningMeanStd(obs_shape, clip=clip)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The inner policy's ``act`` on normalised observations."""
        return self.inner.act(self.obs_norm(obs), deterministic)

    def frozen_act(self) -> ActFn:
        """The inner policy's ``frozen_act`` (or ``act``) on normalised observations, for one rollout."""
        inner = rollout_act(self.inner)

        def act(obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            return inner(self.obs_norm(obs), deterministic)

        return act

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """The inner critic on normalised observations."""
        return self.inner.value(self.obs_norm(obs))

    def evaluate_actions(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The inner ``evaluate_actions`` on normalised observations."""
        return self.inner.evaluate_actions(self.obs_norm(obs), action)


DATASET_STD_EPS = 1e-3
"""Added to the dataset's std before dividing by it, as TD3+BC (Fujimoto & Gu 2021) and its reference code do."""


class NormalizedEncoder(nn.Module):
    """A network's observation encoder behind frozen observation statistics: ``encoder(norm(obs))``."""

    def __init__(self, norm: RunningMeanStd, encoder: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.encoder = encoder
        self.features = getattr(encoder, "features", None)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The encoder's features of the normalised observations."""
        return encode(self.encoder, self.norm(obs))


def frozen_obs_norm(obs_space: gym.Space, *nets: nn.Module) -> None:
    """Put dataset statistics in front of every network of ``nets`` (each has an ``encoder``, the first stage of
    every classic network): each gets its own ``RunningMeanStd`` in TD3+BC's form (``(x - mean) / (std + 1e-3)``,
    unclipped) inside a ``NormalizedEncoder``, the identity until ``fit_obs_norm`` sets them or a weights file loads
    them (they are buffers of the network). Nothing updates them while training. Vector observations only: images
    are refused with a one-line ``ConfigError``."""
    if is_image_space(obs_space) or not isinstance(obs_space, gym.spaces.Box):
        raise ConfigError(f"normalize_obs takes vector observations, not {obs_space}: drop --algo.normalize-obs")
    stats = RunningMeanStd(tuple(obs_space.shape), clip=math.inf, eps=0.0, std_eps=DATASET_STD_EPS)
    stats.var.fill_((1.0 - DATASET_STD_EPS) ** 2)  # the identity until fitted: std + 1e-3 = 1
    for net in nets:
        encoder = getattr(net, "encoder", None)
        if not isinstance(encoder, nn.Module):
            raise TypeError(f"{type(net).__name__} has no observation encoder to normalise in front of")
        if isinstance(encoder, NormalizedEncoder):
            raise ValueError(f"{type(net).__name__}'s observations are normalised already")
        net.encoder = NormalizedEncoder(copy.deepcopy(stats), encoder)


def obs_norms(nets: Iterable[nn.Module]) -> list[RunningMeanStd]:
    """The observation statistics in front of ``nets``' encoders (``frozen_obs_norm``), each once."""
    found: dict[int, RunningMeanStd] = {}
    for net in nets:
        for module in net.modules():
            if isinstance(module, NormalizedEncoder):
                found.setdefault(id(module.norm), module.norm)
    return list(found.values())


def fit_obs_norm(nets: Iterable[nn.Module], obs: torch.Tensor) -> int:
    """Set every ``frozen_obs_norm`` statistics in front of ``nets`` to those of ``obs`` (a dataset's observations,
    leading axis = samples), computed once and copied to the others; returns how many were set."""
    norms = obs_norms(nets)
    if norms:
        norms[0].fit(obs)
        for norm in norms[1:]:
            norm.load_state_dict(norms[0].state_dict())
    return len(norms)


class RewardScaler:
    """Scales rewards by the running std of each env's discounted return (SB3 ``VecNormalize``'s reward part).

    ``scale(reward, done)`` takes a ``[T, N]`` rollout: it accumulates ``ret = gamma * ret + r`` per env (reset
    after every episode end), merges the rollout's ``ret`` values into the statistics, then returns
    ``clip(r / sqrt(var + eps))``. The accumulator carries across rollouts and is part of ``state_dict``.
    """

    def __init__(self, gamma: float, clip: float = 10.0, eps: float = 1e-8) -> None:
        self.gamma = gamma
        self.clip = clip
        self.eps = eps
        self.stats = RunningMeanStd(())
        self.ret: torch.Tensor | None = None

    def scale(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """Scaled rewards of a ``[T, N]`` rollout (float32); ``done`` marks episode ends (terminated | truncated)."""
        r = reward.detach().cpu().to(torch.float64)
        d = done.detach().cpu()
        ret = torch.zeros(r.shape[1], dtype=torch.float64) if self.ret is None else self.ret
        seen = torch.empty_like(r)
        for t in range(r.shape[0]):
            ret = ret * self.gamma + r[t]
            seen[t] = ret
            ret = torch.where(d[t], torch.zeros_like(ret), ret)
        self.ret = ret
        self.stats.update(seen.reshape(-1))
        scaled = (r / torch.sqrt(self.stats.var + self.eps)).clamp(-self.clip, self.clip)
        return scaled.to(device=reward.device, dtype=reward.dtype)

    def state_dict(self) -> dict[str, Any]:
        """Statistics and the per-env return accumulator."""
        return {"stats": self.stats.state_dict(), "ret": self.ret}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.stats.load_state_dict(state["stats"])
        ret = state["ret"]
        self.ret = None if ret is None else torch.as_tensor(ret, dtype=torch.float64).clone()
