"""LLM learner numerics: top-k/top-p put -inf log-probs off the loss mask and no loss piece may turn them into NaN
gradients; a NaN loss or gradient is refused before the optimizer step; the KL reward penalty and the TIS weights
really reach the update."""

import copy
import math

import pytest
import torch
from tensordict import TensorDict

from pickaxe.algos.grpo import GRPO, GRPOConfig, grpo_advantages, grpo_loss
from pickaxe.algos.llm_core import (
    aggregate,
    kl_estimate,
    kl_shaped_reward,
    sequence_log_ratio,
    token_log_ratio,
    truncated_is_weight,
)
from pickaxe.algos.sft import SFT, SFTConfig
from pickaxe.envs.text import Arithmetic, PromptEnv
from pickaxe.errors import NonFiniteError
from pickaxe.models.lm import tiny_lm
from pickaxe.models.tokenizer import char_tokenizer
from pickaxe.rollout.engines import HFEngine, SamplingParams
from pickaxe.rollout.text_collector import DemoCollector, TextCollector

TOK = char_tokenizer()
INF = float("inf")
# two sequences of 4 columns: prompt in columns 0-1 (off the mask), generated tokens after
MASK = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 0]], dtype=torch.bool)


def _logprob() -> torch.Tensor:
    """Learner log-probs as top-k makes them: -inf on prompt tokens outside the top k (off the mask)."""
    return torch.tensor([[-INF, -0.5, -1.0, -0.2], [-INF, -INF, -0.3, -INF]], requires_grad=True)


def _finite_loss_and_grad(loss: torch.Tensor, leaf: torch.Tensor) -> None:
    assert torch.isfinite(loss), loss
    loss.backward()
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all(), leaf.grad
    assert (leaf.grad[~MASK] == 0).all()  # nothing learned from prompt tokens


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_stay_finite_with_inf_off_the_mask(estimator: str) -> None:
    logprob = _logprob()
    ref = torch.tensor([[-INF, -0.7, -1.2, -0.1], [-2.0, -INF, -0.1, -0.4]])  # a processed reference: -inf too
    kl = kl_estimate(logprob, ref, estimator, MASK)  # type: ignore[arg-type]
    _finite_loss_and_grad(aggregate(kl, MASK), logprob)
    expected = kl_estimate(torch.tensor([-1.0]), torch.tensor([-1.2]), estimator)  # type: ignore[arg-type]
    assert kl[0, 2].item() == pytest.approx(expected.item())
    # a sampled token the current top-k excludes (learner -inf ON the mask) has weight 0: no inf, no NaN
    on_mask = torch.tensor([[-INF, -0.5, -INF, -0.2]], requires_grad=True)
    kl = kl_estimate(on_mask, ref[:1], estimator, MASK[:1])  # type: ignore[arg-type]
    aggregate(kl, MASK[:1]).backward()
    assert torch.isfinite(kl).all() and kl[0, 2] == 0 and torch.isfinite(on_mask.grad).all()


def test_token_ratio_and_gspo_sequence_ratio_stay_finite_with_inf_off_the_mask() -> None:
    old = torch.tensor([[-INF, -INF, -1.5, -0.2], [-INF, -3.0, -0.3, -INF]])
    logprob = _logprob()
    _finite_loss_and_grad(aggregate(token_log_ratio(logprob, old, MASK).exp(), MASK), logprob)
    logprob = _logprob()
    log_ratio = sequence_log_ratio(logprob, old, MASK)
    assert torch.allclose(log_ratio.detach(), torch.tensor([[0.25] * 4, [0.0] * 4]))  # mean(0.5, 0) and 0
    _finite_loss_and_grad(aggregate(log_ratio.exp(), MASK), logprob)
    assert logprob.grad[0, 2].item() == pytest.approx(math.exp(0.25) / 3)  # token-mean over 3 tokens


def test_tis_weight_is_finite_off_the_mask() -> None:
    learner = torch.tensor([[-INF, -INF, -1.0, -0.2], [-INF, 0.0, -0.3, -INF]])
    sampler = torch.tensor([[0.0, 0.0, -2.0, -0.2], [0.0, 0.0, -0.3, 0.0]])
    w = truncated_is_weight(learner, sampler, 2.0, MASK)
    assert torch.isfinite(w).all()
    assert w[MASK].tolist() == pytest.approx([2.0, 1.0, 1.0])


def _micro_batch(tis: bool) -> TensorDict:
    data = {
        "loss_mask": MASK,
        "advantage": torch.tensor([1.0, -1.0]),
        "old_logprob": torch.tensor([[-INF, -INF, -1.2, -0.1], [-INF, -INF, -0.4, -INF]]),
        "ref_logprob": torch.tensor([[-3.0, -0.5, -1.1, -0.3], [-2.0, -1.0, -0.2, -0.7]]),
    }
    if tis:
        data["tis_weight"] = torch.tensor([[1.0, 1.0, 0.5, 2.0], [1.0, 1.0, 1.5, 1.0]])
    return TensorDict(data, batch_size=[2])


