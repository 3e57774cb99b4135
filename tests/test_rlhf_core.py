"""RLHF loss and advantage pieces against hand-computed values: Bradley–Terry, DPO/cDPO/IPO, RLOO, REINFORCE++,
k1 KL-shaped token rewards, token-level GAE over ragged responses (EOS and truncation), value clipping, whitening."""

import math
import statistics

import pytest
import torch

from pickaxe.algos.llm_core import sequence_sum
from pickaxe.algos.rlhf_core import (
    bradley_terry_loss,
    dpo_loss,
    kl_shaped_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
    token_gae,
    token_returns,
    token_value_loss,
    whiten,
)
from pickaxe.data.returns import gae

INF = float("inf")


def close(actual: torch.Tensor, expected: list) -> None:
    """``actual`` equals the nested list ``expected`` to float32 rounding."""
    torch.testing.assert_close(actual.detach(), torch.tensor(expected), rtol=1e-5, atol=1e-6)


def softplus(x: float) -> float:
    """-log sigmoid(-x)."""
    return math.log1p(math.exp(x))


# Three right-padded responses after a 1-token prompt (column 0): EOS after 3 tokens, EOS after 1 token, and one
# truncated at the budget (its response runs to the last column: no padding after it).
MASK = torch.tensor([[0, 1, 1, 1, 0], [0, 1, 0, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)


def test_bradley_terry_by_hand() -> None:
    chosen = torch.tensor([2.0, 0.0, 1.0], requires_grad=True)
    rejected = torch.tensor([1.0, 1.0, 1.0])
    out = bradley_terry_loss(chosen, rejected)
    assert out.loss.item() == pytest.approx((softplus(-1) + softplus(1) + math.log(2)) / 3)
    assert out.accuracy.item() == pytest.approx(1 / 3)  # a tie is not a win
    assert out.margin.tolist() == [1.0, -1.0, 0.0]
    out.loss.backward()
    expected_grad = [-1 / (1 + math.exp(d)) / 3 for d in (1.0, -1.0, 0.0)]  # -sigmoid(-d) / B
    assert chosen.grad.tolist() == pytest.approx(expected_grad)
    with_margin = bradley_terry_loss(chosen, rejected, margin=torch.tensor([0.5, 0.0, 1.0]))
    assert with_margin.loss.item() == pytest.approx((softplus(-0.5) + softplus(1) + softplus(1)) / 3)
    assert with_margin.accuracy.item() == pytest.approx(1 / 3)  # the margin changes the loss, not the accuracy
    assert bradley_terry_loss(chosen, rejected, margin=0.5).loss.item() == pytest.approx(
        (softplus(-0.5) + softplus(1.5) + softplus(0.5)) / 3
    )


def test_dpo_sigmoid_cdpo_and_ipo_by_hand() -> None:
    # pair 0: the policy raised chosen by 1 and lowered rejected by 1 vs the reference (h = 2); pair 1: h = -1
    pc = torch.tensor([-1.0, -4.0], requires_grad=True)
    pr, rc, rr = torch.tensor([-3.0, -2.0]), torch.tensor([-2.0, -4.0]), torch.tensor([-2.0, -3.0])
    beta = 0.1
    out = dpo_loss(pc, pr, rc, rr, beta)
    assert out.loss.item() == pytest.approx((softplus(-0.2) + softplus(0.1)) / 2)
    assert out.chosen.tolist() == pytest.approx([0.1, 0.0])
    assert out.rejected.tolist() == pytest.approx([-0.1, 0.1])
    assert out.accuracy.item() == 0.5
    out.loss.backward()
    assert pc.grad.tolist() == pytest.approx([-beta / (1 + math.exp(0.2)) / 2, -beta / (1 + math.exp(-0.1)) / 2])
    smooth = dpo_loss(pc, pr, rc, rr, beta, label_smoothing=0.1)
    expected = (0.9 * softplus(-0.2) + 0.1 * softplus(0.2) + 0.9 * softplus(0.1) + 0.1 * softplus(-0.1)) / 2
    assert smooth.loss.item() == pytest.approx(expected)
    ipo = dpo_loss(pc, pr, rc, rr, beta, loss="ipo")
    assert ipo.loss.item() == pytest.approx(((2 - 5) ** 2 + (-1 - 5) ** 2) / 2)  # target 1 / (2 beta) = 5
    same = dpo_loss(pc, pc.detach() - 1, pc.detach(), pc.detach() - 1, beta)  # policy == reference
    assert same.loss.item() == pytest.approx(math.log(2))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss": "hinge"}, "unknown DPO loss 'hinge'"),
        ({"beta": 0.0}, "beta must be > 0"),
        ({"label_smoothing": 0.5}, r"label_smoothing must be in \[0, 0.5\)"),
        ({"loss": "ipo", "label_smoothing": 0.1}, "sigmoid loss only"),
    ],
)
def test_dpo_rejects_bad_options(kwargs: dict, message: str) -> None:
    x = torch.zeros(2)
    with pytest.raises(ValueError, match=message):
        dpo_loss(x, x, x, x, **{"beta": 0.1, **kwargs})


