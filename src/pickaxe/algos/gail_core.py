"""GAIL's pure pieces: the discriminator's loss, its gradient penalty and the reward it gives the policy.

The discriminator outputs a logit ``z``; ``D = sigmoid(z)`` is its probability that an ``(s, a)`` pair is the
expert's. Everything is computed from logits (``softplus``), so no ``log(0)`` arises however sure it gets.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F


def discriminator_loss(expert_logits: torch.Tensor, policy_logits: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy with the demonstrations labelled 1 and the policy's pairs 0, each side's mean summed:
    ``mean(-log D(expert)) + mean(-log(1 - D(policy)))`` (``2 log 2`` when every logit is 0)."""
    return F.softplus(-expert_logits).mean() + F.softplus(policy_logits).mean()


def discriminator_reward(logits: torch.Tensor, form: str = "gail") -> torch.Tensor:
    """The policy's reward for pairs whose discriminator logits are ``logits``: ``gail``: ``-log(1 - D) =
    softplus(z)`` (always positive); ``airl``: ``log D - log(1 - D) = z``."""
    if form == "gail":
        return F.softplus(logits)
    if form == "airl":
        return logits.clone()
    raise ValueError(f"unknown GAIL reward form {form!r}; use gail or airl")


def absorbing_value(reward: torch.Tensor, gamma: float) -> torch.Tensor:
    """What a terminated step's reward gains when the episode's end is a step into an absorbing state that pays
    ``reward`` forever (Kostrikov et al. 2019): ``gamma * reward / (1 - gamma)``, the discounted sum from the next
    step on."""
    return gamma * reward / (1.0 - gamma)


def gradient_penalty(
    logit_fn: Callable[[torch.Tensor], torch.Tensor],
    expert_x: torch.Tensor,
    policy_x: torch.Tensor,
    mix: torch.Tensor,
) -> torch.Tensor:
    """``mean((||grad_x logit_fn(x)||_2 - 1)^2)`` at ``x = mix * expert_x + (1 - mix) * policy_x`` (rows of
    discriminator inputs; ``mix`` ``[B]`` in [0, 1]), differentiable in ``logit_fn``'s parameters (Gulrajani et al.
    2017). A linear logit ``w . x`` gives ``(||w|| - 1)^2`` at every mix."""
    m = mix.reshape(-1, *([1] * (expert_x.dim() - 1)))
    x = (m * expert_x + (1 - m) * policy_x).detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(logit_fn(x).sum(), x, create_graph=True)
    return (grad.flatten(1).norm(dim=1) - 1).pow(2).mean()


def discriminator_accuracy(expert_logits: torch.Tensor, policy_logits: torch.Tensor) -> tuple[float, float]:
    """The fractions of demonstration pairs judged expert (``z > 0``) and of policy pairs judged policy (``z < 0``)."""
    return float((expert_logits > 0).float().mean()), float((policy_logits < 0).float().mean())
