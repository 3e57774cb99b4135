"""Pure pieces of the multi-agent algorithms: per-agent GAE over ``[T, N, A]`` rollouts with absent agents cut out,
PPO's loss with a mask of present agent-steps (IPPO, MAPPO), and independent DQN's double-Q target. They reuse PPO's
clipped surrogate, value loss and KL estimate, the TD target (``algos.core``) and ``data.returns.gae``."""

from __future__ import annotations

import torch

from pickaxe.algos.core import approx_kl, clipped_surrogate, normalize, td_target, value_loss
from pickaxe.data.returns import gae


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``x`` over the elements where ``mask`` is True (all of them without a mask; NaN when none is)."""
    return x.mean() if mask is None else x[mask].mean()


def agent_gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    present: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE ``(advantage, return)`` of every agent of a ``[T, N, A]`` rollout, each agent its own sequence.

    A step where the agent is absent (``present`` False) is its own ended episode with zero reward, value and
    bootstrap, so nothing flows across it; those rows are zero and must stay out of the loss (the learner drops
    them). Truncation bootstraps from ``next_value`` as in ``data.returns.gae``."""
    T = reward.shape[0]
    absent = ~present
    zero = torch.zeros_like(value)
    flat = [t.reshape(T, -1) for t in (
        torch.where(present, reward, zero), torch.where(present, value, zero), torch.where(present, next_value, zero),
        terminated | absent, truncated & present,
    )]  # fmt: skip
    advantage, returns = gae(*flat, gamma, lam)
    advantage = torch.where(present, advantage.view_as(value), zero)
    return advantage, torch.where(present, returns.view_as(value), zero)


def multiagent_ppo_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantage: torch.Tensor,
    entropy: torch.Tensor,
    value: torch.Tensor,
    old_value: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor | None,
    clip: float,
    vf_coef: float,
    ent_coef: float,
    value_clip: float | None = None,
    normalize_advantage: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's loss over the agent-steps where ``mask`` is True (None: all). The masked-out elements are dropped
    before anything is computed from them, so an absent agent's values, actions and rewards (whatever they hold,
    infinities included) change neither the loss nor any gradient."""
    if mask is not None:
        logprob, old_logprob, advantage, entropy, value, old_value, returns = (
            t[mask] for t in (logprob, old_logprob, advantage, entropy, value, old_value, returns)
        )
    if normalize_advantage:
        advantage = normalize(advantage)
    pg, _, clipped = clipped_surrogate(logprob, old_logprob, advantage, clip, clip)
    pg_loss = pg.mean()
    v_loss = value_loss(value, old_value, returns, value_clip).mean()
    ent = entropy.mean()
    loss = pg_loss + vf_coef * v_loss - ent_coef * ent
    stats = {
        "loss/policy": pg_loss.detach(),
        "loss/value": v_loss.detach(),
        "loss/entropy": ent.detach(),
        "ppo/approx_kl": approx_kl(logprob.detach(), old_logprob),
        "ppo/clip_fraction": clipped.float().mean(),
    }
    return loss, stats


def independent_q_target(
    next_q_online: torch.Tensor,
    next_q_target: torch.Tensor,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
    double: bool = True,
) -> torch.Tensor:
    """Each agent-step's one-step target ``r + gamma * (1 - terminated) * Q_target(s', a*)``, ``a*`` the online
    network's argmax (double DQN) or the target's own; an agent that left (terminated) does not bootstrap, one whose
    episode was truncated does."""
    chooser = next_q_online if double else next_q_target
    best = next_q_target.gather(-1, chooser.argmax(-1, keepdim=True)).squeeze(-1)
    return td_target(reward, best, terminated, gamma)