@pytest.mark.parametrize("which", ["bt", "bt-margin", "sigmoid", "cdpo", "ipo"])
def test_pair_losses_split_into_micro_batches_sum_to_the_full_loss(which: str) -> None:
    gen = torch.Generator().manual_seed(0)
    a, b, c, d, margin = (torch.randn(7, generator=gen) for _ in range(5))

    def run(s: slice, total: float | None) -> tuple[torch.Tensor, torch.Tensor]:
        if which.startswith("bt"):
            out = bradley_terry_loss(a[s], b[s], margin[s] if which == "bt-margin" else None, total_pairs=total)
        else:
            kind, smooth = ("ipo", 0.0) if which == "ipo" else ("sigmoid", 0.2 if which == "cdpo" else 0.0)
            out = dpo_loss(a[s], b[s], c[s], d[s], 0.3, kind, smooth, total_pairs=total)
        return out.loss, out.accuracy

    full_loss, full_acc = run(slice(None), None)
    parts = [run(slice(i, i + 3), 7.0) for i in (0, 3, 6)]  # micro-batches of 3, 3 and 1
    assert sum(p[0] for p in parts).item() == pytest.approx(full_loss.item(), rel=1e-6)
    assert sum(p[1] for p in parts).item() == pytest.approx(full_acc.item(), rel=1e-6)


def test_dpo_on_summed_logprobs_with_inf_off_the_mask_is_finite() -> None:
    logits = torch.tensor([[-1.0, -0.5, -0.25, 0.0], [-2.0, -1.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0]], dtype=torch.bool)
    logprob = torch.where(mask, logits, torch.full_like(logits, -INF))  # prompt/padding outside top-k
    seq = sequence_sum(logprob, mask)
    assert seq.tolist() == [-0.75, -1.0]
    out = dpo_loss(seq[:1], seq[1:], torch.tensor([-1.0]), torch.tensor([-1.0]), 0.5)
    out.loss.backward()
    assert math.isfinite(out.loss.item()) and torch.isfinite(logits.grad).all()
    assert logits.grad[~mask].abs().sum().item() == 0.0


def test_rloo_leaves_each_sample_out_of_its_baseline() -> None:
    reward = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0, 2.0, 4.0, 0.0])
    group = torch.tensor([7, 7, 7, 7, 3, 9, 9, 9])  # any ids; a group of one; groups of 4 and 3
    adv = rloo_advantages(reward, group)
    expected = [1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3, 0.0, 2 - 2, 4 - 1, 0 - 3]
    assert adv.tolist() == pytest.approx(expected)
    r = torch.randn(6)
    same = torch.zeros(6, dtype=torch.long)
    assert torch.allclose(rloo_advantages(r, same), 6 / 5 * (r - r.mean()), atol=1e-6)


def test_kl_shaped_token_rewards_put_the_reward_at_the_last_response_token() -> None:
    reward = torch.tensor([1.0, 2.0, 3.0, 4.0])
    mask = torch.cat([MASK, torch.zeros(1, 5, dtype=torch.bool)])  # plus a row with no response at all
    logprob = torch.tensor([[-INF, -1.0, -2.0, -1.0, -INF]] * 4)
    ref = torch.tensor([[-1.0, -1.5, -1.0, -1.0, -3.0]] * 4)
    logprob[2, 4] = -0.5  # the truncated row's last token
    token_reward, kl = kl_shaped_token_rewards(reward, logprob, ref, mask, coef=0.1)
    k1 = [0.0, 0.5, -1.0, 0.0, 0.0]  # log pi - log pi_ref on the mask
    assert kl[0].tolist() == pytest.approx(k1)
    close(
        token_reward,
        [
            [0.0, -0.05, 0.1, 1.0, 0.0],  # EOS at column 3
            [0.0, 1.95, 0.0, 0.0, 0.0],  # EOS right after the prompt
            [0.0, -0.05, 0.1, 0.0, 3.0 - 0.25],  # truncated: the reward on the last column, its KL too
            [0.0] * 5,  # empty response: no reward anywhere
        ],
    )
    k3, _ = kl_shaped_token_rewards(reward, logprob, ref, mask, coef=1.0, estimator="k3")
    assert k3[1, 1].item() == pytest.approx(2.0 - (math.exp(-0.5) - 1 + 0.5))


