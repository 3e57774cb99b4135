"""Critic-free advantage estimators in the GRPO loss: RLOO's leave-one-out baseline and REINFORCE++'s whitened
per-token returns, by hand and through a whole update (micro-batching must not change it)."""

import copy
import math
import statistics
import sys
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from pickaxe.algos.grpo import GRPO, GRPOConfig, grpo_advantages, grpo_loss
from pickaxe.algos.rlhf_core import reinforce_pp_advantages

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_training import SAMPLING, _grpo_batch, _model, _params, _step_grads


def test_rloo_advantage_is_the_reward_minus_the_mean_of_the_others() -> None:
    reward = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0, 3.0])
    group = torch.tensor([4, 4, 4, 4, 9, 9])
    adv, _ = grpo_advantages(reward, group, GRPOConfig(advantage="rloo"))
    expected = [1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3, 5 - 3, 3 - 5]
    assert adv.tolist() == pytest.approx(expected)


def test_rloo_subtracts_the_kl_penalty_from_the_reward_first() -> None:
    mask = torch.tensor([[0, 1, 1], [0, 1, 1]], dtype=torch.bool)
    logprob = torch.tensor([[0.0, -0.5, -0.5], [0.0, -1.0, -1.0]])
    ref = torch.full((2, 3), -1.0)  # k1 = logprob - ref: 0.5 per token in row 0, 0 in row 1
    cfg = GRPOConfig(advantage="rloo", kl_coef=1.0, kl_in="reward", kl_estimator="k1")
    adv, metrics = grpo_advantages(torch.tensor([1.0, 1.0]), torch.tensor([0, 0]), cfg, logprob, ref, mask)
    assert adv.tolist() == pytest.approx([(1 - 1.0) - 1.0, 1.0 - (1 - 1.0)])  # shaped rewards 0 and 1
    assert float(metrics["kl/seq_sum_mean"]) == pytest.approx(0.5)


@pytest.mark.parametrize("advantage", ["reinforce++", "reinforce++-baseline"])
def test_reinforce_pp_advantages_are_per_token_and_drive_the_loss(advantage: str) -> None:
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 0]], dtype=torch.bool)
    logprob = torch.where(mask, torch.tensor(-0.7), torch.tensor(-math.inf))  # -inf off the mask must not leak
    ref = torch.where(mask, torch.tensor(-0.9), torch.tensor(0.0))
    reward, group = torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0, 0, 1])
    cfg = GRPOConfig(advantage=advantage, kl_coef=0.1, kl_in="reward", kl_estimator="k1")
    adv, metrics = grpo_advantages(reward, group, cfg, logprob, ref, mask)
    baseline = group if advantage.endswith("baseline") else None
    want, _ = reinforce_pp_advantages(reward, logprob, ref, mask, 0.1, baseline, estimator="k1")
    assert adv.shape == (3, 4) and torch.equal(adv, want)
    assert float(metrics["kl/token_mean"]) == pytest.approx(0.2)
    # on policy (ratio 1), token-mean: the loss is minus the mean advantage over the generated tokens
    mb = TensorDict({"loss_mask": mask, "advantage": adv, "old_logprob": logprob.clone()}, batch_size=[3])
    lp = logprob.clone().requires_grad_(True)
    loss, _ = grpo_loss(lp, mb, cfg, float(mask.sum()), 3.0, 1.0)
    assert loss.item() == pytest.approx(-float(adv[mask].mean()), abs=1e-6)
    loss.backward()
    assert torch.isfinite(lp.grad).all() and (lp.grad[~mask] == 0).all()


def test_kl_in_the_reward_defaults_to_k1_and_in_the_loss_to_k3() -> None:
    """With no ``kl_estimator`` given, REINFORCE++ shapes each token's reward with k1 (``log pi - log pi_ref``), as
    docs/llm.md and the config promise; a k3 default gives other advantages (k3 >= 0, and its size differs)."""
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]], dtype=torch.bool)
    lp = [[-0.2, -0.3, -2.0, -0.1], [-0.5, -1.5, -0.4, 0.0]]
    rf = [[-0.2, -1.8, -0.5, -0.9], [-0.5, -0.2, -2.2, 0.0]]
    reward, coef = [1.0, -0.5], 0.5
    # by hand: k1 per response token, -coef * k1 as its reward, the sequence reward on its last token,
    # returns-to-go within the row, then whitening over the 5 response tokens (population variance)
    returns = []
    for row in range(2):
        tokens = [t for t in range(4) if mask[row, t]]
        r = [-coef * (lp[row][t] - rf[row][t]) for t in tokens]
        r[-1] += reward[row]
        returns += [sum(r[i:]) for i in range(len(r))]
    mean = statistics.fmean(returns)
    std = math.sqrt(statistics.pvariance(returns) + 1e-8)
    expected = [(g - mean) / std for g in returns]
    cfg = GRPOConfig(advantage="reinforce++", kl_coef=coef, kl_in="reward")
    logprob, ref = torch.tensor(lp), torch.tensor(rf)
    adv, metrics = grpo_advantages(torch.tensor(reward), torch.tensor([0, 0]), cfg, logprob, ref, mask)
    assert adv[mask].tolist() == pytest.approx(expected, abs=1e-5)
    k1_sums = [sum(lp[b][t] - rf[b][t] for t in range(4) if mask[b, t]) for b in range(2)]
    assert float(metrics["kl/seq_sum_mean"]) == pytest.approx(statistics.fmean(k1_sums))
    # the same default for RLOO's sequence-level penalty; an explicit estimator is kept; in the loss, k3
    rloo_cfg = GRPOConfig(advantage="rloo", kl_coef=coef, kl_in="reward")
    rloo, _ = grpo_advantages(torch.tensor(reward), torch.tensor([0, 0]), rloo_cfg, logprob, ref, mask)
    shaped = [reward[b] - coef * k1_sums[b] for b in range(2)]
    assert rloo.tolist() == pytest.approx([shaped[0] - shaped[1], shaped[1] - shaped[0]], abs=1e-6)
    assert (cfg.kl_estimator, cfg.kl_estimator_in_effect) == (None, "k1")
    assert GRPOConfig(kl_in="reward", kl_estimator="k3").kl_estimator_in_effect == "k3"
    assert GRPOConfig(kl_in="loss").kl_estimator_in_effect == "k3"


