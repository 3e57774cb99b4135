"""Pure functions of the exploration bonuses (RND, ICM): intrinsic rewards, their normalisation, the combined
advantage and ICM's module loss. No state: the running statistics they read are passed in."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def rnd_intrinsic_reward(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """RND's raw intrinsic reward per row: the predictor's squared error against the fixed random target, averaged
    over the feature axis (``[B, F] -> [B]``)."""
    return (predicted - target).pow(2).mean(-1)


def running_discounted_returns(
    reward: torch.Tensor, carry: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """RND's forward filter: ``R_t = gamma * R_{t-1} + r_t`` along the time axis of a ``[T, N]`` reward, starting from
    each env's ``carry`` ``[N]`` and never reset at episode ends (the intrinsic return is non-episodic). Returns all
    ``R_t`` ``[T, N]`` and the last row (the next rollout's carry)."""
    out = torch.empty_like(reward)
    last = carry.to(reward.dtype)
    for t in range(reward.shape[0]):
        last = gamma * last + reward[t]
        out[t] = last
    return out, last


def normalize_intrinsic(reward: torch.Tensor, return_var: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Intrinsic rewards divided by the running std of the intrinsic returns (not centred: a bonus stays >= 0)."""
    return (reward / torch.sqrt(return_var.to(reward.dtype) + eps)).to(reward.dtype)


def combined_advantage(
    ext_advantage: torch.Tensor, int_advantage: torch.Tensor, ext_coef: float, int_coef: float
) -> torch.Tensor:
    """The advantage PPO's surrogate uses with two value heads: ``ext_coef * A_ext + int_coef * A_int``."""
    return ext_coef * ext_advantage + int_coef * int_advantage


def rnd_predictor_loss(predicted: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The predictor's loss: mean squared error to the (detached) target features over the rows kept by ``mask``
    (all rows when None; at least one row counted)."""
    per_row = (predicted - target.detach()).pow(2).mean(-1)
    if mask is None:
        return per_row.mean()
    mask = mask.to(per_row.dtype)
    return (per_row * mask).sum() / mask.sum().clamp_min(1.0)


def icm_intrinsic_reward(predicted_next: torch.Tensor, next_features: torch.Tensor, eta: float) -> torch.Tensor:
    """ICM's intrinsic reward per row: ``eta * 0.5 * ||phi_hat(s') - phi(s')||^2`` (squared norm over features)."""
    return eta * 0.5 * (predicted_next - next_features).pow(2).sum(-1)


def icm_forward_loss(predicted_next: torch.Tensor, next_features: torch.Tensor) -> torch.Tensor:
    """The forward model's loss: ``0.5 * ||phi_hat(s') - phi(s')||^2`` averaged over rows, the target features
    detached (the inverse loss alone shapes the feature space, so it cannot collapse to make prediction easy)."""
    return 0.5 * (predicted_next - next_features.detach()).pow(2).sum(-1).mean()


def icm_inverse_loss(inverse_out: torch.Tensor, action: torch.Tensor, discrete: bool) -> torch.Tensor:
    """The inverse model's loss: cross-entropy of the taken action (Discrete) or its mean squared error (Box)."""
    if discrete:
        return F.cross_entropy(inverse_out, action.long().reshape(-1))
    return (inverse_out - action.reshape(inverse_out.shape)).pow(2).sum(-1).mean()


def icm_module_loss(inverse: torch.Tensor, forward: torch.Tensor, beta: float) -> torch.Tensor:
    """ICM's loss: ``(1 - beta) * inverse + beta * forward``."""
    return (1.0 - beta) * inverse + beta * forward