def test_token_returns_stop_at_each_response_end() -> None:
    token_reward = torch.tensor([[9.0, 1.0, 2.0, 4.0, 9.0], [9.0, 3.0, 9.0, 9.0, 9.0], [9.0, 1.0, 1.0, 1.0, 1.0]])
    out = token_returns(token_reward, MASK, gamma=0.5)
    assert out.tolist() == [
        [0.0, 1 + 0.5 * (2 + 0.5 * 4), 2 + 0.5 * 4, 4.0, 0.0],
        [0.0, 3.0, 0.0, 0.0, 0.0],
        [0.0, 1 + 0.5 + 0.25 + 0.125, 1.75, 1.5, 1.0],
    ]


def test_token_gae_by_hand_on_ragged_responses() -> None:
    token_reward = torch.tensor([[0.0, -0.05, -0.05, 0.95, 0.0], [0.0, 1.95, 0.0, 0.0, 0.0], [0.0, 0, 0, 0, 2.0]])
    values = torch.tensor([[INF, 1.0, 1.0, 1.0, -INF], [5.0, 1.0, 7.0, 7.0, 7.0], [-INF, 1.0, 1.0, 1.0, 0.5]])
    adv, ret = token_gae(token_reward, values, MASK, gamma=1.0, lam=0.5)
    # row 0: delta_3 = 0.95 - 1 (terminal: no V after the EOS); delta_t = -0.05 + 1 - 1 before it
    # row 1: a one-token response: A = r - V, whatever the padding's values hold
    # row 2: truncated at the budget, still terminal: delta_4 = 2 - 0.5, delta_3 = 0 + 0.5 - 1, delta_2 = delta_1 = 0
    a2_4 = 1.5
    a2_3 = -0.5 + 0.5 * a2_4
    a2_2 = 0.0 + 0.5 * a2_3
    expected_adv = [
        [0.0, -0.05 + 0.5 * (-0.05 + 0.5 * -0.05), -0.05 + 0.5 * -0.05, -0.05, 0.0],
        [0.0, 0.95, 0.0, 0.0, 0.0],
        [0.0, 0.5 * a2_2, a2_2, a2_3, a2_4],
    ]
    close(adv, expected_adv)
    values_on = torch.where(MASK, values, torch.zeros_like(values))
    close(ret, (torch.tensor(expected_adv) + values_on).tolist())
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (0.9, 0.8), (0.99, 1.0), (1.0, 0.0)])
def test_token_gae_matches_classic_gae_on_each_response(gamma: float, lam: float) -> None:
    gen = torch.Generator().manual_seed(1)
    token_reward, values = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)
    adv, ret = token_gae(token_reward, values, MASK, gamma, lam)
    for row in range(3):
        cols = MASK[row].nonzero().squeeze(-1)
        r, v = token_reward[row, cols].unsqueeze(-1), values[row, cols].unsqueeze(-1)
        next_v = torch.cat([v[1:], torch.zeros(1, 1)])
        done = torch.zeros_like(v, dtype=torch.bool)
        done[-1] = True  # the response's last token ends the episode (EOS or truncation: nothing to bootstrap)
        ref_adv, ref_ret = gae(r, v, next_v, done, torch.zeros_like(done), gamma, lam)
        assert torch.allclose(adv[row, cols], ref_adv.squeeze(-1), atol=1e-6)
        assert torch.allclose(ret[row, cols], ref_ret.squeeze(-1), atol=1e-6)
    if lam == 1.0 and gamma == 0.99:  # lam 1: Monte Carlo return minus the value
        assert torch.allclose(ret, token_returns(token_reward, MASK, gamma), atol=1e-5)


