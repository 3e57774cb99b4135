"""Pure loss functions of the offline algorithms (behaviour cloning, TD3+BC, IQL, CQL, BCQ, CRR), each a function of
tensors with a known answer on hand-computed cases (tests/test_offline_losses.py), and the dataset's reward scale
(``return_range_scale``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from pickaxe.errors import ConfigError

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def gaussian_logprob(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """``log N(action; mean, exp(log_std)^2)`` summed over the last axis, ``[B]``."""
    z = (action - mean) * torch.exp(-log_std)
    return (-0.5 * z.pow(2) - log_std - _LOG_SQRT_2PI).sum(-1)


def categorical_nll(logprobs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Behaviour cloning on Discrete actions: ``-mean log pi(a|s)``; ``logprobs``: ``[B, n]``, ``action``: ``[B]``."""
    return -logprobs.gather(-1, action.long().reshape(-1, 1)).mean()


def gaussian_nll(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Behaviour cloning on Box actions: ``-mean log N(a; mean, std)`` (``[B, A]`` each; ``log_std`` broadcasts)."""
    return -gaussian_logprob(mean, log_std, action).mean()


def bc_squared_error(policy_action: torch.Tensor, data_action: torch.Tensor) -> torch.Tensor:
    """Behaviour cloning by regression: ``mean (pi(s) - a)^2`` over the batch and the action's dimensions (TD3+BC's
    BC term; ``[B, A]`` each)."""
    return (policy_action - data_action).pow(2).mean()


def td3_bc_actor_loss(q: torch.Tensor, policy_action: torch.Tensor, data_action: torch.Tensor, alpha: float):
    """TD3+BC's actor loss ``-lambda mean Q(s, pi(s)) + mean (pi(s) - a)^2`` with ``lambda = alpha / mean|Q|``
    (the normaliser a constant: no gradient through it); ``q``: ``[B]``, actions ``[B, A]``. Returns ``(loss,
    lambda)``."""
    lam = alpha / q.abs().mean().detach().clamp_min(1e-8)
    return -lam * q.mean() + bc_squared_error(policy_action, data_action), lam


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """IQL's asymmetric square ``mean |tau - 1(diff < 0)| diff^2`` of ``diff = Q - V``: with ``tau`` > 0.5 positive
    errors (V below Q) weigh more, so V fits an upper expectile of Q."""
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return (weight * diff.pow(2)).mean()


def advantage_weights(advantage: torch.Tensor, beta: float, max_weight: float) -> torch.Tensor:
    """IQL's policy-extraction weights ``min(exp(beta * A), max_weight)`` (constants to the policy loss)."""
    return torch.exp(beta * advantage.detach()).clamp(max=max_weight)