@pytest.mark.parametrize("advantage", ["rloo", "reinforce++", "reinforce++-baseline"])
def test_estimators_update_the_same_with_any_micro_batching(advantage: str) -> None:
    base = _model()
    batch = _grpo_batch(base, reference=_model(seed=5))
    out = []
    for micro in (24, 5):
        model = copy.deepcopy(base)
        cfg = GRPOConfig(
            lr=1e-3, micro_batch_size=micro, kl_coef=0.05, kl_in="reward", advantage=advantage, max_grad_norm=1e9
        )
        algo = GRPO(model, cfg, SAMPLING)
        grads = _step_grads(algo)
        metrics = algo.update(batch.clone())
        assert math.isfinite(metrics["loss/policy"]) and metrics["grpo/advantage_abs_mean"] > 0
        assert not torch.equal(_params(model), _params(base))
        out.append(grads[0])
    assert out[0].abs().max() > 1e-3
    assert torch.allclose(out[0], out[1], atol=1e-6), (out[0] - out[1]).abs().max()


def test_more_mini_batches_than_sequences_still_updates_and_reports() -> None:
    """Dynamic sampling can leave fewer sequences than ``mini_batches``: every sequence still gets its step and
    the metrics are read with the last one (they were read only at a step that never came)."""
    base = _model()
    batch = _grpo_batch(base)[:3]
    algo = GRPO(copy.deepcopy(base), GRPOConfig(lr=1e-3, mini_batches=4), SAMPLING)
    grads = _step_grads(algo)
    metrics = algo.update(batch)
    assert len(grads) == 3 and metrics["grpo/sequences"] == 3.0
    assert math.isfinite(metrics["loss/policy"]) and "check/logprob_diff_max" in metrics


@pytest.mark.parametrize("variant", ["dr-grpo", "grpo"])
def test_dr_grpo_advantages_are_centred_and_never_divided_by_the_group_std(variant: str) -> None:
    """Dr. GRPO (``scale_rewards=False``): ``r - mean_g`` exactly; GRPO divides that by the group's unbiased std
    (+1e-6). Group 4 has std sqrt(1/3) and group 9 std sqrt(2): a division would show."""
    reward = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0, 3.0])
    group = torch.tensor([4, 4, 4, 4, 9, 9])
    centred = torch.tensor([0.5, -0.5, -0.5, 0.5, 1.0, -1.0])
    std = torch.tensor([math.sqrt(1 / 3)] * 4 + [math.sqrt(2.0)] * 2)
    want = centred if variant == "dr-grpo" else centred / (std + 1e-6)
    cfg = GRPOConfig.variant(variant)  # type: ignore[arg-type]
    adv, _ = grpo_advantages(reward, group, cfg)
    torch.testing.assert_close(adv, want)
    algo = GRPO(_model(), cfg, SAMPLING)  # the algorithm writes the same advantages into the batch it trains on
    batch = algo.with_advantages(TensorDict({"reward": reward, "group": group}, batch_size=[6]))
    torch.testing.assert_close(batch["advantage"], want)


def test_clip_high_bounds_the_ratio_above_and_clip_low_below() -> None:
    """DAPO's clip-higher: clip_low 0.2, clip_high 0.28. A ratio of 1.25 with A = +1 is inside [0.8, 1.28] (loss
    -1.25, not clipped); 1.35 is clipped to 1.28; with A = -1 a ratio of 0.75 is clipped to 0.8."""
    mask = torch.tensor([[0, 1]], dtype=torch.bool)
    cfg = GRPOConfig(clip_low=0.2, clip_high=0.28)
    for ratio, adv, want, clipped in ((1.25, 1.0, -1.25, 0), (1.35, 1.0, -1.28, 1), (0.75, -1.0, 0.8, 1)):
        logprob = torch.tensor([[0.0, math.log(ratio)]])
        mb = TensorDict({"loss_mask": mask, "advantage": torch.tensor([adv]), "old_logprob": torch.zeros(1, 2)},
                        batch_size=[1])  # fmt: skip
        loss, stats = grpo_loss(logprob, mb, cfg, 1.0, 1.0, 1.0)
        assert loss.item() == pytest.approx(want) and stats["clipped"].item() == clipped


def test_the_truncated_importance_weight_scales_each_tokens_loss() -> None:
    """On policy (ratio 1), A = +1 on two tokens with TIS weights 0.5 and 1: token-mean loss -(0.5 + 1) / 2."""
    mb = TensorDict(
        {
            "loss_mask": torch.tensor([[0, 1, 1]], dtype=torch.bool),
            "advantage": torch.tensor([1.0]),
            "old_logprob": torch.zeros(1, 3),
            "tis_weight": torch.tensor([[9.0, 0.5, 1.0]]),  # off the mask: never read
        },
        batch_size=[1],
    )
    loss, _ = grpo_loss(torch.zeros(1, 3), mb, GRPOConfig(), 2.0, 1.0, 1.0)
    assert loss.item() == pytest.approx(-0.75)
