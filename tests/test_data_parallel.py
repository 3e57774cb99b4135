"""Data-parallel learners (torch.distributed, gloo on localhost): two learners, each computing its share of every
optimizer step's micro-batches (GRPO, SFT, LLM PPO) or minibatch rows (classic PPO), apply the single-process
update: the same gradients, weights and metrics up to float summation order (the learners sum their partial
gradients in another order than one process accumulates them: not bitwise; seen: gradients 4e-8, weights 3e-7,
metrics 3e-7 relative). A non-finite share on one learner refuses the step on both. Launching (``--dist.learners``):
an algorithm that does not split its update is refused in one line; slow: a run with two learners logs the
one-learner numbers, a killed one resumes to the uninterrupted numbers, a learner that cannot build is one line."""

from __future__ import annotations

import copy
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from pickaxe.algos.base import my_share
from pickaxe.algos.configs import LLMPPOConfig, PPOConfig
from pickaxe.algos.grpo import GRPO, GRPOConfig
from pickaxe.algos.llm_ppo import LLMPPO
from pickaxe.algos.ppo import PPO
from pickaxe.algos.sft import SFT, SFTConfig
from pickaxe.dist import data_parallel
from pickaxe.envs.make import make
from pickaxe.envs.text import Arithmetic, PromptEnv
from pickaxe.errors import NonFiniteError
from pickaxe.models.actor_critic import ActorCritic
from pickaxe.models.lm import tiny_lm
from pickaxe.models.value import ValueModel
from pickaxe.rollout.collector import Collector
from pickaxe.rollout.text_collector import DemoCollector

sys.path.insert(0, str(Path(__file__).parent))
from learner_group import on_learners
from test_llm_training import SAMPLING, TOK, _grpo_batch

WORLD = 2
GRAD_ATOL = 1e-6  # float32 gradients of order 1e-2..1: only the summation order differs, so elementwise within
GRAD_RTOL = 1e-5  # GRAD_ATOL + GRAD_RTOL * |want| (an absolute bound alone is at the edge of float32 rounding)
WEIGHT_ATOL = 1e-6


def _lm(seed: int = 0) -> torch.nn.Module:
    # llama (no attention biases): Qwen2's key bias has a mathematically zero gradient whose float noise Adam's
    # first step turns into +-lr, so weights would differ by the noise's sign, not by the update
    return tiny_lm(len(TOK), arch="llama", hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=seed)


def _cases() -> dict[str, dict[str, Any]]:
    """Every algorithm with the state and batch one update starts from (built once, in the parent)."""
    torch.manual_seed(0)
    lm = _lm()
    grpo_batch = _grpo_batch(lm, reference=_lm(seed=5))
    demos = DemoCollector(PromptEnv(Arithmetic(2), seed=0, eval_size=5), TOK, batch_size=12).collect()
    envs = make("CartPole-v1", 4, seed=0)
    policy = ActorCritic.for_env(envs, hidden=(16,))
    rollout = Collector(envs, policy, steps=128).collect()
    envs.close()
    return {
        "grpo": {"model": lm, "batch": grpo_batch},
        "grpo_tis": {"model": lm, "batch": grpo_batch},
        "sft": {"model": lm, "batch": demos},
        "llm_ppo": {"model": lm, "batch": grpo_batch},
        "ppo": {"model": policy, "batch": rollout},
    }


def _algo(name: str, model: torch.nn.Module) -> Any:
    model = copy.deepcopy(model)
    if name == "grpo":  # 24 sequences, 2 mini-batches x 2 epochs, 3 micro-batches each: shares of 2 and 1
        cfg = GRPOConfig(lr=1e-3, micro_batch_size=5, mini_batches=2, epochs=2, kl_coef=0.1)
        return GRPO(model, cfg, SAMPLING)
    if name == "grpo_tis":  # TIS's old log-probs: 5 blocks of 5 rows, 3 computed by one learner and 2 by the other
        return GRPO(model, GRPOConfig(lr=1e-3, micro_batch_size=5, tis_cap=2.0, kl_coef=0.1), SAMPLING)
    if name == "sft":  # 12 demonstrations in 3 micro-batches
        return SFT(model, SFTConfig(lr=1e-3, micro_batch_size=5))
    if name == "llm_ppo":
        critic = ValueModel.from_lm(_lm(seed=3))
        cfg = LLMPPOConfig(lr=1e-3, micro_batch_size=5, mini_batches=2, kl_coef=0.05)
        return LLMPPO(model, critic, cfg, SAMPLING)
    return PPO(model, PPOConfig(lr=1e-3, minibatch_size=128, epochs=2))  # 512 rows: 4 steps of 2 x 64-row shares


def _weights(algo: Any) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for net in algo.networks().values() for p in net.parameters()])


