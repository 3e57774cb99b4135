"""DPO: a short run raises the held-out chosen-vs-rejected margin, the first loss is the known value (policy =
reference), micro-batching and layouts give the same gradient, the reference scores each pair once (cache hit in
the second epoch, values equal to a direct computation), and the cache survives state_dict."""

import copy
import math

import pytest
import torch

from pickaxe.algos.configs import DPOConfig
from pickaxe.algos.dpo import DPO
from pickaxe.algos.llm_core import sequence_sum
from pickaxe.envs.text.synthetic_preferences import sorting_preferences
from pickaxe.models.lm import completion_logprobs, tiny_lm
from pickaxe.models.tokenizer import char_tokenizer
from pickaxe.rollout.pairs import pack_pairs, pair_batches

TOK = char_tokenizer()


def _lm(seed: int = 0):
    return tiny_lm(len(TOK), hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=seed)


def step_gradients(algo, batch) -> tuple[torch.Tensor, dict[str, float]]:
    """The update's metrics and the flat gradient the optimizer stepped with (after accumulation); gradients, not
    weights after Adam, whose first step is ~lr * sign(g) for an entry within rounding of 0."""
    seen: list[torch.Tensor] = []
    step = algo.optimizer.step

    def recording_step(*args, **kwargs):
        seen.append(torch.cat([p.grad.flatten() for p in algo.model.parameters() if p.grad is not None]))
        return step(*args, **kwargs)

    algo.optimizer.step = recording_step
    metrics = algo.update(batch)
    return seen[0], metrics


def _params(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_short_dpo_run_raises_the_held_out_margin() -> None:
    heldout = pack_pairs(sorting_preferences(100, seed=1, split="heldout"), TOK, [10_000 + i for i in range(100)])
    algo = DPO(_lm(), DPOConfig(lr=1e-3, beta=0.1))
    before = algo.evaluate(heldout)
    for batch in pair_batches(sorting_preferences(256, seed=0), TOK, batch_size=32, seed=0):
        metrics = algo.update(batch)
    after = algo.evaluate(heldout)
    assert before["dpo/eval_margin"] == 0.0 and before["loss/dpo_eval"] == pytest.approx(math.log(2))
    assert after["dpo/eval_margin"] > 0.05, after  # 0.0 -> 0.089 (accuracy 1.0) on the machine this was written on
    assert after["dpo/eval_accuracy"] >= 0.9 and after["loss/dpo_eval"] < math.log(2)
    assert metrics["dpo/chosen_reward"] > metrics["dpo/rejected_reward"]
    assert metrics["dpo/margin"] == pytest.approx(metrics["dpo/chosen_reward"] - metrics["dpo/rejected_reward"])


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, math.log(2)),  # -log sigmoid(0)
        ({"label_smoothing": 0.2}, math.log(2)),
        ({"loss": "ipo", "beta": 0.1}, (1 / (2 * 0.1)) ** 2),  # (0 - 1/(2 beta))^2
    ],
)
def test_first_loss_with_the_policy_equal_to_the_reference(options: dict, expected: float) -> None:
    metrics = DPO(_lm(), DPOConfig(lr=1e-3, **options)).update(pack_pairs(sorting_preferences(4), TOK))
    assert metrics["loss/dpo"] == pytest.approx(expected, rel=1e-5)
    assert metrics["dpo/margin"] == 0.0 and metrics["dpo/accuracy"] == 0.0  # a tie is not a win


@pytest.mark.parametrize(
    "options",
    [
        {"micro_batch_layout": "padded"},
        {"micro_batch_layout": "length-sorted"},
        {"micro_batch_layout": "packed"},
        {"loss": "ipo"},
        {"label_smoothing": 0.1},
    ],
)
def test_micro_batching_does_not_change_the_update(options: dict) -> None:
    batch = pack_pairs(sorting_preferences(6, seed=2, max_len=6), TOK)
    reference = _lm(seed=7)  # differs from the policy, so the first gradient is not the symmetric one
    grads, metrics = [], []
    for micro in (1, 4, 64):
        cfg = DPOConfig(lr=1e-3, micro_batch_size=micro, max_grad_norm=1e9, **options)
        g, m = step_gradients(DPO(_lm(), cfg, reference=copy.deepcopy(reference)), batch)
        grads.append(g)
        metrics.append(m)
    assert grads[0].abs().max() > 1e-3
    for g, m in zip(grads[1:], metrics[1:], strict=True):
        torch.testing.assert_close(g, grads[0], atol=1e-6, rtol=1e-4)
        for key in ("loss/dpo", "dpo/accuracy", "dpo/margin", "grad_norm"):
            assert m[key] == pytest.approx(metrics[0][key], rel=1e-5, abs=1e-6), key


