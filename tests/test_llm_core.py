"""LLM loss pieces against hand-computed values: group advantages, aggregation modes, KL estimators, GSPO's
sequence ratio, TIS, pass@k and the Wilson interval."""

import math

import pytest
import torch
from tensordict import TensorDict

from pickaxe.algos.configs import GRPOConfig
from pickaxe.algos.grpo import grpo_loss
from pickaxe.algos.llm_core import (
    aggregate,
    group_advantages,
    kl_estimate,
    sequence_log_ratio,
    truncated_is_weight,
    zero_variance_groups,
)
from pickaxe.eval.stats import pass_at_k, wilson_interval


def test_group_advantages_by_hand() -> None:
    reward = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 3.0])
    group = torch.tensor([7, 7, 7, 7, 3, 3, 3, 3, 9])  # any ids, any order; a group of one
    adv = group_advantages(reward, group)
    std = math.sqrt(4 * 0.25 / 3)  # unbiased std of (1, 0, 0, 1)
    expected = [0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std, 0, 0, 0, 0, 0]
    assert torch.allclose(adv, torch.tensor(expected), atol=1e-5)
    dr = group_advantages(reward, group, scale=False)  # Dr. GRPO: centred only
    assert torch.allclose(dr, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, 0]))
    assert zero_variance_groups(reward, group).tolist() == [False] * 4 + [True] * 5


LOSS = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),
        ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + 4 / 1) / 2),
        ("seq-mean-token-sum-norm", ((1 + 2 + 3) / 5 + 4 / 5) / 2),
    ],
)
def test_aggregation_modes_by_hand(mode: str, expected: float) -> None:
    assert aggregate(LOSS, MASK, mode, norm=5.0).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregation_splits_exactly_with_global_counts(mode: str) -> None:
    loss, mask = torch.rand(6, 5), torch.rand(6, 5) > 0.4
    mask[:, 0] = True
    full = aggregate(loss, mask, mode, norm=5.0)
    tokens, seqs = mask.sum(), 6.0
    parts = sum(aggregate(loss[s : s + 2], mask[s : s + 2], mode, tokens, seqs, 5.0) for s in (0, 2, 4))
    assert parts.item() == pytest.approx(full.item(), rel=1e-6)


def test_masked_values_cannot_leak() -> None:
    loss = LOSS.clone()
    loss[0, 3] = float("nan")
    assert aggregate(loss, MASK).item() == pytest.approx(2.5)


def test_kl_estimators_by_hand() -> None:
    logprob, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    log_r = math.log(0.5)  # ref - logprob
    assert kl_estimate(logprob, ref, "k1").item() == pytest.approx(-log_r)
    assert kl_estimate(logprob, ref, "k2").item() == pytest.approx(0.5 * log_r**2)
    assert kl_estimate(logprob, ref, "k3").item() == pytest.approx(0.5 - 1 - log_r)
    same = kl_estimate(logprob, logprob, "k3")
    assert same.item() == 0.0
    with pytest.raises(ValueError, match="k1, k2 or k3"):
        kl_estimate(logprob, ref, "k4")  # type: ignore[arg-type]


def test_gspo_sequence_ratio_value_and_gradient() -> None:
    logprob = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0, -2.0], [-1.0, -2.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    log_ratio = sequence_log_ratio(logprob, old, mask)
    # sequence 0: mean(0.5, 0) = 0.25; sequence 1: mean(0, 1) = 0.5, on every token
    assert torch.allclose(log_ratio.detach(), torch.tensor([[0.25] * 3, [0.5] * 3]))
    log_ratio[0, 0].backward()
    assert logprob.grad[0].tolist() == [1.0, 0.0, 0.0]  # each token gets its own log-prob's gradient


def test_truncated_is_weight() -> None:
    learner, sampler = torch.tensor([0.0, -1.0, -3.0]), torch.tensor([-1.0, -1.0, -1.0])
    w = truncated_is_weight(learner, sampler, cap=2.0)
    assert torch.allclose(w, torch.tensor([2.0, 1.0, math.exp(-2.0)]))


def test_grpo_loss_on_policy_by_hand() -> None:
    """With ratio 1 the surrogate is -A per token; token-mean over 3 + 1 tokens; a clipped token is counted."""
    logprob = torch.tensor([[0.0, -1.0, -1.0, -1.0], [0.0, -2.0, -2.0, -2.0]])
    mb = TensorDict(
        {
            "loss_mask": torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0]], dtype=torch.bool),
            "advantage": torch.tensor([1.0, -2.0]),
            "old_logprob": logprob.clone(),
        },
        batch_size=[2],
    )
    loss, stats = grpo_loss(logprob, mb, GRPOConfig(), 4.0, 2.0, 1.0)
    assert loss.item() == pytest.approx((-1 - 1 - 1 + 2) / 4)
    assert stats["clipped"].item() == 0
    mb["old_logprob"] = logprob - 0.5  # ratio e^0.5 > 1.2: clipped where A > 0
    loss, stats = grpo_loss(logprob, mb, GRPOConfig(), 4.0, 2.0, 1.0)
    assert stats["clipped"].item() == 3
    assert loss.item() == pytest.approx((-1.2 * 3 + 2 * math.exp(0.5)) / 4)
    cfg = GRPOConfig(kl_coef=0.1, kl_estimator="k1")
    mb["old_logprob"], mb["ref_logprob"] = logprob.clone(), logprob - 1.0  # k1 = 1 on every token
    loss, _ = grpo_loss(logprob, mb, cfg, 4.0, 2.0, 1.0)
    assert loss.item() == pytest.approx((-1 - 1 - 1 + 2) / 4 + 0.1)


def test_pass_at_k_and_wilson() -> None:
    assert pass_at_k(5, 1, 1) == pytest.approx(0.2)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 4, 2) == 1.0
    assert pass_at_k(5, 0, 3) == 0.0
    low, high = wilson_interval(50, 100)
    assert (low, high) == (pytest.approx(0.4038, abs=1e-4), pytest.approx(0.5962, abs=1e-4))
    assert wilson_interval(0, 20)[0] == 0.0
