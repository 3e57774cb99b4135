"""Data-parallel DPO and reward model (torch.distributed, gloo on localhost): two learners, each computing its share
of every optimizer step's micro-batches (and DPO's reference log-probs of the pairs not cached yet), apply the
single-process update: the same gradients, weights, metrics and reference cache up to float summation order
(tolerances below), with the shared-prompt layout and the padded one. The learners end with
bitwise-equal weights and metrics. A DPO or reward-model run may ask for several learners; slow: such a run
with two learners logs the one-learner numbers."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from learner_group import on_learners
from pickaxe.algos.configs import DPOConfig, RewardModelConfig
from pickaxe.algos.dpo import DPO
from pickaxe.algos.reward_model import RewardModelTrainer
from pickaxe.envs.text.synthetic_preferences import sorting_preferences
from pickaxe.models.lm import tiny_lm
from pickaxe.models.reward import RewardModel
from pickaxe.models.tokenizer import char_tokenizer
from pickaxe.rollout.pairs import pack_pairs

WORLD = 2
GRAD_ATOL = 1e-6  # float32 gradients of order 1e-2..1: only the summation order differs, so elementwise within
GRAD_RTOL = 1e-5  # GRAD_ATOL + GRAD_RTOL * |want| (an absolute bound alone failed here at 1.07e-6)
WEIGHT_ATOL = 1e-5  # after two or three Adam steps, which amplify rounding in near-zero gradients (seen: 1.3e-6)
TOK = char_tokenizer()


def _lm(seed: int = 0) -> torch.nn.Module:
    # llama (no attention biases): a bias with a mathematically zero gradient would get Adam's +-lr from float noise
    return tiny_lm(len(TOK), arch="llama", hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=seed)


def _cases() -> dict[str, dict[str, Any]]:
    """Each case: the algorithm's name, config and the batches of its updates (built once, in the parent)."""
    pairs = sorting_preferences(9, seed=3)
    for i, p in enumerate(pairs):
        p.metadata["m"] = 0.1 * i
    batch = pack_pairs(pairs, TOK, margin_key="m")
    prompt_shared = pack_pairs(sorting_preferences(4, seed=3) + sorting_preferences(3, seed=3), TOK,
                               pair_ids=range(100, 107))  # fmt: skip
    # 9 pairs, 2 per micro-batch: 5 micro-batches, shares of 3 and 2; the second update's reference is cached
    dpo = {"lr": 1e-3, "beta": 0.5, "micro_batch_size": 4}
    return {
        "dpo": {"algo": "dpo", "cfg": DPOConfig(**dpo), "batches": [batch, prompt_shared, batch]},
        "dpo_padded_ipo": {
            "algo": "dpo",
            "cfg": DPOConfig(**dpo, loss="ipo", share_prompts=False),
            "batches": [batch, batch],
        },
        "rm": {"algo": "rm", "cfg": RewardModelConfig(lr=1e-3, margin=0.2, micro_batch_size=4), "batches": [batch]},
        "rm_padded": {
            "algo": "rm",
            "cfg": RewardModelConfig(lr=1e-3, micro_batch_size=6, share_prompts=False),  # 3 pairs a micro-batch
            "batches": [batch, prompt_shared],
        },
    }


def _algo(case: dict[str, Any]) -> Any:
    cfg = copy.deepcopy(case["cfg"])
    if case["algo"] == "dpo":
        return DPO(_lm(), cfg, reference=_lm(seed=7))
    return RewardModelTrainer(RewardModel.from_lm(_lm(), seed=1), cfg)


def _weights(algo: Any) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in algo.model.parameters()])


def _run(case: dict[str, Any]) -> dict[str, Any]:
    """The case's updates: the gradients each optimizer step applied, the weights after, the metrics, the cache."""
    algo = _algo(case)
    seen: list[torch.Tensor] = []
    step = algo.optimizer.step

    def recording(*args: Any, **kwargs: Any) -> Any:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in algo.model.parameters()]
        seen.append(torch.cat([g.detach().flatten() for g in grads]).clone())
        return step(*args, **kwargs)

    algo.optimizer.step = recording
    metrics = [algo.update(b.clone()) for b in case["batches"]]
    out = {"grads": seen, "weights": _weights(algo), "metrics": metrics}
    if isinstance(algo, DPO):
        out["cache"] = algo.state_dict()["ref_cache"]
        out["reference_sequences"] = algo.reference_sequences
    return out


