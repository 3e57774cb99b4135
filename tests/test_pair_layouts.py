"""The shared-prompt layout of preference pairs (``share_prompts``, the default): DPO's loss, implicit rewards and
gradient, its reference log-probs, and the reward model's loss, scores and gradient equal the padded layout's
(one copy of the prompt per response) up to float rounding, for pairs of different lengths, a prompt shared by
several pairs, truncated answers (no EOS, a single token, none at all) and any micro-batch size (rows then hold
one or several prompts' groups); and each prompt really runs once per micro-batch.

Tolerances: gradients ``atol 1e-6, rtol 1e-4`` (float32, entries up to ~1e-1: the layouts sum attention and
matmuls in another order), losses and metrics ``rel 1e-5, abs 1e-6``, reference log-probs and scores ``1e-5``.
"""

from __future__ import annotations

import copy

import pytest
import torch

from pickaxe.algos.configs import DPOConfig, RewardModelConfig
from pickaxe.algos.dpo import DPO
from pickaxe.algos.pairs_core import plan_pair_micro_batches, read_pairs
from pickaxe.algos.reward_model import RewardModelTrainer, last_token_bounds, score_prefix_lengths
from pickaxe.data.layout import sequence_bounds
from pickaxe.envs.text.preferences import PreferencePair
from pickaxe.models.lm import tiny_lm
from pickaxe.models.reward import tiny_reward_model
from pickaxe.models.tokenizer import char_tokenizer
from pickaxe.rollout.pairs import pack_pairs

TOK = char_tokenizer()
GRAD = {"atol": 1e-6, "rtol": 1e-4}
METRIC = {"rel": 1e-5, "abs": 1e-6}


def _lm(seed: int = 0) -> torch.nn.Module:
    return tiny_lm(len(TOK), hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=seed)


def _rm(seed: int = 0) -> torch.nn.Module:
    return tiny_reward_model(len(TOK), hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=seed)


def _pairs() -> list[PreferencePair]:
    """Prompts of different lengths, ``sort 3142=`` shared by three pairs (not next to each other), responses of
    different lengths (one of a single character)."""
    return [
        PreferencePair("sort 3142=", "1234", "3124"),
        PreferencePair("7+5=", "12", "1"),
        PreferencePair("sort 3142=", "1234", "43211"),
        PreferencePair("sort 90817=", "01789", "9"),
        PreferencePair("sort 3142=", "12344", "2"),
        PreferencePair("9+9=", "18", "81818181"),
    ]


def _batches() -> dict[str, object]:
    """The pairs with EOS, and truncated (no EOS: cut at the generation budget), one rejected answer empty."""
    truncated = [*_pairs(), PreferencePair("3+4=", "7", "")]
    return {"eos": pack_pairs(_pairs(), TOK), "truncated": pack_pairs(truncated, TOK, eos=False)}


def _step(algo, batch) -> tuple[torch.Tensor, dict[str, float]]:
    """The update's metrics and the flat gradient the optimizer stepped with."""
    seen: list[torch.Tensor] = []
    step = algo.optimizer.step

    def recording(*args, **kwargs):
        seen.append(torch.cat([p.grad.flatten() for p in algo.model.parameters() if p.grad is not None]))
        return step(*args, **kwargs)

    algo.optimizer.step = recording
    metrics = algo.update(batch)
    return seen[0], metrics


def _same_update(runs: list[tuple[torch.Tensor, dict[str, float]]], keys: tuple[str, ...]) -> None:
    (want, want_metrics), rest = runs[0], runs[1:]
    assert want.abs().max() > 1e-3  # a real gradient
    for got, metrics in rest:
        torch.testing.assert_close(got, want, **GRAD)
        for key in keys:
            assert metrics[key] == pytest.approx(want_metrics[key], **METRIC), key


@pytest.mark.parametrize("kind", ["eos", "truncated"])
@pytest.mark.parametrize("loss", ["sigmoid", "ipo"])
def test_dpo_shared_prompts_give_the_padded_update(kind: str, loss: str) -> None:
    batch = _batches()[kind]
    reference = _lm(seed=7)  # not the policy: the first gradient is not the symmetric one
    runs, refs = [], []
    for share, micro in ((False, 64), (True, 64), (True, 4), (True, 6)):
        cfg = DPOConfig(lr=1e-3, beta=0.5, loss=loss, micro_batch_size=micro, max_grad_norm=1e9, share_prompts=share)
        algo = DPO(_lm(), cfg, reference=copy.deepcopy(reference))
        assert algo.layout == ("shared-prefix" if share else "padded")
        runs.append(_step(algo, batch))
        refs.append(algo._ref_values.clone())
    _same_update(runs, ("loss/dpo", "dpo/accuracy", "dpo/margin", "dpo/chosen_reward", "dpo/rejected_reward"))
    for got in refs[1:]:
        torch.testing.assert_close(got, refs[0], atol=1e-5, rtol=1e-5)  # the reference's cached log-probs


