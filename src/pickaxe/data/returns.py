"""Advantage and return estimators over time-major ``[T, N]`` tensors.

Truncation is not termination: ``next_value`` must be the value of the *real* next observation (the final
observation of an episode where it ended), and it is cut only where ``terminated`` is set. Where an
episode was truncated the return bootstraps from ``next_value``; the recursion stops at every episode end
(``terminated | truncated``) so no advantage leaks across a reset.
"""

from __future__ import annotations

import torch


def gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation; returns ``(advantage, return)`` with ``return = advantage + value``.

    All inputs are ``[T, N]``; ``next_value[t]`` is V of the observation that followed step ``t``.
    """
    not_term = 1.0 - terminated.to(value.dtype)
    not_done = 1.0 - (terminated | truncated).to(value.dtype)
    delta = reward + gamma * not_term * next_value - value
    advantage = torch.empty_like(value)
    last = torch.zeros_like(value[0])
    discount = gamma * lam * not_done
    for t in range(reward.shape[0] - 1, -1, -1):
        last = delta[t] + discount[t] * last
        advantage[t] = last
    return advantage, advantage + value


def discounted_returns(
    reward: torch.Tensor,
    next_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """Bootstrapped discounted returns (GAE with ``lam=1`` and zero baseline), ``[T, N]``.

    At an episode end the return is ``r`` (terminated) or ``r + gamma * next_value`` (truncated); at the
    last step of the rollout it bootstraps from ``next_value``.
    """
    not_term = 1.0 - terminated.to(reward.dtype)
    cut = (terminated | truncated).to(reward.dtype)
    cut[-1] = 1.0  # the rollout's last step bootstraps like a truncation
    bootstrap = not_term * next_value
    out = torch.empty_like(reward)
    running = torch.zeros_like(reward[0])
    for t in range(reward.shape[0] - 1, -1, -1):
        running = reward[t] + gamma * (cut[t] * bootstrap[t] + (1.0 - cut[t]) * running)
        out[t] = running
    return out
