"""Fitted Q evaluation (FQE; Le et al. 2019, used for offline policy selection by Paine et al. 2020): the value of a
fixed policy estimated from a dataset alone, without running the env.

A fresh Q network is regressed, minibatch by minibatch, on the dataset's transitions toward
``r + gamma (1 - terminated) Q'(s', pi(s'))``, with ``Q'`` a copy of ``Q`` refreshed every ``target_every`` steps (one
fitted-Q iteration each). A truncated transition bootstraps like any other (its ``next_obs`` is the true final
observation); only ``terminated`` stops the bootstrap. The policy's actions at every ``s'`` and at every episode start
are computed once by the caller (the policy is fixed), so the fit never calls the policy. The estimate is the mean of
``Q(s_0, pi(s_0))`` over the dataset's episode starts, with a bootstrap CI over those episodes.

Discrete actions: ``Q(s)`` gives one value per action and the policy is a distribution over actions per state (one-hot
for a greedy policy, the empirical distribution of several draws for a sampled one), so the target is the exact
expectation ``sum_a pi(a|s') Q'(s', a)``. Box actions: ``Q(s, a)`` takes the action as input and the target averages
``Q'(s', a_k)`` over the ``K`` actions given per state (``K = 1``: a deterministic policy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from pickaxe.models.mlp import mlp
from pickaxe.offline.fqe_config import FQEConfig


def fqe_target(reward: torch.Tensor, terminated: torch.Tensor, next_value: torch.Tensor, gamma: float) -> torch.Tensor:
    """FQE's regression target ``r + gamma (1 - terminated) V'(s')``, with ``V'(s') = E_{a ~ pi} Q'(s', a)``
    (``next_value``). A truncated transition is not ``terminated``: it bootstraps."""
    return reward + gamma * (1.0 - terminated.to(reward.dtype)) * next_value


def value_bounds(reward: np.ndarray, gamma: float) -> tuple[float, float]:
    """The range any discounted return of rewards in ``[min(reward), max(reward)]`` can have, episodes of any length
    included: ``[min(r_min, 0), max(r_max, 0)] / (1 - gamma)``. FQE's targets are clipped to it, so the Q values of
    actions the dataset never took cannot grow without bound through the bootstrap."""
    r = np.asarray(reward, dtype=np.float64)
    return min(float(r.min()), 0.0) / (1.0 - gamma), max(float(r.max()), 0.0) / (1.0 - gamma)


def expected_value(q: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """``sum_a pi(a|s) Q(s, a)``: ``q`` and ``probs`` ``[B, A]`` -> ``[B]``."""
    return (q * probs).sum(-1)


def action_distribution(actions: torch.Tensor, n: int) -> torch.Tensor:
    """The empirical distribution of ``K`` draws per state of a Discrete policy: ``actions`` ``[B, K]`` (int) ->
    ``[B, n]`` probabilities (one-hot when ``K = 1``)."""
    counts = torch.zeros(actions.shape[0], n, dtype=torch.float32, device=actions.device)
    counts.scatter_add_(1, actions.long(), torch.ones(actions.shape, dtype=torch.float32, device=actions.device))
    return counts / actions.shape[1]


def episode_starts(terminated: np.ndarray, truncated: np.ndarray) -> np.ndarray:
    """Indices of the first transition of every episode in flat transitions (episode order, then time): index 0 and
    every index after an episode's end (``terminated`` or ``truncated``)."""
    done = np.asarray(terminated, dtype=bool) | np.asarray(truncated, dtype=bool)
    starts = np.concatenate([[0], np.flatnonzero(done[:-1]) + 1])
    return starts.astype(np.int64)


class FQENetwork(nn.Module):
    """The Q network FQE fits: ``Q(s)`` per action for Discrete (``n`` actions), ``Q(s, a)`` for Box."""

    def __init__(self, obs_dim: int, hidden: tuple[int, ...], n: int | None, action_dim: int = 0) -> None:
        super().__init__()
        self.discrete = n is not None
        self.net = mlp(obs_dim if self.discrete else obs_dim + action_dim, hidden, n or 1, "relu", out_gain=0.01)

    def values(self, obs: torch.Tensor, policy: torch.Tensor) -> torch.Tensor:
        """``E_{a ~ pi} Q(s, a)`` per row: ``policy`` is ``[B, n]`` probabilities (Discrete) or ``[B, K, d]`` actions
        (Box: the mean over the ``K`` actions)."""
        if self.discrete:
            return expected_value(self.net(obs), policy)
        b, k = policy.shape[:2]
        rows = torch.cat([obs.unsqueeze(1).expand(b, k, obs.shape[-1]), policy], -1).reshape(b * k, -1)
        return self.net(rows).reshape(b, k).mean(1)

    def q(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``Q(s, a)`` of the dataset's actions: ``[B]``."""
        if self.discrete:
            return self.net(obs).gather(-1, action.long().reshape(-1, 1)).squeeze(-1)
        return self.net(torch.cat([obs, action.reshape(len(obs), -1)], -1)).squeeze(-1)


@dataclass
class FQEFit:
    """One FQE fit: ``start_values`` (``Q(s_0, pi(s_0))`` of every episode start, in dataset order) and the mean TD
    loss of the last ``target_every`` steps (in units of the largest possible value, see :func:`value_bounds`)."""

    start_values: np.ndarray
    final_loss: float

    @property
    def value(self) -> float:
        """The estimate: the mean over episode starts."""
        return float(self.start_values.mean())


def fit_fqe(
    data: dict[str, np.ndarray],
    next_policy: np.ndarray,
    start_policy: np.ndarray,
    n_actions: int | None,
    config: FQEConfig,
    device: str | torch.device = "cpu",
) -> FQEFit:
    """Fit FQE on ``data`` (``obs, action, reward, terminated, next_obs`` arrays, flat) and return the values of the
    episode starts ``data["obs"][episode_starts(...)]``.

    ``next_policy`` is the policy at every ``next_obs`` and ``start_policy`` at every episode start: ``[N, K]`` action
    indices for Discrete (``n_actions`` set), ``[N, K, d]`` actions for Box. The fit is a pure function of its
    inputs and ``config.seed`` (its own torch generator; the global RNG is left as it was)."""
    device = torch.device(device)

    def tensor(x: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(x)).to(device=device, dtype=dtype)

    n = len(data["reward"])
    obs = tensor(data["obs"].reshape(n, -1))
    next_obs = tensor(data["next_obs"].reshape(n, -1))
    reward, terminated = tensor(data["reward"]), tensor(data["terminated"])
    action = tensor(data["action"], torch.int64 if n_actions is not None else torch.float32)
    starts = episode_starts(data["terminated"], data["truncated"])
    start_obs = obs[torch.as_tensor(starts, device=device)]
    if n_actions is not None:
        next_pi = action_distribution(tensor(next_policy, torch.int64), n_actions)
        start_pi = action_distribution(tensor(start_policy, torch.int64), n_actions)
        action_dim = 0
    else:
        next_pi, start_pi = tensor(next_policy), tensor(start_policy)
        action_dim = int(next_pi.shape[-1])
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(config.seed)
        q = FQENetwork(obs.shape[1], tuple(config.hidden), n_actions, action_dim).to(device)
        target = FQENetwork(obs.shape[1], tuple(config.hidden), n_actions, action_dim).to(device)
    target.load_state_dict(q.state_dict())
    target.requires_grad_(False)
    opt = torch.optim.Adam(q.parameters(), lr=config.lr)
    gen = torch.Generator(device=device).manual_seed(config.seed)
    low, high = value_bounds(data["reward"], config.gamma)
    scale = max(abs(low), abs(high)) or 1.0  # the network fits values in units of the largest possible one
    losses = torch.zeros(config.target_every, device=device)
    for step in range(config.steps):
        idx = torch.randint(0, n, (config.batch_size,), generator=gen, device=device)
        with torch.no_grad():
            next_value = target.values(next_obs[idx], next_pi[idx]) * scale
            y = fqe_target(reward[idx], terminated[idx], next_value, config.gamma).clamp(low, high) / scale
        loss = nn.functional.mse_loss(q.q(obs[idx], action[idx]), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses[step % config.target_every] = loss.detach()
        if (step + 1) % config.target_every == 0:
            target.load_state_dict(q.state_dict())
    with torch.no_grad():
        values = (q.values(start_obs, start_pi).double() * scale).cpu().numpy()
    kept = min(config.steps, config.target_every)
    return FQEFit(values, float(losses[:kept].mean().item()))


def policy_actions(policy: Any, obs: np.ndarray, config: FQEConfig, device: str | torch.device = "cpu") -> np.ndarray:
    """The actions ``policy`` (``act(obs, deterministic)``) takes at ``obs``: ``[N, 1, ...]`` greedy, or
    ``[N, action_samples, ...]`` draws with ``config.policy == "sampled"`` (seeded by ``config.seed``; the global
    RNG is left as it was). Rows go through the policy in chunks of 4,096."""
    device = torch.device(device)
    greedy = config.policy == "greedy"
    draws = 1 if greedy else config.action_samples
    out = []
    with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(config.seed)
        for i in range(0, len(obs), 4096):
            chunk = torch.as_tensor(np.ascontiguousarray(obs[i : i + 4096])).to(device)
            acts = [policy.act(chunk, deterministic=greedy)[0] for _ in range(draws)]
            out.append(torch.stack(acts, 1).cpu().numpy())
    return np.concatenate(out)


__all__ = [
    "FQEFit",
    "FQENetwork",
    "action_distribution",
    "episode_starts",
    "expected_value",
    "fit_fqe",
    "fqe_target",
    "policy_actions",
    "value_bounds",
]