@pytest.mark.parametrize(
    "cfg",
    [
        GRPOConfig(kl_coef=0.1, kl_estimator="k1"),
        GRPOConfig(kl_coef=0.1, kl_estimator="k2"),
        GRPOConfig(kl_coef=0.1, kl_estimator="k3"),
        GRPOConfig.variant("gspo", kl_coef=0.1),
        GRPOConfig.variant("dr-grpo", kl_coef=0.1, tis_cap=2.0),
    ],
    ids=["k1", "k2", "k3", "gspo", "tis"],
)
def test_grpo_loss_is_finite_with_inf_log_probs_off_the_mask(cfg: GRPOConfig) -> None:
    logprob = _logprob()
    loss, stats = grpo_loss(logprob, _micro_batch(cfg.tis_cap is not None), cfg, 3.0, 2.0, 4.0)
    assert all(torch.isfinite(v) for v in stats.values())
    _finite_loss_and_grad(loss, logprob)


@pytest.mark.parametrize("processing", [{"top_k": 5}, {"top_p": 0.9}], ids=["top-k", "top-p"])
def test_grpo_updates_with_top_k_or_top_p_keep_parameters_finite(processing: dict) -> None:
    """What `pickaxe train arith-grpo --engine.top-k 5` does: a tiny model, k3 KL in the loss, a few updates; two
    epochs of two mini-batches, so later steps score tokens the stepped policy may no longer allow (-inf)."""
    model = tiny_lm(len(TOK), hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=0)
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, n=4, **processing)
    cfg = GRPOConfig(lr=3e-2, kl_coef=0.05, kl_estimator="k3", epochs=2, mini_batches=2)
    algo = GRPO(model, cfg, sampling, seed=0)
    engine = HFEngine(model, TOK.eos_token_id, TOK.pad_token_id, seed=0)
    reference = copy.deepcopy(model).requires_grad_(False)
    env = PromptEnv(Arithmetic(2), seed=0, eval_size=5)
    collector = TextCollector(env, engine, TOK, 6, sampling, model, reference, lambda: algo.version)
    seen_inf = []
    forward = algo.forward_logprobs

    def watched(layout, *args):
        out = forward(layout, *args)
        seen_inf.append(bool(torch.isinf(out).any()))
        return out

    algo.forward_logprobs = watched
    for _ in range(3):
        batch = collector.collect()
        batch["reward"] = torch.rand(len(batch), generator=torch.Generator().manual_seed(algo.version))
        metrics = algo.update(batch)
        assert math.isfinite(metrics["loss/policy"]) and math.isfinite(metrics["grad_norm"])
    assert any(seen_inf)  # -inf log-probs on the loss mask reached the loss: the test bites
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ------------------------------------------------------------------------ the optimizer step refuses NaN


def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_sft_refuses_a_nan_gradient_before_the_step() -> None:
    model = tiny_lm(len(TOK), hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64, seed=0)
    sft = SFT(model, SFTConfig(lr=1e-2))
    collector = DemoCollector(PromptEnv(Arithmetic(2), seed=0, eval_size=5), TOK, batch_size=8)
    sft.update(collector.collect())  # one good step: the optimizer has state to protect
    before, state = _params(model), copy.deepcopy(sft.optimizer.state_dict())
    bad = model.model.layers[0].mlp.down_proj.weight
    handle = bad.register_hook(lambda g: g * float("nan"))
    with pytest.raises(NonFiniteError, match=r"gradient of model\.layers\.0\.mlp\.down_proj\.weight"):
        sft.update(collector.collect())
    handle.remove()
    assert all(torch.equal(a, b) for a, b in zip(before, _params(model), strict=True))
    assert str(sft.optimizer.state_dict()) == str(state)  # no Adam step either
    assert all(p.grad is None for p in model.parameters())  # the bad gradients were dropped
    sft.update(collector.collect())  # and the next update works
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_grpo_refuses_a_nan_loss_before_the_step() -> None:
    model = tiny_lm(len(TOK), hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64, seed=0)
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, n=4)
    engine = HFEngine(model, TOK.eos_token_id, TOK.pad_token_id, seed=0)
    batch = TextCollector(PromptEnv(Arithmetic(2), seed=0, eval_size=5), engine, TOK, 4, sampling, model).collect()
    batch["reward"] = torch.arange(len(batch), dtype=torch.float32)
    batch["reward"][0] = float("nan")  # a reward function returned NaN
    algo = GRPO(model, GRPOConfig(lr=1e-2), sampling)
    before = _params(model)
    with pytest.raises(NonFiniteError, match=r"loss = nan \(GRPO update 0\)"):
        algo.update(batch)
    assert all(torch.equal(a, b) for a, b in zip(before, _params(model), strict=True))
    assert algo.version == 0 and not algo.optimizer.state