def _learner_results(cases: dict[str, dict[str, Any]], out: Path) -> dict[str, Any]:
    """What each learner computes: its results of the same updates."""
    return {name: _run(case) for name, case in cases.items()}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(single-process results, each learner's results of the same updates with two learners)."""
    torch.set_num_threads(1)
    cases = _cases()
    out = tmp_path_factory.mktemp("dp_pairs")
    learners = on_learners(_learner_results, cases, out, WORLD)  # forked: they inherit torch, transformers
    single = {name: _run(case) for name, case in cases.items()}
    return single, learners


@pytest.mark.parametrize("name", ["dpo", "dpo_padded_ipo", "rm", "rm_padded"])
def test_two_learners_apply_the_single_process_update(results, name: str) -> None:
    single, learners = results
    want = single[name]
    assert len(want["grads"]) == len(_cases()[name]["batches"]) and want["grads"][0].abs().max() > 1e-3
    for got in (learner[name] for learner in learners):
        assert len(got["grads"]) == len(want["grads"])
        for g, w in zip(got["grads"], want["grads"], strict=True):
            torch.testing.assert_close(g, w, rtol=GRAD_RTOL, atol=GRAD_ATOL)
        assert (got["weights"] - want["weights"]).abs().max() <= WEIGHT_ATOL
        for got_m, want_m in zip(got["metrics"], want["metrics"], strict=True):
            assert got_m.keys() == want_m.keys()
            for key, value in want_m.items():
                assert got_m[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
        if "cache" in want:  # each learner computed its share of the reference's pairs; both hold all of them
            assert torch.equal(got["cache"]["ids"], want["cache"]["ids"])
            assert torch.equal(got["cache"]["lengths"], want["cache"]["lengths"])
            torch.testing.assert_close(got["cache"]["values"], want["cache"]["values"], atol=1e-6, rtol=0)
            assert got["reference_sequences"] == want["reference_sequences"]
    assert torch.equal(learners[0][name]["weights"], learners[1][name]["weights"])
    assert learners[0][name]["metrics"] == learners[1][name]["metrics"]
    if name.startswith("dpo"):
        assert [m["dpo/ref_cache_hits"] for m in want["metrics"]][-1] == 1.0  # the last update ran no reference


def _tiny_run(recipe: str, learners: int) -> Any:
    """``recipe`` shrunk: 16 generated preference prompts, 8 pairs a batch in 4 micro-batches (2 on each of two
    learners), two updates logged, one evaluation at the end."""
    from pickaxe.recipes import get_recipe

    cfg = get_recipe(recipe)
    cfg.dist.learners = learners
    cfg.warm_start.updates = 2
    cfg.preferences.prompts, cfg.preferences.heldout_prompts = 16, 8
    cfg.collector.prompts = 8
    cfg.algo.micro_batch_size = 4
    cfg.trainer.total_steps = cfg.trainer.eval_every = 24
    cfg.eval.prompts, cfg.eval.samples, cfg.eval.pass_k, cfg.eval.before = 8, 1, 1, False
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["synthetic-dpo", "synthetic-rm"])
def test_a_run_with_two_learners_logs_the_single_learner_numbers(tmp_path: Path, recipe: str) -> None:
    """~8 s a recipe here (seen: metrics within 6e-6 relative)."""
    from pickaxe.runs.tracking import read_metrics
    from pickaxe.train.build import train

    records = {}
    for learners in (1, 2):
        _, run = train(_tiny_run(recipe, learners), run_dir=tmp_path / f"l{learners}")
        records[learners] = read_metrics(run.path, deterministic=True)
    one, two = records[1], records[2]
    key = "loss/dpo" if recipe == "synthetic-dpo" else "loss/rm"
    assert len(one) == len(two) and sum(key in r for r in one) >= 2
    for a, b in zip(one, two, strict=True):
        assert a.keys() == b.keys()
        for k, value in a.items():
            assert b[k] == pytest.approx(value, rel=1e-4, abs=1e-6), k


def test_pair_runs_may_ask_for_several_learners() -> None:
    from pickaxe.recipes import get_recipe

    for recipe in ("synthetic-dpo", "synthetic-rm"):
        cfg = get_recipe(recipe)
        cfg.dist.learners = 2
        cfg.check()  # no "does not split its update" refusal