def test_value_clipping_by_hand() -> None:
    values = torch.tensor([[INF, 2.0, 0.2, 1.8]], requires_grad=True)
    old = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    returns = torch.tensor([[0.0, 0.0, 1.0, 2.0]])
    mask = torch.tensor([[0, 1, 1, 1]], dtype=torch.bool)
    close(token_value_loss(values, old, returns, mask), [[0.0, 2.0, 0.32, 0.02]])
    # clip 0.5: V kept where moving it back to old +- 0.5 gives a smaller loss; the clipped loss where larger
    loss = token_value_loss(values, old, returns, mask, clip=0.5)
    close(loss, [[0.0, 2.0, 0.32, 0.125]])
    loss.sum().backward()
    close(values.grad, [[0.0, 2.0, -0.8, 0.0]])  # the clipped term has no V gradient


def test_whiten_over_the_mask_only() -> None:
    values = torch.tensor([[INF, 1.0, 2.0], [-INF, 3.0, float("nan")]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]], dtype=torch.bool)
    std = math.sqrt(2 / 3 + 1e-8)  # population std of (1, 2, 3)
    close(whiten(values, mask), [[0.0, -1 / std, 0.0], [0.0, 1 / std, 0.0]])
    close(whiten(values, mask, shift_mean=False), [[0.0, 2 - 1 / std, 2.0], [0.0, 2 + 1 / std, 0.0]])
    assert whiten(values, torch.zeros_like(mask)).abs().sum().item() == 0.0


def test_reinforce_pp_with_and_without_baseline_by_hand() -> None:
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]], dtype=torch.bool)
    logprob = torch.tensor([[-INF, -1.0, -1.0], [-INF, -1.0, -INF]])
    ref = logprob.nan_to_num(neginf=0.0) - 0.5  # k1 = 0.5 on every response token
    reward, group = torch.tensor([1.0, 3.0]), torch.tensor([4, 4])

    def whitened(xs: list[float]) -> list[float]:
        mean, std = statistics.fmean(xs), math.sqrt(statistics.pvariance(xs) + 1e-8)
        return [(x - mean) / std for x in xs]

    # baseline: rewards centred per group (-1, +1), -0.1 KL per token, returns-to-go, batch whitening
    adv, ret = reinforce_pp_advantages(reward, logprob, ref, mask, 0.2, group=group)
    close(ret, [[0.0, -1.2, -1.1], [0.0, 0.9, 0.0]])
    w = whitened([-1.2, -1.1, 0.9])
    close(adv, [[0.0, w[0], w[1]], [0.0, w[2], 0.0]])
    # plain REINFORCE++: the raw reward
    adv, ret = reinforce_pp_advantages(reward, logprob, ref, mask, 0.2)
    close(ret, [[0.0, 0.8, 0.9], [0.0, 2.9, 0.0]])
    w = whitened([0.8, 0.9, 2.9])
    close(adv, [[0.0, w[0], w[1]], [0.0, w[2], 0.0]])
    centred, _ = reinforce_pp_advantages(reward, logprob, ref, mask, 0.2, scale=False)
    close(centred, [[0.0, 0.8 - 4.6 / 3, 0.9 - 4.6 / 3], [0.0, 2.9 - 4.6 / 3, 0.0]])
    # gamma < 1 discounts the end reward back through the response
    _, ret = reinforce_pp_advantages(reward, logprob, ref, mask, 0.0, gamma=0.5)
    close(ret, [[0.0, 0.5, 1.0], [0.0, 3.0, 0.0]])


def test_inf_off_the_mask_gives_finite_outputs_and_gradients() -> None:
    logits = torch.randn(3, 5, requires_grad=True)
    logprob = torch.where(MASK, logits, torch.full_like(logits, -INF))
    values = torch.where(MASK, logits * 2, torch.full_like(logits, INF))
    ref = torch.where(MASK, torch.zeros(3, 5), torch.full((3, 5), -INF))
    token_reward, kl = kl_shaped_token_rewards(torch.ones(3), logprob, ref, MASK, 0.1)
    adv, ret = token_gae(token_reward, values, MASK)
    loss = token_value_loss(values, values.detach(), ret.detach(), MASK, clip=0.2).sum()
    loss = loss + (whiten(adv, MASK) * logprob.nan_to_num(neginf=0.0)).sum() + kl.sum()
    loss.backward()
    assert math.isfinite(loss.item())
    assert torch.isfinite(logits.grad).all()
    assert logits.grad[~MASK].abs().sum().item() == 0.0