def weighted_nll(logprob: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Advantage-weighted regression: ``-mean w log pi(a|s)`` over the dataset's actions."""
    return -(weights.detach() * logprob).mean()


def cql_discrete_penalty(q_all: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """CQL's penalty on Discrete actions, ``mean_s (logsumexp_a Q(s, a) - Q(s, a_data))``; ``q_all``: ``[B, n]``."""
    q_data = q_all.gather(-1, action.long().reshape(-1, 1)).squeeze(-1)
    return (torch.logsumexp(q_all, dim=-1) - q_data).mean()


def cql_continuous_penalty(
    q_random: torch.Tensor,
    q_policy: torch.Tensor,
    logp_policy: torch.Tensor,
    q_data: torch.Tensor,
    action_dim: int,
) -> torch.Tensor:
    """CQL(H)'s penalty on Box actions per critic, ``mean_s (logsumexp_a Q(s, a) - Q(s, a_data))``, the log-sum-exp
    over actions estimated by importance sampling from ``N`` uniform samples in ``[-1, 1]^A`` (density ``2^-A``) and
    ``M`` policy samples (densities ``exp(logp_policy)``): ``logsumexp([Q_rand + A log 2, Q_pi - logp_pi]) -
    log(N + M)``. Shapes: ``q_random`` ``[C, N, B]``, ``q_policy`` and ``logp_policy`` ``[C, M, B]`` (logp broadcast
    over critics), ``q_data`` ``[C, B]``. Returns ``[C]``: one penalty per critic."""
    n = q_random.shape[1] + q_policy.shape[1]
    stacked = torch.cat([q_random + action_dim * math.log(2.0), q_policy - logp_policy], dim=1)
    return (torch.logsumexp(stacked, dim=1) - math.log(n) - q_data).mean(-1)


def bcq_allowed(logprobs: torch.Tensor, threshold: float) -> torch.Tensor:
    """Discrete BCQ's action filter: ``pi(a|s) / max_a' pi(a'|s) >= threshold``, ``[B, n]`` booleans from the
    behaviour-cloning head's log-probabilities ``[B, n]`` (the most probable action always passes)."""
    ratio = torch.exp(logprobs - logprobs.max(dim=-1, keepdim=True).values)
    return ratio >= threshold


def bcq_argmax(
    q: torch.Tensor, logprobs: torch.Tensor, threshold: float, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """The action of highest ``q`` among those ``bcq_allowed`` lets through, ``[B]`` (``q``, ``logprobs``:
    ``[B, n]``); ``allowed``: that filter's mask when the caller already has it."""
    if allowed is None:
        allowed = bcq_allowed(logprobs, threshold)
    masked = torch.where(allowed, q, torch.finfo(q.dtype).min)
    return masked.argmax(dim=-1)


def bcq_imitation_loss(logits: torch.Tensor, action: torch.Tensor, penalty: float) -> torch.Tensor:
    """BCQ's behaviour-cloning head: cross-entropy of the dataset's actions plus ``penalty * mean logits^2``;
    ``logits``: ``[B, n]`` (unnormalised), ``action``: ``[B]``."""
    nll = categorical_nll(torch.log_softmax(logits, dim=-1), action)
    return nll + penalty * logits.pow(2).mean()


def crr_advantage(
    q_data: torch.Tensor, q_other: torch.Tensor, mode: str, probs: torch.Tensor | None = None
) -> torch.Tensor:
    """CRR's advantage ``Q(s, a_data) - V(s)``, ``[B]``: ``V`` is the mean (``mode="mean"``; weighted by ``probs``
    where given, e.g. a categorical policy's probabilities over all actions) or the max (``"max"``) of ``q_other``,
    ``[B, K]``: the values of ``K`` actions of the policy at each state."""
    if mode == "max":
        v = q_other.max(dim=-1).values
    elif probs is not None:
        v = (probs * q_other).sum(-1)
    else:
        v = q_other.mean(-1)
    return (q_data - v).detach()


def crr_weights(advantage: torch.Tensor, kind: str, beta: float, max_weight: float) -> torch.Tensor:
    """CRR's weights of the dataset's actions: ``min(exp(A / beta), max_weight)`` (``kind="exp"``) or ``1[A > 0]``
    (``"binary"``); constants to the policy loss."""
    a = advantage.detach()
    if kind == "binary":
        return (a > 0).to(a.dtype)
    return torch.exp(a / beta).clamp(max=max_weight)


def return_range_scale(episode_returns: Sequence[float] | np.ndarray) -> float:
    """The ``return-range`` reward scale: ``1000 / (max - min)`` of a dataset's episode returns (IQL's reference code
    on locomotion datasets), computed in float64. A dataset of fewer than two episodes, or whose episodes all return
    the same, has no range: refused (ConfigError)."""
    returns = np.asarray(episode_returns, dtype=np.float64)
    spread = float(returns.max() - returns.min()) if returns.size else 0.0
    if returns.size < 2 or not spread > 0 or not math.isfinite(spread):
        raise ConfigError(
            f"--algo.reward-scale return-range needs episodes of different returns; the dataset's {returns.size} "
            f"episode(s) span {spread!r}: drop --algo.reward-scale"
        )
    return 1000.0 / spread
