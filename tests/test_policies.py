"""Policy retention: every evaluation keeps the acting weights (RUN/policies), keep_last never prunes them, each loads
and scores its logged eval number again, a resumed run keeps the same policies as an uninterrupted one, a damaged
policy is refused with one line; and the Trainer's alarm wiring (alarm/NAME in metrics.jsonl, an event)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pickaxe.errors import PickaxeError
from pickaxe.eval.alarms import AlarmConfig
from pickaxe.recipes import get_recipe
from pickaxe.recipes.llm import LLM_RECIPES
from pickaxe.runs.checkpoint import CheckpointManager
from pickaxe.runs.model import load_model
from pickaxe.runs.policies import list_policies, load_policy_tensors, policy_dir
from pickaxe.runs.run import Run, read_metrics
from pickaxe.train.build import build_trainer, evaluate_run, resume, train
from pickaxe.train.config import TrainerConfig
from pickaxe.train.llm import evaluate_llm_run
from pickaxe.train.llm_config import LLMEvalConfig, LMConfig, TextCollectorConfig, WarmStartConfig


def classic_cfg(total: int = 4096, **trainer: Any) -> Any:
    """A CartPole PPO run of a few seconds: evaluations every 1024 steps, one checkpoint kept."""
    cfg = get_recipe("cartpole-ppo")
    cfg.env.num_envs = 4
    cfg.model.hidden = (32, 32)
    cfg.trainer = TrainerConfig(total_steps=total, eval_every=1024, eval_episodes=6, keep_last=1, **trainer)
    cfg.seed = 0
    return cfg


def llm_cfg() -> Any:
    """The tiny arith-grpo run of the LLM tests: evaluations at steps 0 (before), 16 and 32."""
    cfg = LLM_RECIPES["arith-grpo"].make()
    cfg.model = LMConfig(hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64)
    cfg.warm_start = WarmStartConfig(updates=4, batch_size=16, log_every=2)
    cfg.collector = TextCollectorConfig(prompts=4, group_size=4)
    cfg.eval = LLMEvalConfig(prompts=12, samples=4, pass_k=2)
    cfg.trainer = TrainerConfig(total_steps=32, eval_every=16, keep_last=1)
    cfg.device = "cpu"
    cfg.seed = 3
    return cfg


def _evals(run_dir: Path) -> dict[int, dict[str, Any]]:
    return {r["step"]: r for r in read_metrics(run_dir) if "eval/return_mean" in r or "eval/accuracy" in r}


@pytest.fixture(scope="module")
def classic_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("policies") / "classic"
    train(classic_cfg(), run_dir=run_dir)
    return run_dir


def test_every_evaluation_keeps_a_policy_that_scores_its_logged_number(classic_run: Path) -> None:
    evals = _evals(classic_run)
    kept = list_policies(classic_run)
    assert [p.step for p in kept] == sorted(evals) == [1024, 2048, 3072, 4096]
    assert [i.step for i in CheckpointManager(classic_run).list()] == [4096]  # keep_last=1 pruned checkpoints only
    cfg = classic_cfg()
    for p in kept:
        logged = evals[p.step]
        assert p.metrics["eval/return_mean"] == logged["eval/return_mean"]
        assert logged["eval/return_mean_ci_low"] <= logged["eval/return_mean"] <= logged["eval/return_mean_ci_high"]
        returns, _ = evaluate_run(cfg, classic_run, episodes=6, checkpoint=p.step)  # loads the kept policy
        assert float(returns.mean()) == logged["eval/return_mean"]  # bitwise
        assert p.size == (p.path / "model.safetensors").stat().st_size
    # only the acting networks: a policy is the weights, far smaller than a full training state
    checkpoint = CheckpointManager(classic_run).list()[-1].path / "tensors.safetensors"
    assert kept[-1].size < checkpoint.stat().st_size / 2
    selection = json.loads((classic_run / "selection.json").read_text())
    assert selection["metric"] == "eval/return_mean" and selection["step"] in evals


def test_best_loads_the_step_selection_json_names(classic_run: Path, tmp_path: Path) -> None:
    # `eval --checkpoints best`, `export --checkpoint best`, the arena and the playground all mean the same step:
    # the one the run's selection rule recorded, even when keep_last pruned its checkpoint (its policy is loaded)
    run_dir = tmp_path / "copy"
    shutil.copytree(classic_run, run_dir)
    selection = json.loads((run_dir / "selection.json").read_text())
    selection["step"] = 2048  # a step whose full checkpoint was pruned
    (run_dir / "selection.json").write_text(json.dumps(selection))
    best, _ = evaluate_run(classic_cfg(), run_dir, episodes=6, checkpoint="best")
    step_2048, _ = evaluate_run(classic_cfg(), run_dir, episodes=6, checkpoint=2048)
    assert best.tolist() == step_2048.tolist()
    assert float(best.mean()) == _evals(run_dir)[2048]["eval/return_mean"]


def test_a_corrupted_policy_is_refused_with_one_line(classic_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "copy"
    shutil.copytree(classic_run, run_dir)
    path = policy_dir(run_dir, 2048) / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(PickaxeError) as error:
        load_policy_tensors(run_dir, 2048)
    message = str(error.value)
    assert "does not match its sha256" in message and str(path) in message and "\n" not in message
    with pytest.raises(PickaxeError, match="does not match its sha256"):
        evaluate_run(classic_cfg(), run_dir, episodes=2, checkpoint=2048)
    path.write_bytes(bytes(data[:100]))
    with pytest.raises(PickaxeError, match="truncated"):
        load_policy_tensors(run_dir, 2048)
    with pytest.raises(PickaxeError, match="no checkpoint at env step 1000; kept checkpoints: 4096; kept policies"):
        load_model(run_dir, {}, checkpoint=1000)


def test_a_resumed_run_keeps_the_policies_of_an_uninterrupted_one(classic_run: Path, tmp_path: Path) -> None:
    cfg = classic_cfg()
    cfg.trainer.keep_last = 2  # the checkpoint of 2048 is still on disk when 3072's is lost
    run = Run(tmp_path / "cut", config=cfg.to_dict(), seed=cfg.seed)
    trainer = build_trainer(cfg, run)
    trainer.fit(total_steps=3072)
    trainer.close()
    run.close()
    # a crash after the step-3072 evaluation, before its checkpoint: the policy of 3072 and a stray later one stay
    for info in CheckpointManager(tmp_path / "cut").list():
        if info.step > 2048:
            shutil.rmtree(info.path)
    shutil.copytree(policy_dir(tmp_path / "cut", 3072), policy_dir(tmp_path / "cut", 3500))
    resume(tmp_path / "cut")
    full, cut = classic_run / "policies", tmp_path / "cut" / "policies"
    names = sorted(p.name for p in full.iterdir())
    assert sorted(p.name for p in cut.iterdir()) == names
    for name in names:
        for f in ("model.safetensors", "model.json"):
            assert (cut / name / f).read_bytes() == (full / name / f).read_bytes()


def test_llm_run_keeps_a_policy_per_evaluation(tmp_path: Path) -> None:
    run_dir = tmp_path / "llm"
    cfg = llm_cfg()
    train(cfg, run_dir=run_dir)
    evals = _evals(run_dir)
    assert [p.step for p in list_policies(run_dir)] == sorted(evals) == [0, 16, 32]
    assert [i.step for i in CheckpointManager(run_dir).list()] == [32]
    logged = {k: v for k, v in evals[16].items() if k.startswith("eval/") and k != "eval/phase_before"}
    assert evaluate_llm_run(cfg, run_dir, checkpoint=16) == logged  # from the kept policy: the same numbers
    for name in ("eval/sampled_length", "eval/entropy", "eval/pass@2"):
        assert evals[16][f"{name}_ci_low"] <= evals[16][name] <= evals[16][f"{name}_ci_high"]
    # the builder wires the alarm monitor: its state rides in the trainer checkpoint
    state, _ = CheckpointManager(run_dir).load()
    assert {"history", "fired"} <= set(state["alarms"]) and len(state["alarms"]["history"]) == 3
    assert json.loads((run_dir / "selection.json").read_text())["metric"] == "eval/accuracy"


class OverOptimised:
    """An evaluator whose proxy rises while gold rises then falls beyond its CI (reward hacking)."""

    GOLD = (0.5, 0.6, 0.3, 0.2)
    PROXY = (0.1, 0.5, 1.0, 1.5)

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, algo: Any) -> dict[str, float]:
        i = min(self.calls, len(self.GOLD) - 1)
        self.calls += 1
        gold = self.GOLD[i]
        return {
            "eval/return_mean": gold,
            "eval/reward/gold": gold,
            "eval/reward/gold_ci_low": gold - 0.05,
            "eval/reward/gold_ci_high": gold + 0.05,
            "eval/reward/proxy": self.PROXY[i],
        }


def test_fired_alarms_reach_metrics_events_and_the_checkpoint(tmp_path: Path) -> None:
    from pickaxe.envs.make import make
    from pickaxe.rollout.collector import Collector
    from pickaxe.train.build import build_algorithm
    from pickaxe.train.trainer import Trainer

    cfg = classic_cfg()
    run = Run(tmp_path / "hacked", config=cfg.to_dict(), seed=0)
    envs = make(cfg.env.id, cfg.env.num_envs, 0)
    algo = build_algorithm(cfg, envs)
    trainer = Trainer(algo, Collector(envs, algo.policy, steps=cfg.collector.steps), run=run, config=cfg.trainer,
                      evaluator=OverOptimised(), alarms=AlarmConfig(), select=cfg.select)  # fmt: skip
    trainer.fit()
    trainer.close()
    run.close()
    records = read_metrics(tmp_path / "hacked")
    fired = {r["step"]: k for r in records for k in r if k.startswith("alarm/")}
    assert fired == {3072: "alarm/proxy_up_gold_down"}
    events = [json.loads(line) for line in (tmp_path / "hacked" / "events.jsonl").read_text().splitlines()]
    alarm = [e for e in events if e.get("alarm") == "proxy_up_gold_down"]
    assert len(alarm) == 1 and alarm[0]["step"] == 3072 and "reward hacking" in alarm[0]["message"]
    state, _ = CheckpointManager(tmp_path / "hacked").load()
    assert state["alarms"]["fired"] == {"proxy_up_gold_down": 3072}
    # selection.json picks the gold peak (gold comes first in the default metric order)
    assert json.loads((tmp_path / "hacked" / "selection.json").read_text())["step"] == 2048