def test_optimizer_step_refuses_a_non_finite_loss_with_finite_gradients() -> None:
    model = tiny_lm(len(TOK), hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64, seed=0)
    sft = SFT(model, SFTConfig())
    sum(p.sum() for p in model.parameters()).backward()
    before = _params(model)
    with pytest.raises(NonFiniteError, match="loss = inf"):
        sft.optimizer_step(torch.tensor(float("inf")))
    assert all(torch.equal(a, b) for a, b in zip(before, _params(model), strict=True))


# ------------------------------------------------------------- pieces that must reach the update (mutants)


def test_kl_reward_penalty_lowers_the_reward_of_the_drifting_sequence() -> None:
    """kl_in=reward SUBTRACTS coef x KL: of two sequences with equal reward, the one further from the reference
    gets the lower advantage."""
    mask = torch.tensor([[0, 1, 1], [0, 1, 1]], dtype=torch.bool)
    ref = torch.tensor([[-INF, -1.0, -1.0], [-INF, -1.0, -1.0]])
    logprob = torch.tensor([[0.0, -0.1, -0.1], [0.0, -1.0, -1.0]])  # sequence 0 drifted, sequence 1 did not
    reward = torch.tensor([1.0, 1.0])
    shaped, kl_seq = kl_shaped_reward(reward, logprob, ref, mask, 0.5, "k1")
    assert kl_seq.tolist() == pytest.approx([1.8, 0.0])  # k1 = logprob - ref, summed over the mask
    assert shaped.tolist() == pytest.approx([1.0 - 0.5 * 1.8, 1.0])
    shaped, kl_seq = kl_shaped_reward(reward, logprob, ref, mask, 0.5, "k3")
    assert kl_seq[0] > 0 and shaped[0] < shaped[1] == 1.0
    cfg = GRPOConfig(kl_coef=0.5, kl_in="reward", kl_estimator="k3")
    adv, metrics = grpo_advantages(reward, torch.tensor([3, 3]), cfg, logprob, ref, mask)
    assert adv[0] < 0 < adv[1]
    assert float(metrics["kl/seq_sum_mean"]) == pytest.approx(float(kl_seq.mean()))  # per sequence, summed
    assert float(metrics["kl/token_mean"]) == pytest.approx(float(kl_seq.sum()) / 4)  # 4 generated tokens
    batch = TensorDict(
        {"reward": reward, "group": torch.tensor([3, 3]), "logprob": logprob, "ref_logprob": ref, "loss_mask": mask},
        batch_size=[2],
    )
    model = tiny_lm(len(TOK), hidden=16, layers=1, heads=2, kv_heads=1, intermediate=16)
    out = GRPO(model, cfg).with_advantages(batch)
    assert out["advantage"][0] < 0 < out["advantage"][1]


def test_tis_weight_scales_each_tokens_loss() -> None:
    logprob = torch.tensor([[0.0, -1.0, -1.0], [0.0, -1.0, -1.0]], requires_grad=True)
    mb = TensorDict(
        {
            "loss_mask": torch.tensor([[0, 1, 1], [0, 1, 0]], dtype=torch.bool),
            "advantage": torch.tensor([1.0, -1.0]),
            "old_logprob": logprob.detach().clone(),
            "tis_weight": torch.tensor([[1.0, 2.0, 0.5], [1.0, 1.5, 1.0]]),
        },
        batch_size=[2],
    )
    loss, _ = grpo_loss(logprob, mb, GRPOConfig(), 3.0, 2.0, 1.0)
    assert loss.item() == pytest.approx((-2.0 - 0.5 + 1.5) / 3)  # ratio 1: -A x weight per token
    loss.backward()
    assert logprob.grad[0, 1].item() == pytest.approx(-2.0 / 3)


@pytest.mark.filterwarnings("ignore:GRPO on-policy check")
def test_grpo_update_applies_the_tis_weights() -> None:
    """With TIS the sampler's log-probs only enter through the weights: changing them must change the update."""
    model = tiny_lm(len(TOK), hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64, seed=0)
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, n=4)
    engine = HFEngine(model, TOK.eos_token_id, TOK.pad_token_id, seed=0)
    batch = TextCollector(PromptEnv(Arithmetic(2), seed=0, eval_size=5), engine, TOK, 4, sampling, model).collect()
    batch["reward"] = torch.rand(len(batch), generator=torch.Generator().manual_seed(0))
    off = batch.clone()
    off["logprob"][::2] -= 0.5  # the sampler gave half of the sequences lower probability: weight e^0.5 there
    results = []
    for b in (batch, off):
        m = copy.deepcopy(model)
        metrics = GRPO(m, GRPOConfig(lr=1e-2, tis_cap=10.0), sampling).update(b.clone())
        results.append((torch.cat([p.detach().flatten() for p in m.parameters()]), metrics["tis/weight_mean"]))
    (p_on, w_on), (p_off, w_off) = results
    assert w_on == pytest.approx(1.0, abs=1e-4) and w_off > 1.2
    assert not torch.allclose(p_on, p_off, atol=1e-7)
