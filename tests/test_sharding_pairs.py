"""Sharded DPO and reward model (``--dist.shard fsdp``, PyTorch FSDP2 on gloo): two learners holding half of every
parameter, gradient and optimizer state each apply the single-process update, with the shared-prompt layout (the
reward model also padded, with gradient checkpointing). 9 pairs in micro-batches of 2 pairs make 5 micro-batches
(of 3 pairs: 3): shares of 3 and 2, so one learner runs a padding pass. After 2 updates the sharded weights match
the single-process ones (``learner_group.close_weights``) and the metrics within ``rel=1e-5`` (the second update's:
1e-4); rank 0's unsharded ``policy`` holds the trained weights and evaluates held-out pairs to the single-process
numbers. DPO's frozen reference is sharded too (each learner holds half of it): its cache of reference log-probs is
the single-process one, and the held-out pairs' reference log-probs are scored by both learners together (the
policy's part on rank 0 alone). A LoRA DPO sharing its reference with the policy is refused. Slow: whole sharded
synthetic-dpo and synthetic-rm runs log the one-learner numbers and, killed after their first checkpoint, resume to
exactly the uninterrupted numbers."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.tensor import DTensor

from pickaxe.algos.configs import DPOConfig, RewardModelConfig
from pickaxe.algos.dpo import DPO
from pickaxe.algos.reward_model import RewardModelTrainer
from pickaxe.dist import data_parallel
from pickaxe.envs.text.synthetic_preferences import sorting_preferences
from pickaxe.models.reward import RewardModel
from pickaxe.rollout.pairs import pack_pairs

sys.path.insert(0, str(Path(__file__).parent))
from learner_group import close_weights, on_learners, same_metrics
from test_data_parallel_pairs import TOK, _lm, _tiny_run

WORLD = 2
LR = 1e-3  # every case's learning rate: close_weights' unit
UPDATES = 2
NAMES = ["dpo", "rm", "rm_padded"]


def _cases() -> dict[str, Any]:
    """The training batch (9 pairs with per-pair margins) and a held-out one, built once in the parent."""
    pairs = sorting_preferences(9, seed=3)
    for i, p in enumerate(pairs):
        p.metadata["m"] = 0.1 * i
    heldout = sorting_preferences(5, seed=11)
    return {"batch": pack_pairs(pairs, TOK, margin_key="m"), "heldout": pack_pairs(heldout, TOK, pair_ids=range(5))}


def _algo(name: str) -> Any:
    if name == "dpo":  # the output layer in chunks of 16 tokens: the decoder and the head called apart
        cfg = DPOConfig(lr=LR, beta=0.5, micro_batch_size=4, logprob_chunk_tokens=16)
        return DPO(_lm(), cfg, reference=_lm(seed=7))
    cfg = RewardModelConfig(lr=LR, margin=0.2, micro_batch_size=4)
    if name == "rm_padded":  # 3 pairs a micro-batch: 3 micro-batches, shares of 2 and 1
        cfg = RewardModelConfig(lr=LR, micro_batch_size=6, share_prompts=False, gradient_checkpointing=True)
    return RewardModelTrainer(RewardModel.from_lm(_lm(), seed=1), copy.deepcopy(cfg))


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _run(name: str, cases: dict[str, Any], sharded: bool) -> dict[str, Any]:
    algo = _algo(name)
    if sharded:
        algo.shard()
    assert algo.layout == ("padded" if name == "rm_padded" else "shared-prefix")
    metrics = [algo.update(cases["batch"].clone()) for _ in range(UPDATES)]
    trained = torch.cat([_full(p.detach()).flatten() for p in algo.model.parameters()])  # a collective if sharded
    out: dict[str, Any] = {"metrics": metrics, "trained": trained}
    if isinstance(algo, DPO):
        out["cache"] = algo.state_dict()["ref_cache"]
        out["reference_local"] = sum(_local(p).numel() for p in algo.reference.parameters())
    evaluated = None
    if isinstance(algo, DPO) and sharded:  # the sharded reference scores held-out pairs with every learner
        evaluated = algo.evaluate(cases["heldout"].clone())
        if data_parallel.rank() != 0:
            assert evaluated == {}
    if data_parallel.rank() == 0:  # the policy's part on rank 0 alone: its whole weights, no collective
        out["networks"] = torch.cat([p.detach().flatten() for p in algo.networks()["policy"].parameters()])
        out["eval"] = evaluated if evaluated is not None else algo.evaluate(cases["heldout"].clone())
    return out


def _learner_results(cases: dict[str, Any], out: Path) -> dict[str, Any]:
    """What each learner computes: its results of the same updates."""
    return {name: _run(name, cases, sharded=True) for name in NAMES}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(single-process results, each learner's results of the same updates sharded over two learners)."""
    torch.set_num_threads(1)
    cases = _cases()
    out = tmp_path_factory.mktemp("fsdp_pairs")
    learners = on_learners(_learner_results, cases, out, WORLD)  # forked: they inherit torch, transformers
    single = {name: _run(name, cases, sharded=False) for name in NAMES}
    return single, learners


