"""Sharded reward models (``--dist.shard fsdp`` with ``--data.reward-model``): the algorithm shards the run's frozen
reward model with its own models, so each of two gloo learners holds half of it, and scoring a batch of completions
is a collective (each learner its share of the row blocks, a padding pass where it has fewer) that gives the whole
model's scores exactly. At the run level a two-learner GRPO run scored by a tiny reward model logs the one-process
run's rewards and ends with its weights; the flag keeps it whole; the planner counts half of it per learner."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.tensor import DTensor

from pickaxe.algos.grpo import GRPO, GRPOConfig
from pickaxe.dist import data_parallel
from pickaxe.models import last_layer
from pickaxe.models.reward import tiny_reward_model
from pickaxe.models.tokenizer import char_tokenizer
from pickaxe.rollout.pairs import RewardModelScorer
from pickaxe.rollout.text_collector import pack

sys.path.insert(0, str(Path(__file__).parent))
from learner_group import on_learners
from test_llm_training import SAMPLING

TOK = char_tokenizer()
WORLD = 2


def _reward_model() -> torch.nn.Module:
    return tiny_reward_model(len(TOK), hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=4)


def _rows() -> dict[str, torch.Tensor]:
    """Ten packed prompt/completion rows of different lengths (rows=4 a forward: three blocks, one learner pads)."""
    prompts = [list(TOK(f"sort {i}{i + 3}=")["input_ids"]) for i in range(10)]
    responses = [list(TOK("1" * (i % 4) + "9")["input_ids"]) for i in range(10)]
    return pack(prompts, responses, int(TOK.pad_token_id))


def _learner(cases: dict[str, Any], out: Path) -> dict[str, Any]:
    from test_data_parallel import _lm

    def built() -> torch.nn.Module:  # as the builder does: whole on rank 0, shapes on meta on the others
        model = copy.deepcopy(cases["model"])
        return model if data_parallel.rank() == 0 else model.to("meta")

    algo = GRPO(_lm(seed=2), GRPOConfig(lr=1e-3, micro_batch_size=4, autocast="bf16"), SAMPLING)
    algo.reward_scorer = RewardModelScorer(built(), TOK, rows=4)
    built_elements = sum(p.numel() for p in algo.reward_scorer.model.parameters() if not p.is_meta)
    algo.shard()  # the policy and, with it, the reward model (in float32 whatever the policy's autocast)
    model = algo.reward_scorer.model
    rows = cases["rows"]
    # --collector.offload-reward-model: the shards wait on the host (FSDP's CPU offload; on a CPU nothing moves)
    offloaded = RewardModelScorer(built(), TOK, rows=4, offload_to="cpu")
    offloaded.shard()
    return {
        "built_elements": built_elements,
        "local": sum(p.to_local().numel() for p in model.parameters()),
        "dtensors": all(isinstance(p, DTensor) for p in model.parameters()),
        "scores": algo.reward_scorer.score_tokens(rows["input_ids"], rows["attention_mask"]),
        "texts": algo.reward_scorer.batch(["sort 12=", "sort 3="], ["12", ""]),  # one block: the other pads
        "offloaded": offloaded.score_tokens(rows["input_ids"], rows["attention_mask"]),
    }


def test_each_learner_holds_half_the_reward_model_and_scores_as_the_whole_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(1)
    model = _reward_model()
    cases = {"model": model, "rows": _rows()}
    learners = on_learners(_learner, cases, tmp_path, WORLD)
    # a sharded decoder runs its last layer at every position (FSDP's hooks own its weights); so does the whole
    # model here, so that the scores compare bit for bit
    monkeypatch.setattr(last_layer, "MAX_SHARE", 0.0)
    whole = RewardModelScorer(model, TOK, rows=4)
    want = whole.score_tokens(cases["rows"]["input_ids"], cases["rows"]["attention_mask"])
    texts = whole.batch(["sort 12=", "sort 3="], ["12", ""])
    total = sum(p.numel() for p in model.parameters())
    assert sum(learner["local"] for learner in learners) == total
    assert learners[1]["built_elements"] == 0  # the other learner never held the whole model: rows from rank 0's
    for learner in learners:
        assert learner["dtensors"] and learner["local"] <= 0.55 * total
        assert torch.equal(learner["scores"], want)  # the same blocks of rows as the whole model: the same numbers
        assert learner["texts"] == texts and torch.equal(learner["offloaded"], want)


def test_the_builder_gives_the_algorithm_the_reward_model_only_when_it_is_sharded(reward_folder: Path) -> None:
    from types import SimpleNamespace

    from pickaxe.train.llm import build_env, keep_reward_model

    for learners, shard, keep, kept in ((2, "fsdp", True, True), (2, "fsdp", False, False), (2, "none", True, False)):
        cfg = _cfg(reward_folder, learners, shard)
        cfg.dist.shard_reward_model = keep
        env = build_env(cfg, 0, 1, TOK)
        algo = SimpleNamespace(reward_scorer=None)
        keep_reward_model(cfg, env, algo)  # type: ignore[arg-type]
        proxy = env.rewards[env.reward_names.index("proxy")][0]
        assert isinstance(proxy, RewardModelScorer) and (algo.reward_scorer is proxy) == kept
        assert not any(p.is_meta for p in proxy.model.parameters())  # rank 0's: whole, read from the folder


def test_another_learner_builds_the_sharded_reward_model_without_reading_its_weights(
    reward_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickaxe.dist.learners as learners_module
    from pickaxe.train.llm import build_env

    monkeypatch.setenv("RANK", "1")  # a torchrun learner other than rank 0
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert learners_module.is_follower()
    env = build_env(_cfg(reward_folder, 2, "fsdp"), 0, 1, TOK)
    proxy = env.rewards[env.reward_names.index("proxy")][0]
    assert all(p.is_meta for p in proxy.model.parameters())  # shapes only: its rows come from rank 0's


# ------------------------------------------------------------------------------------------------ the run level


def _cfg(folder: Path, learners: int, shard: str) -> Any:
    from test_sharded_runs import _cfg as sharded_cfg

    cfg = sharded_cfg(learners, shard)
    cfg.data.reward_model = str(folder)
    cfg.trainer.total_steps = 32
    return cfg


@pytest.fixture(scope="module")
def reward_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rm") / "reward-model"
    _reward_model().save(folder)  # no tokenizer: the policy's (the same characters)
    return folder


def test_a_sharded_reward_model_run_logs_the_single_learner_rewards_and_weights(
    tmp_path: Path, reward_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickaxe.dist.learners as learners_module
    from pickaxe.runs.tracking import read_metrics
    from pickaxe.train.build import train

    held: list[tuple[int, int]] = []
    launch = learners_module.launch

    def launch_and_look(cfg: Any, algo: Any, *args: Any) -> Any:
        leader = launch(cfg, algo, *args)
        params = list(algo.reward_scorer.model.parameters())
        held.append((sum(p.to_local().numel() for p in params), sum(p.numel() for p in params)))
        return leader

    monkeypatch.setattr(learners_module, "launch", launch_and_look)
    records = {}
    for learners, shard in ((1, "none"), (2, "fsdp")):
        train(_cfg(reward_folder, learners, shard), run_dir=tmp_path / shard)
        records[shard] = read_metrics(tmp_path / shard, deterministic=True)
    ((local, whole),) = held
    assert local <= 0.55 * whole  # rank 0 holds half of the reward model (the other learner: the test above)
    one, two = records["none"], records["fsdp"]
    assert len(one) == len(two)
    proxy = [r["rollout/reward/proxy"] for r in one if "rollout/reward/proxy" in r]
    # the same weights score the same rows, but each learner scores its share in batches of its own: a CPU's matmul
    # kernels may round differently by batch shape (seen: 2.6e-8 relative on an AMD EPYC, nothing on another CPU)
    assert len(proxy) == 2
    assert proxy == pytest.approx([r["rollout/reward/proxy"] for r in two if "rollout/reward/proxy" in r], rel=1e-6)
    evals = [(a.get("eval/reward/proxy"), b.get("eval/reward/proxy")) for a, b in zip(one, two, strict=True)]
    assert any(a is not None for a, _ in evals)
    assert all(b == (a if a is None else pytest.approx(a, rel=1e-6)) for a, b in evals)
    assert any(r.get("grad_norm", 0.0) > 0 for r in one)
    for a, b in zip(one, two, strict=True):
        for key, value in a.items():
            if not key.startswith(("sync/", "time/", "perf/", "mem/")):
                assert b[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    from safetensors.torch import load_file

    a, b = (load_file(tmp_path / s / "model.safetensors") for s in ("none", "fsdp"))
    assert a.keys() == b.keys() and all((a[k] - b[k]).abs().max() <= 1e-5 for k in a)
    assert json.loads((tmp_path / "fsdp" / "config.json").read_text())["dist"]["shard_reward_model"] is True


@pytest.mark.slow
def test_a_sharded_reward_model_run_moves_between_learner_counts(tmp_path: Path, reward_folder: Path) -> None:
    """Nothing of the reward model is in a checkpoint (it is read from its folder): a run SIGKILLed on two sharded
    learners, resumed on one (the reward model whole on rank 0) and then on two again ends on the uninterrupted
    numbers."""
    from pickaxe.runs.tracking import read_metrics
    from test_sharded_runs import TINY, _close, _pickaxe

    args = [*TINY, "--data.reward-model", str(reward_folder), "--dist.learners", "2", "--dist.shard", "fsdp"]
    args += ["--trainer.save-every", "16", "--trainer.total-steps", "64"]
    assert _pickaxe("train", *args, "--run-dir", str(tmp_path / "whole")).returncode == 0
    run = tmp_path / "moved"
    assert _pickaxe("train", *args, "--run-dir", str(run), fault="iteration:1").returncode != 0
    one = _pickaxe("resume", str(run), "--no-progress", "--learners", "1", fault="iteration:1")
    assert one.returncode != 0  # killed again, after a checkpoint written by one unsharded learner
    two = _pickaxe("resume", str(run), "--no-progress", "--learners", "2", "--shard", "fsdp")
    assert two.returncode == 0, two.stderr
    whole, moved = read_metrics(tmp_path / "whole", deterministic=True), read_metrics(run, deterministic=True)
    assert any("rollout/reward/proxy" in r for r in moved)
    _close(whole, moved)
