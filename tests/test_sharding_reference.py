"""Sharded KL references (``--dist.shard fsdp`` with ``kl_coef > 0``): GRPO and LLM PPO given their frozen reference
shard it like the policy (each of two gloo learners holds half of it) and score the batch's reference log-probs
themselves, each learner its share of the rows (a padding pass where it has fewer), instead of a whole reference on
rank 0 scoring every sequence in the collector. After 2 updates the weights equal the single-process run's (whose
batch carries the collector's ``ref_logprob``) within ``WEIGHT_ATOL`` and the metrics (KL terms included) within
``rel=1e-5``; ``score_reference`` (what rank 0's evaluation calls, every learner joining) gives the collector's
log-probs; a gathered state (reference included) resumes on two learners to the uninterrupted numbers."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.tensor import DTensor

from pickaxe.algos.configs import LLMPPOConfig
from pickaxe.algos.grpo import GRPO, GRPOConfig
from pickaxe.algos.llm_ppo import LLMPPO
from pickaxe.models.value import ValueModel

sys.path.insert(0, str(Path(__file__).parent))
from learner_group import on_learners, same_metrics
from test_data_parallel import _lm
from test_llm_training import SAMPLING
from test_sharding import WEIGHT_ATOL, _cases, _demos, _full_state, _run, _trained, _updates

WORLD = 2
NAMES = {"grpo_shared_prefix": "grpo_ref", "llm_ppo": "llm_ppo_ref"}  # single-process run -> sharded-reference run


def _reference() -> torch.nn.Module:
    return _lm(seed=5)  # the model the collector scored the batch's ref_logprob with


def _algo(name: str, model: torch.nn.Module) -> Any:
    model = copy.deepcopy(model)
    if name == "grpo_ref":  # as test_sharding's grpo_shared_prefix: 3 micro-batches a step, one learner pads
        cfg = GRPOConfig(lr=1e-3, micro_batch_size=5, mini_batches=2, kl_coef=0.1, tis_cap=2.0, logprob_chunk_tokens=16)
        return GRPO(model, cfg, SAMPLING, reference=_reference())
    critic = ValueModel.from_lm(_lm(seed=3))
    cfg = LLMPPOConfig(lr=1e-3, micro_batch_size=5, mini_batches=2, kl_coef=0.05, ptx_coef=0.5)
    return LLMPPO(model, critic, cfg, SAMPLING, ptx=_demos(seed=1, size=11), reference=_reference())


def _without_reference(batch: Any) -> Any:
    batch = batch.clone()
    del batch["ref_logprob"]
    return batch


def _sharded(name: str, cases: dict[str, Any], out: Path) -> dict[str, Any]:
    algo = _algo(name, cases["model"])
    algo.shard()
    local = sum(p.to_local().numel() for p in algo.reference.parameters())
    assert all(isinstance(p, DTensor) for p in algo.reference.parameters())
    batch = cases["grpo"]
    scored = algo.score_reference(batch["input_ids"], batch["attention_mask"], batch["loss_mask"], 1.0)
    cases = {**cases, "grpo": _without_reference(batch)}
    metrics = _updates(algo, "grpo", cases, 1)
    full = copy.deepcopy(_full_state(algo.state_dict()))  # the reference's weights included; Adam's step copied
    metrics += _updates(algo, "grpo", cases, 1)
    fresh = _algo(name, cases["model"])
    for p in fresh.reference.parameters():
        p.detach().zero_()  # the reference must come from the state
    fresh.shard()
    fresh.load_state_dict(full)
    resumed = _updates(fresh, "grpo", cases, 1)
    return {
        "metrics": metrics,
        "trained": _trained(algo),
        "resumed": {"metrics": resumed, "trained": _trained(fresh)},
        "scored": scored,
        "local": local,
    }


def _learner_results(cases: dict[str, Any], out: Path) -> dict[str, Any]:
    return {ref: _sharded(ref, cases, out) for ref in NAMES.values()}


@pytest.fixture(scope="module")
def results() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """(single-process results, each learner's sharded-reference results, the cases)."""
    torch.set_num_threads(1)
    cases = _cases()
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        learners = on_learners(_learner_results, cases, Path(out), WORLD)  # forked: they inherit torch, transformers
    single = {name: _run(name, cases, sharded=False) for name in NAMES}
    return single, learners, cases


@pytest.mark.parametrize("name", list(NAMES))
def test_a_sharded_kl_reference_gives_the_single_process_updates(results, name: str) -> None:
    single, learners, _ = results
    want = single[name]
    assert any(m.get("kl/token_mean", 0.0) > 0 or m.get("kl/seq_sum_mean", 0.0) > 0 for m in want["metrics"])
    for got in (learner[NAMES[name]] for learner in learners):
        assert (got["trained"] - want["trained"]).abs().max() <= WEIGHT_ATOL
        for g, w in zip(got["metrics"], want["metrics"], strict=True):
            same_metrics(g, w)
        # resumed from the state after the first update: the second update's numbers
        assert (got["resumed"]["trained"] - want["trained"]).abs().max() <= WEIGHT_ATOL
        same_metrics(got["resumed"]["metrics"][0], want["metrics"][1])


def test_each_learner_holds_half_the_reference_and_scores_it_with_the_others(results) -> None:
    _, learners, cases = results
    whole = sum(p.numel() for p in _reference().parameters())
    for learner in learners:
        for ref in NAMES.values():
            assert learner[ref]["local"] <= 0.55 * whole
            # what rank 0's evaluation gets (eval/kl): the collector's log-probs of the same tokens
            torch.testing.assert_close(learner[ref]["scored"], cases["grpo"]["ref_logprob"], atol=1e-5, rtol=0)
    assert learners[0]["grpo_ref"]["local"] + learners[1]["grpo_ref"]["local"] == whole