def test_reference_log_probs_are_computed_once_per_pair() -> None:
    pairs = sorting_preferences(12, seed=4)
    reference = _lm(seed=9)
    algo = DPO(_lm(), DPOConfig(lr=1e-3, micro_batch_size=8), reference=reference)
    ref_before = _params(reference)
    hits = [algo.update(b)["dpo/ref_cache_hits"] for b in pair_batches(pairs, TOK, batch_size=5, epochs=1, seed=0)]
    assert hits == [0.0, 0.0, 0.0] and algo.reference_sequences == 24
    hits = [algo.update(b)["dpo/ref_cache_hits"] for b in pair_batches(pairs, TOK, batch_size=5, epochs=1, seed=1)]
    assert hits == [1.0, 1.0, 1.0] and algo.reference_sequences == 24  # second epoch: no reference forward
    assert torch.equal(_params(reference), ref_before)  # frozen
    # the cached values are the reference's summed response log-probs, computed directly
    batch = pack_pairs(pairs, TOK)
    with torch.no_grad():
        logp = completion_logprobs(reference, batch["input_ids"], batch["attention_mask"], batch["loss_mask"])
    direct = sequence_sum(logp, batch["loss_mask"]).view(-1, 2)
    cached = algo._ref_values[[algo._slots[i] for i in range(12)]]
    torch.testing.assert_close(cached, direct, atol=1e-5, rtol=1e-5)


def test_an_id_reused_for_another_pair_is_refused() -> None:
    algo = DPO(_lm(), DPOConfig(lr=1e-3))
    algo.update(pack_pairs(sorting_preferences(2, seed=0, min_len=3, max_len=3), TOK))
    with pytest.raises(ValueError, match="pair id 0 was cached for responses of other lengths"):
        algo.update(pack_pairs(sorting_preferences(2, seed=0, min_len=6, max_len=6), TOK))


def test_state_dict_keeps_the_reference_and_its_cache() -> None:
    pairs = sorting_preferences(6, seed=5)
    batch = pack_pairs(pairs, TOK)
    algo = DPO(_lm(), DPOConfig(lr=1e-3), reference=_lm(seed=3))
    algo.update(batch)
    restored = DPO(_lm(seed=1), DPOConfig(lr=1e-3), reference=_lm(seed=4))
    restored.load_state_dict(copy.deepcopy(algo.state_dict()))
    a, b = algo.update(batch), restored.update(batch)
    assert restored.reference_sequences == 0 and b["dpo/ref_cache_hits"] == 1.0
    assert a["loss/dpo"] == b["loss/dpo"]
    assert torch.equal(_params(algo.model), _params(restored.model))


@pytest.mark.parametrize(("loss", "smoothing"), [("sigmoid", 0.0), ("sigmoid", 0.2), ("ipo", 0.0)])
def test_the_loss_and_implicit_rewards_by_direct_log_probs(loss: str, smoothing: float) -> None:
    """beta 0.5, a reference other than the policy, responses of different lengths: ``loss/dpo`` and the implicit
    rewards are those of the summed response log-probs computed directly (IPO: each response's per-token mean,
    its own token count; cDPO: label smoothing 0.2)."""
    from pickaxe.envs.text.preferences import PreferencePair

    pairs = [PreferencePair("3+4=", "7", "71234"), PreferencePair("9+9=", "18812", "1")]
    batch = pack_pairs(pairs, TOK)
    policy, reference = _lm(), _lm(seed=7)
    with torch.no_grad():
        pi, ref = (
            sequence_sum(completion_logprobs(m, batch["input_ids"], batch["attention_mask"], batch["loss_mask"]),
                         batch["loss_mask"]).view(-1, 2)
            for m in (policy, reference)
        )  # fmt: skip
    beta = 0.5
    ratio = pi - ref
    if loss == "ipo":
        counts = batch["loss_mask"].sum(-1).view(-1, 2).float()
        assert not torch.equal(counts[:, 0], counts[:, 1])
        ratio = ratio / counts
    h = ratio @ torch.tensor([1.0, -1.0])
    logsig = torch.nn.functional.logsigmoid
    sigmoid = (-(1 - smoothing) * logsig(beta * h) - smoothing * logsig(-beta * h)).mean()
    want = (h - 1 / (2 * beta)).pow(2).mean() if loss == "ipo" else sigmoid
    cfg = DPOConfig(lr=1e-3, beta=beta, loss=loss, label_smoothing=smoothing)  # type: ignore[arg-type]
    metrics = DPO(policy, cfg, reference=reference).update(batch)
    assert metrics["loss/dpo"] == pytest.approx(want.item(), rel=1e-4)
    assert metrics["dpo/chosen_reward"] == pytest.approx((beta * ratio[:, 0]).mean().item(), rel=1e-4, abs=1e-6)