@pytest.mark.parametrize("name", NAMES)
def test_two_sharded_learners_apply_the_single_process_updates(results, name: str) -> None:
    single, learners = results
    want = single[name]
    start = torch.cat([p.detach().flatten() for p in _algo(name).networks()["policy"].parameters()])
    assert (want["networks"] - start).abs().max() > 1e-3  # it learned something
    for got in (learner[name] for learner in learners):
        close_weights(got["trained"], want["trained"], LR)
        for i, (g, w) in enumerate(zip(got["metrics"], want["metrics"], strict=True)):
            same_metrics(g, w, rel=1e-5 if i == 0 else 1e-4)  # later updates start from close_weights' weights
        if "cache" in want:  # the reference sharded over the learners, its pairs shared out and summed
            assert torch.equal(got["cache"]["ids"], want["cache"]["ids"])
            torch.testing.assert_close(got["cache"]["values"], want["cache"]["values"], atol=1e-6, rtol=0)
            assert got["reference_local"] <= 0.55 * want["reference_local"]  # each learner holds half of it
    assert torch.equal(learners[0][name]["trained"], learners[1][name]["trained"])
    last = learners[0][name]["metrics"][-1]
    assert last["sync/gather_bytes"] > 0
    if name == "dpo":
        assert last["dpo/ref_cache_hits"] == 1.0  # the second update ran no reference


@pytest.mark.parametrize("name", NAMES)
def test_rank_0_policy_holds_the_trained_weights_and_evaluates_alone(results, name: str) -> None:
    single, learners = results
    want, got = single[name], learners[0][name]
    close_weights(got["networks"], want["networks"], LR)
    if name.startswith("rm"):
        assert got["eval"] == want["eval"]  # a pairwise accuracy: a count of 5 pairs
    else:
        same_metrics(got["eval"], want["eval"])


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["synthetic-dpo", "synthetic-rm"])
def test_a_sharded_run_logs_the_single_learner_numbers(tmp_path: Path, recipe: str) -> None:
    """~10 s a recipe here (seen: metrics within 4e-5 relative), launching, evaluation on rank 0 and export
    included."""
    from pickaxe.runs.tracking import read_metrics
    from pickaxe.train.build import train

    records = {}
    for learners, shard in ((1, "none"), (2, "fsdp")):
        cfg = _tiny_run(recipe, learners)
        cfg.dist.shard = shard
        _, run = train(cfg, run_dir=tmp_path / f"l{learners}")
        records[learners] = [
            {k: v for k, v in r.items() if not k.startswith(("sync/", "mem/"))}  # its own: its shards
            for r in read_metrics(run.path, deterministic=True)
        ]
    one, two = records[1], records[2]
    key = "loss/dpo" if recipe == "synthetic-dpo" else "loss/rm"
    assert len(one) == len(two) and sum(key in r for r in one) >= 2 and any("eval/accuracy" in r for r in two)
    for a, b in zip(one, two, strict=True):
        assert a.keys() == b.keys()
        for k, value in a.items():
            assert b[k] == pytest.approx(value, rel=1e-4, abs=1e-6), k


def test_a_lora_dpo_whose_reference_is_the_policy_is_refused_in_one_line() -> None:
    from pickaxe.errors import ConfigError, PickaxeError
    from pickaxe.models.lora import apply_lora, shared_reference
    from pickaxe.recipes import get_recipe

    policy = apply_lora(_lm(), r=2)
    with pytest.raises(PickaxeError, match="DPO cannot shard a LoRA policy whose reference is itself"):
        DPO(policy, DPOConfig(), reference=shared_reference(policy)).shard()
    cfg = get_recipe("synthetic-dpo")
    cfg.dist.learners, cfg.dist.shard, cfg.model.lora.r = 2, "fsdp", 4
    with pytest.raises(ConfigError, match="DPO's reference is the LoRA policy with its adapters off") as e:
        cfg.check()
    assert "\n" not in str(e.value)
    cfg.dist.shard = "none"
    cfg.check()  # data-parallel LoRA DPO is fine


RUN_FLAGS = [
    "--seed", "3", "--device", "cpu", "--dist.learners", "2", "--dist.shard", "fsdp", "--warm-start.updates", "2",
    "--preferences.prompts", "16", "--preferences.heldout-prompts", "8", "--collector.prompts", "8",
    "--algo.micro-batch-size", "4", "--trainer.total-steps", "32", "--trainer.eval-every", "32",
    "--trainer.save-every", "8", "--eval.prompts", "8", "--eval.samples", "1", "--eval.pass-k", "1", "--no-progress",
]  # fmt: skip


def _pickaxe(*args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"PICKAXE_FAULT": fault} if fault else {})}
    return subprocess.run([sys.executable, "-m", "pickaxe.cli", *args], env=env, capture_output=True, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["synthetic-dpo", "synthetic-rm"])
def test_a_killed_sharded_run_resumes_exactly(tmp_path: Path, recipe: str) -> None:
    """~40 s a recipe here (three runs): the sharded checkpoint (DPO's with its reference and cache) written by
    both learners."""
    from pickaxe.runs.tracking import read_metrics

    assert _pickaxe("train", recipe, *RUN_FLAGS, "--run-dir", str(tmp_path / "whole")).returncode == 0
    killed = _pickaxe("train", recipe, *RUN_FLAGS, "--run-dir", str(tmp_path / "killed"), fault="iteration:1")
    assert killed.returncode != 0  # SIGKILL after the first update and its checkpoint
    done = _pickaxe("resume", str(tmp_path / "killed"), "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "resume is exact" in done.stderr
    whole = read_metrics(tmp_path / "whole", deterministic=True)
    assert sum("loss/dpo" in r or "loss/rm" in r for r in whole) == 2
    assert read_metrics(tmp_path / "killed", deterministic=True) == whole