@pytest.mark.parametrize("kind", ["eos", "truncated"])
def test_dpo_evaluate_is_the_same_in_both_layouts(kind: str) -> None:
    batch = _batches()[kind]
    out = [DPO(_lm(), DPOConfig(share_prompts=share), reference=_lm(seed=7)).evaluate(batch) for share in (False, True)]
    for key, value in out[0].items():
        assert out[1][key] == pytest.approx(value, **METRIC), key


@pytest.mark.parametrize("kind", ["eos", "truncated"])
def test_reward_model_shared_prompts_give_the_padded_update(kind: str) -> None:
    batch = _batches()[kind]
    model = _rm()
    runs = []
    for share, micro in ((False, 64), (True, 64), (True, 4), (True, 6)):
        cfg = RewardModelConfig(lr=1e-3, margin=0.3, micro_batch_size=micro, max_grad_norm=1e9, share_prompts=share)
        algo = RewardModelTrainer(copy.deepcopy(model), cfg)
        assert algo.layout == ("shared-prefix" if share else "padded")
        runs.append(_step(algo, batch))
    _same_update(runs, ("loss/rm", "rm/accuracy", "rm/margin", "rm/chosen_reward", "rm/rejected_reward"))
    # the scores are those of the plain forward, read at each sequence's last real token
    scores = model.score(batch["input_ids"], batch["attention_mask"])
    for _, metrics in runs:
        assert metrics["rm/chosen_reward"] == pytest.approx(float(scores[0::2].mean()), abs=1e-5)
        assert metrics["rm/rejected_reward"] == pytest.approx(float(scores[1::2].mean()), abs=1e-5)


def test_reward_model_scores_both_responses_from_one_pass_over_the_prompt() -> None:
    batch = _batches()["truncated"]
    model = _rm(seed=2)
    algo = RewardModelTrainer(model, RewardModelConfig())
    _, data, plan = algo._plan(batch)
    assert len(plan) == 1
    _, rows, layout = plan[0]
    with torch.no_grad():
        shared = model.layout_scores(layout)
        plain = model.score(data["input_ids"][rows], data["attention_mask"][rows])
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)
    accuracy = RewardModelTrainer(model, RewardModelConfig(share_prompts=False)).evaluate(batch)
    assert algo.evaluate(batch) == accuracy


def test_each_prompt_runs_once_per_micro_batch() -> None:
    """One micro-batch of every pair: the rows hold each distinct prompt once and every response after it, for
    DPO's log-probs and the reward model's last-token scores alike; short groups share rows (fewer rows than
    prompts)."""
    pairs = _pairs()
    batch = pack_pairs(pairs, TOK)
    data_pairs = read_pairs(batch)
    full = sequence_bounds(batch["attention_mask"], batch["loss_mask"])
    prompts = {p.prompt: len(TOK(p.prompt)["input_ids"]) for p in pairs}
    responses = sum(len(s) for s in full.scored)
    assert len(prompts) == 4 and len(pairs) == 6
    ((_, _, dpo),) = plan_pair_micro_batches(batch["input_ids"], full, data_pairs, 64, "shared-prefix")
    assert dpo.real_tokens == sum(prompts.values()) + responses
    rm_bounds, prefix = last_token_bounds(full), score_prefix_lengths(full)
    ((_, _, rm),) = plan_pair_micro_batches(
        batch["input_ids"], rm_bounds, data_pairs, 64, "shared-prefix", prefix_lengths=prefix
    )
    assert rm.real_tokens == dpo.real_tokens
    assert dpo.input_ids.shape[0] < len(prompts) and dpo.slots < 1.25 * dpo.real_tokens
    ((_, _, padded),) = plan_pair_micro_batches(batch["input_ids"], full, data_pairs, 64, "padded")
    assert padded.real_tokens == sum(full.length) > dpo.real_tokens


def test_a_model_without_sdpa_attention_keeps_the_padded_layout() -> None:
    eager = _lm()
    eager.config._attn_implementation = "eager"
    assert DPO(eager, DPOConfig(), reference=_lm()).layout == "padded"
    assert DPO(_lm(), DPOConfig(), reference=eager).layout == "padded"  # the reference must take the mask too
    assert DPO(_lm(), DPOConfig(micro_batch_layout="packed")).layout == "packed"
    with pytest.raises(ValueError, match="unknown layout 'diagonal'; choose one of padded, length-sorted"):
        plan_pair_micro_batches(torch.zeros(2, 3, dtype=torch.long), None, read_pairs(_batches()["eos"]), 2, "diagonal")
