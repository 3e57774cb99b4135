"""RLHF loss and advantage pieces: pure functions of tensors, tested against hand-computed values.

* preference losses: :func:`bradley_terry_loss` (reward model), :func:`dpo_loss` (DPO, cDPO, IPO);
* PPO for LLMs: :func:`kl_shaped_token_rewards` (k1 KL per token, the sequence reward at the last response
  token), :func:`token_gae`, :func:`token_value_loss` (value clipping), :func:`whiten`;
* critic-free advantages: :func:`rloo_advantages`, :func:`reinforce_pp_advantages` (REINFORCE++ with and without
  baseline), :func:`token_returns`.

Shapes follow ``pickaxe.algos.llm_core``: per-sequence tensors are ``[B]``; per-token tensors are ``[B, L]`` aligned
with ``input_ids`` (column ``j`` is about token ``j``: prompt left-padded, response right-padded) and ``mask`` (the
Batch's ``loss_mask``) is 1 exactly on the response tokens, EOS included. Responses are ragged: a row's response
ends at its last mask column, whether it stopped on EOS or was truncated at the generation budget. Off the mask,
inputs may hold anything (``-inf`` log-probs, garbage values): every piece replaces them through ``torch.where``
before any arithmetic, so outputs and gradients there are exactly 0.

Per-pair losses take ``total_pairs`` (the count of the whole optimizer step), so the sum of micro-batch losses
equals the loss of the full batch, like ``llm_core.aggregate``'s ``total_tokens``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from pickaxe.algos.configs import KLEstimator
from pickaxe.algos.core import value_loss
from pickaxe.algos.llm_core import kl_estimate, masked

DPO_LOSSES = ("sigmoid", "ipo")


class PairLoss(NamedTuple):
    """What a preference loss returns: ``loss`` (scalar, the per-pair losses summed and divided by the step's pair
    count), ``accuracy`` (scalar, the fraction of pairs, over the same count, whose chosen reward is strictly above
    the rejected one; no gradient) and the per-pair ``chosen`` and ``rejected`` rewards (``[B]``, no gradient:
    the reward model's scores for Bradley–Terry, DPO's implicit rewards ``beta * (log pi - log pi_ref)``)."""

    loss: torch.Tensor
    accuracy: torch.Tensor
    chosen: torch.Tensor
    rejected: torch.Tensor

    @property
    def margin(self) -> torch.Tensor:
        """``[B]`` chosen minus rejected reward (no gradient)."""
        return self.chosen - self.rejected


def _pair_mean(values: torch.Tensor, total_pairs: float | None) -> torch.Tensor:
    return values.sum() / (values.shape[0] if total_pairs is None else total_pairs)


def bradley_terry_loss(
    chosen_reward: torch.Tensor,
    rejected_reward: torch.Tensor,
    margin: torch.Tensor | float | None = None,
    total_pairs: float | None = None,
) -> PairLoss:
    """The reward model's Bradley–Terry loss ``-log sigmoid(r_chosen - r_rejected - margin)`` per pair, averaged.

    ``chosen_reward`` and ``rejected_reward`` are ``[B]`` scalar-head outputs of the same pairs. ``margin`` (a
    float or ``[B]``, Llama 2's preference-strength margin) asks the chosen reward to lead by at least that much;
    None is 0. ``total_pairs`` is the pair count of the whole optimizer step (default: ``B``).
    """
    diff = chosen_reward - rejected_reward
    if margin is not None:
        diff = diff - margin
    loss = _pair_mean(-F.logsigmoid(diff), total_pairs)
    chosen, rejected = chosen_reward.detach(), rejected_reward.detach()
    accuracy = _pair_mean((chosen > rejected).float(), total_pairs)
    return PairLoss(loss, accuracy, chosen, rejected)


def dpo_loss(
    policy_chosen_logp: torch.Tensor,
    policy_rejected_logp: torch.Tensor,
    ref_chosen_logp: torch.Tensor,
    ref_rejected_logp: torch.Tensor,
    beta: float,
    loss: str = "sigmoid",
    label_smoothing: float = 0.0,
    total_pairs: float | None = None,
) -> PairLoss:
    """Direct Preference Optimization on ``[B]`` sequence log-probs of the chosen and rejected responses (summed
    over response tokens, e.g. ``llm_core.sequence_sum(logprob, mask)``) under the policy and the frozen reference.

    With ``h = (pi_c - pi_r) - (ref_c - ref_r)``:

    * ``sigmoid`` (DPO, Rafailov et al. 2023): ``-log sigmoid(beta h)``; ``label_smoothing`` ``e`` > 0 is
      conservative DPO (cDPO), the expected loss when each label is flipped with probability ``e``:
      ``-(1 - e) log sigmoid(beta h) - e log sigmoid(-beta h)``;
    * ``ipo`` (Azar et al. 2023): ``(h - 1 / (2 beta))^2``, regressing the log-ratio gap to a finite target.
      The loss is on the log-probs given: TRL length-normalises them for IPO (pass per-token means for that).

    Returns a :class:`PairLoss` whose ``chosen``/``rejected`` are the implicit rewards ``beta (pi - ref)``.
    ``total_pairs`` is the pair count of the whole optimizer step (default: ``B``).
    """
    if loss not in DPO_LOSSES:
        raise ValueError(f"unknown DPO loss {loss!r}; choose one of {DPO_LOSSES}")
    if beta <= 0:
        raise ValueError(f"DPO beta must be > 0, got {beta}; the usual range is 0.01-0.5")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}; 0 is plain DPO")
    if loss == "ipo" and label_smoothing:
        raise ValueError("label_smoothing applies to the sigmoid loss only; set it to 0 with loss='ipo'")
    chosen_ratio = policy_chosen_logp - ref_chosen_logp
    rejected_ratio = policy_rejected_logp - ref_rejected_logp
    h = chosen_ratio - rejected_ratio
    if loss == "ipo":
        per_pair = (h - 1.0 / (2.0 * beta)).pow(2)
    else:
        per_pair = -(1.0 - label_smoothing) * F.logsigmoid(beta * h)
        if label_smoothing:
            per_pair = per_pair - label_smoothing * F.logsigmoid(-beta * h)
    chosen, rejected = beta * chosen_ratio.detach(), beta * rejected_ratio.detach()
    accuracy = _pair_mean((chosen > rejected).float(), total_pairs)
    return PairLoss(_pair_mean(per_pair, total_pairs), accuracy, chosen, rejected)


def _group_stats(values: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence: the sum of its group's ``values`` and the group's size."""
    ids, inverse = torch.unique(group, return_inverse=True)
    v = values.float()
    total = torch.zeros(len(ids), device=v.device).index_add_(0, inverse, v)
    count = torch.zeros(len(ids), device=v.device).index_add_(0, inverse, torch.ones_like(v))
    return total[inverse], count[inverse]


def rloo_advantages(reward: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024): ``[B]`` advantage ``r_i - mean_{j != i, same group} r_j``.

    ``group`` holds any integer id per sequence (the prompt); groups may differ in size. This equals
    ``n / (n - 1) * (r_i - mean_g)``. A group of one has no leave-one-out baseline: its advantage is 0 (no signal,
    like GRPO's). OpenRLHF's ``rloo`` estimator computes the same per-sequence value, then (with a KL in the reward)
    feeds it to :func:`kl_shaped_token_rewards` and :func:`token_returns` with ``gamma`` 1, without whitening.
    """
    total, count = _group_stats(reward, group)
    r = reward.float()
    baseline = (total - r) / (count - 1).clamp(min=1)
    return torch.where(count > 1, r - baseline, torch.zeros_like(r))


def kl_shaped_token_rewards(
    reward: torch.Tensor,
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
    estimator: KLEstimator = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards of PPO-style RLHF: ``-coef * kl_t`` on every response token, plus the sequence ``reward``
    (``[B]``) at the row's LAST response token (its EOS, or the last generated token of a truncated response).

    ``kl_t`` is ``llm_core.kl_estimate`` (k1 by default: ``log pi - log pi_ref``, as in OpenRLHF and verl); it is 0
    off the mask and where ``logprob`` is ``-inf``. Returns ``(token_reward, kl)``, both ``[B, L]`` and 0 off the
    mask; a row with an empty mask gets no reward. The KL term carries the gradient of ``logprob`` if it has one;
    detach the inputs for an advantage.
    """
    m = mask.bool()
    kl = kl_estimate(logprob, ref_logprob, estimator, m)
    token_reward = -coef * kl
    width = m.shape[-1]
    last = width - 1 - m.long().flip(-1).argmax(-1)
    at_last = torch.zeros_like(m).scatter_(-1, last.unsqueeze(-1), True) & m
    token_reward = token_reward + torch.where(at_last, reward.to(token_reward.dtype).unsqueeze(-1), 0.0)
    return masked(token_reward, m), kl


def token_returns(token_reward: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """``[B, L]`` discounted return-to-go ``G_t = r_t + gamma G_{t+1}`` over each row's response tokens (0 off the
    mask). Nothing flows in from past the last response token, nor from the prompt or padding; tokens off the mask
    between response tokens (a multi-turn episode's tool results) are skipped, not steps."""
    m = mask.bool()
    r = masked(token_reward, m)
    out = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in range(r.shape[-1] - 1, -1, -1):
        # off the mask the return passes through unchanged: a multi-turn episode's tool tokens are not steps
        # (it starts at 0 right of the last response token, so nothing flows in from padding)
        running = torch.where(m[:, t], r[:, t] + gamma * running, running)
        out[:, t] = running
    return masked(out, m)


def token_gae(
    token_reward: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over response tokens; returns ``(advantage, return)``, ``[B, L]``, with
    ``return = advantage + value`` on the mask and both 0 off it.

    ``values[b, t]`` is the critic's estimate before token ``t`` is generated (aligned like ``logprob``). Each
    response ends at its last mask column and is terminal there, EOS or truncation alike: the reward model scored
    that text, so there is nothing to bootstrap from (``V`` after it counts 0). With ``delta_t = r_t +
    gamma V_{t+1} - V_t``, ``A_t = delta_t + gamma lam A_{t+1}``, where ``V_{t+1}`` and ``A_{t+1}`` are 0 past the
    last response token. Same recursion as ``pickaxe.data.returns.gae``, per row over the mask; columns off the
    mask between response tokens (a multi-turn episode's tool results) are skipped, not steps.
    """
    m = mask.bool()
    r, v = masked(token_reward, m), masked(values, m)
    advantage = torch.zeros_like(v)
    next_value = torch.zeros_like(v[:, 0])
    next_adv = torch.zeros_like(v[:, 0])
    for t in range(v.shape[-1] - 1, -1, -1):
        delta = r[:, t] + gamma * next_value - v[:, t]
        adv = delta + gamma * lam * next_adv
        on = m[:, t]
        # off the mask the carried value/advantage pass through: the tool results between a multi-turn episode's
        # model turns are not steps, so V after a turn's last token is V at the next turn's first. Right of the
        # last response token they are still 0, so nothing crosses a response's end.
        next_adv = torch.where(on, adv, next_adv)
        next_value = torch.where(on, v[:, t], next_value)
        advantage[:, t] = next_adv
    return masked(advantage, m), masked(advantage + v, m)


def token_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = None,
) -> torch.Tensor:
    """Per-token critic loss ``0.5 (V - G)^2``, with ``clip`` the max with the loss of ``V`` clipped to
    ``old_values +- clip`` (PPO value clipping, ``pickaxe.algos.core.value_loss``); 0 off the mask. Reduce it with
    ``llm_core.aggregate``."""
    m = mask.bool()
    loss = value_loss(masked(values, m), masked(old_values, m), masked(returns, m), clip)
    return masked(loss, m)


def whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise ``values`` over the mask to unit variance: ``(x - mean) / sqrt(var + eps)`` with the mean and the
    population (biased) variance of the masked entries of the whole tensor; ``shift_mean=False`` adds the mean back
    (scale only). 0 off the mask. Whiten a whole rollout batch at once: per micro-batch gives different numbers."""
    m = mask.bool()
    x = masked(values, m)
    count = m.sum().clamp(min=1)
    mean = x.sum() / count
    var = masked((x - mean).pow(2), m).sum() / count
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return masked(out, m)


def reinforce_pp_advantages(
    reward: torch.Tensor,
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    group: torch.Tensor | None = None,
    gamma: float = 1.0,
    estimator: KLEstimator = "k1",
    scale: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025) advantages, ``[B, L]``, following OpenRLHF's ``reinforce`` and ``reinforce_baseline``
    advantage estimators; returns ``(advantage, return)``.

    1. ``group`` given (REINFORCE++-baseline): subtract each prompt group's mean sequence reward (no std division);
       None (plain REINFORCE++): the reward as is;
    2. per-token rewards of :func:`kl_shaped_token_rewards` (``-kl_coef * k1`` per token, the reward at the last
       response token);
    3. returns-to-go :func:`token_returns` with ``gamma`` (OpenRLHF forces ``gamma`` 1 for the baseline variant);
    4. global whitening of the returns over every response token of the batch (:func:`whiten`, population
       variance); ``scale=False`` only centres (OpenRLHF's ``no_advantage_std_norm``).

    verl's ``reinforce_plus_plus`` matches the plain variant (its token-level rewards already hold the KL) except
    that it whitens with the unbiased variance; its ``_baseline`` variant broadcasts the centred summed reward to
    every token instead of step 2-3. Compute it on the whole rollout batch (whitening is global) with ``logprob``
    detached (the sampler's or the old policy's log-probs).
    """
    r = reward.float()
    if group is not None:
        total, count = _group_stats(r, group)
        r = r - total / count
    token_reward, _ = kl_shaped_token_rewards(r, logprob, ref_logprob, mask, kl_coef, estimator)
    returns = token_returns(token_reward, mask, gamma)
    if scale:
        advantage = whiten(returns, mask)
    else:
        m = mask.bool()
        advantage = masked(returns - returns.sum() / m.sum().clamp(min=1), m)
    return advantage, returns