def _run(name: str, case: dict[str, Any], nan_on_rank: int | None = None) -> dict[str, Any]:
    """One update of ``name``; the gradients each optimizer step applied, the weights after, the metrics."""
    algo = _algo(name, case["model"])
    seen: list[torch.Tensor] = []
    step = algo.optimizer.step
    module = algo.policy

    def recording(*args: Any, **kwargs: Any) -> Any:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in module.parameters()]
        seen.append(torch.cat([g.detach().flatten() for g in grads]).clone())
        return step(*args, **kwargs)

    algo.optimizer.step = recording
    if nan_on_rank is not None and data_parallel.rank() == nan_on_rank:
        forward = algo.forward_logprobs
        algo.forward_logprobs = lambda *a, **k: forward(*a, **k) * float("nan")
    torch.manual_seed(1)  # classic PPO's minibatch shuffle: the same on every learner
    before = _weights(algo)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the on-policy checks of a batch sampled by another model
        try:
            metrics = algo.update(case["batch"].clone())
        except NonFiniteError as e:
            return {"error": str(e), "unchanged": bool(torch.equal(before, _weights(algo)))}
    return {"grads": seen, "weights": _weights(algo), "metrics": metrics}


def _reads(case: dict[str, Any]) -> int:
    """Host reads of one GRPO update with 2 epochs x 2 mini-batches (``test_llm_scale``'s counter)."""
    from test_llm_scale import _count_reads

    algo = _algo("grpo", case["model"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _count_reads(lambda: algo.update(case["batch"].clone()))


def _learner_results(cases: dict[str, dict[str, Any]], out: Path) -> dict[str, Any]:
    """What each learner computes: its results of the same updates."""
    results = {name: _run(name, case) for name, case in cases.items()}
    results["nan"] = _run("sft", cases["sft"], nan_on_rank=1)
    results["reads"] = _reads(cases["grpo"])
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(single-process results, each learner's results of the same updates with two learners)."""
    torch.set_num_threads(1)  # conftest's one-thread fixture is per test: this module-wide setup runs before it
    cases = _cases()
    out = tmp_path_factory.mktemp("dp")
    learners = on_learners(_learner_results, cases, out, WORLD)  # forked: they inherit torch, transformers
    single = {name: _run(name, case) for name, case in cases.items()}
    single["reads"] = _reads(cases["grpo"])
    return single, learners


@pytest.mark.parametrize("name", ["grpo", "grpo_tis", "sft", "llm_ppo", "ppo"])
def test_two_learners_apply_the_single_process_update(results, name: str) -> None:
    single, learners = results
    want = single[name]
    assert len(want["grads"]) > 0 and want["grads"][0].abs().max() > 1e-3  # real gradients
    for got in (learner[name] for learner in learners):
        assert len(got["grads"]) == len(want["grads"])  # the same number of optimizer steps
        for g, w in zip(got["grads"], want["grads"], strict=True):
            torch.testing.assert_close(g, w, rtol=GRAD_RTOL, atol=GRAD_ATOL)
        assert (got["weights"] - want["weights"]).abs().max() <= WEIGHT_ATOL
        assert got["metrics"].keys() == want["metrics"].keys()
        for key, value in want["metrics"].items():
            assert got["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    # the learners hold the same weights and report the same numbers, bit for bit
    assert torch.equal(learners[0][name]["weights"], learners[1][name]["weights"])
    assert learners[0][name]["metrics"] == learners[1][name]["metrics"]


def test_a_non_finite_share_on_one_learner_refuses_the_step_on_every_learner(results) -> None:
    _, learners = results
    for got in learners:
        assert "error" in got["nan"], got["nan"]  # rank 1's NaN loss reached rank 0 through the summed loss
        assert got["nan"]["unchanged"]  # refused before optimizer.step()
    assert learners[0]["nan"]["error"] == learners[1]["nan"]["error"]  # the same decision and the same message


def test_learners_read_the_device_once_per_optimizer_step_like_one_process(results) -> None:
    single, learners = results
    # the sequence bounds, the token ids (shared prompts), each epoch's shuffle (a CPU generator's: no device wait)
    # and one per optimizer step
    assert single["reads"] == 1 + 1 + 2 + 4
    assert [learner["reads"] for learner in learners] == [single["reads"]] * WORLD  # collectives are not reads


def test_without_a_group_a_learner_computes_every_micro_batch() -> None:
    assert data_parallel.rank() == 0 and data_parallel.world_size() == 1
    assert list(my_share(5)) == [0, 1, 2, 3, 4]


# ------------------------------------------------------------------------------------- launching learners for a run
def _tiny_grpo(learners: int) -> Any:
    from test_llm_training import _tiny_cfg

    cfg = _tiny_cfg(seed=3)
    cfg.dist.learners = learners
    cfg.algo.micro_batch_size = 3  # 16 sequences in 6 micro-batches: 3 on each learner
    cfg.data.reward = "reward_fns:length_score"  # a signal from the first update (the task's reward is 0 at first)
    return cfg


@pytest.mark.slow
def test_a_run_with_two_learners_logs_the_single_learner_numbers(tmp_path: Path) -> None:
    from pickaxe.runs.tracking import read_metrics
    from pickaxe.train.build import train

    records = {}
    for learners in (1, 2):
        result, run = train(_tiny_grpo(learners), run_dir=tmp_path / f"l{learners}")
        assert result.steps == 32
        assert json.loads((run.path / "status.json").read_text())["state"] == "finished"
        assert (run.path / "model.safetensors").is_file() and (run.path / "checkpoints" / "latest").exists()
        records[learners] = read_metrics(run.path, deterministic=True)
    one, two = records[1], records[2]
    assert len(one) == len(two) and any(r.get("grad_norm", 0.0) > 0.1 for r in one)  # it learned something
    for a, b in zip(one, two, strict=True):
        assert a.keys() == b.keys()
        for key, value in a.items():
            assert b[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_an_algorithm_that_does_not_split_its_update_is_refused_before_any_learner_starts(tmp_path: Path) -> None:
    from pickaxe.errors import ConfigError
    from pickaxe.recipes import get_recipe
    from pickaxe.train.build import train

    cfg = get_recipe("cartpole-dqn")
    cfg.dist.learners = 2
    with pytest.raises(ConfigError, match=r"DQN does not split its update.*--dist.learners 1"):
        train(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # no half-made run left behind


@pytest.mark.slow
def test_a_killed_run_with_two_learners_resumes_to_the_uninterrupted_numbers(tmp_path: Path) -> None:
    import os
    import subprocess

    from pickaxe.runs.tracking import read_metrics

    args = ["cartpole-ppo", "--dist.learners", "2", "--trainer.total-steps", "2048", "--trainer.save-every", "512"]
    args += ["--no-progress"]

    def pickaxe(*extra: str, fault: str | None = None) -> int:
        env = {**os.environ, **({"PICKAXE_FAULT": fault} if fault else {})}
        return subprocess.run([sys.executable, "-m", "pickaxe.cli", *extra], env=env, capture_output=True).returncode

    assert pickaxe("train", *args, "--run-dir", str(tmp_path / "whole")) == 0
    assert pickaxe("train", *args, "--run-dir", str(tmp_path / "killed"), fault="iteration:5") != 0  # SIGKILL
    assert pickaxe("resume", str(tmp_path / "killed"), "--no-progress") == 0  # the learners are started again
    whole = read_metrics(tmp_path / "whole", deterministic=True)
    assert len(whole) == 8 and read_metrics(tmp_path / "killed", deterministic=True) == whole


@pytest.mark.slow
def test_a_learner_that_cannot_build_the_run_is_one_line_from_rank_0(tmp_path: Path, monkeypatch) -> None:
    import types

    from pickaxe.errors import PickaxeError
    from pickaxe.train.build import train

    rewards = types.ModuleType("rewards_only_here")  # importable in this process, not in a spawned learner
    rewards.length = lambda prompt, completion, metadata: float(len(completion))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rewards_only_here", rewards)
    cfg = _tiny_grpo(2)
    cfg.data.reward = "rewards_only_here:length"
    with pytest.raises(PickaxeError, match=r"learner 1 could not build the run's algorithm: .*rewards_only_here"):
        train(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


EXIT_SCRIPT = """
import atexit, gc, weakref
from pickaxe.dist import data_parallel
gc.disable()  # as if the cycle below had not been collected yet when the process ends


class Node:
    pass


node = Node()
node.self = node  # a reference cycle, as a sharded model's hooks and states make
ref = weakref.ref(node)
atexit.register(lambda: print("freed" if ref() is None else "alive", flush=True))  # runs after pickaxe's: LIFO
handlers = []
for _ in range(2):  # joined twice: pickaxe's handler registered once
    data_parallel.init(0, 1, port=data_parallel.free_port())
    data_parallel.shutdown()
    handlers.append(atexit._ncallbacks())
del node  # unreachable only now, after shutdown()'s own collection: as a run's objects at the end of its process
print(handlers[1] - handlers[0])
"""


def test_a_learner_collects_its_reference_cycles_before_the_interpreter_shuts_down() -> None:
    # Left to the interpreter's last collection, a sharded model's cycles are freed where a gloo thread that
    # releases one of their tensors aborts the process: ~5% of finished sharded runs exited with SIGABRT
    import subprocess

    done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "freed"]
