"""Separate engine workers on Ray (``--dist.placement separate`` on LLM runs): sync mode gives the colocated run's
numbers; pipelined mode is reproducible, exactly as stale as promised and resumes exactly after a SIGKILL; a
killed worker is replaced without changing a number; async mode stays within its staleness bound and counts
drops; the vLLM path's wiring (with a fake engine class); the flag checks."""

import copy
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from pickaxe.envs.text import Arithmetic, PromptEnv
from pickaxe.errors import ConfigError
from pickaxe.models.lm import tiny_lm
from pickaxe.models.tokenizer import char_tokenizer
from pickaxe.recipes.llm import LLM_RECIPES
from pickaxe.rollout.engines import Completion, HFEngine, SamplingParams
from pickaxe.rollout.pipelined import RolloutScheduler
from pickaxe.rollout.text_collector import encode_prompts
from pickaxe.runs.run import read_metrics
from pickaxe.train.build import train
from pickaxe.train.config import TrainerConfig
from pickaxe.train.llm import build_engine_group, build_llm_trainer
from pickaxe.train.llm_config import LLMEvalConfig, LLMTrainConfig, LMConfig, TextCollectorConfig, WarmStartConfig

ITERATIONS = 5
BATCH = 16  # completions per iteration: 4 prompts x 4
TESTS = str(Path(__file__).parent)


def digits(prompt: str, completion: str, metadata: dict[str, Any]) -> float:
    """A dense reward (share of digits in the completion), so every update changes the weights: a stale batch
    then really is off-policy, and a wrong version would change the numbers."""
    return sum(ch.isdigit() for ch in completion) / max(len(completion), 1)


def _cfg(seed: int = 3, **dist: Any) -> LLMTrainConfig:
    cfg = LLM_RECIPES["arith-grpo"].make()
    cfg.model = LMConfig(hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64)
    cfg.warm_start = WarmStartConfig(updates=4, batch_size=16, log_every=2)
    cfg.collector = TextCollectorConfig(prompts=4, group_size=4)
    cfg.eval = LLMEvalConfig(prompts=12, samples=4, pass_k=2)
    cfg.trainer = TrainerConfig(total_steps=BATCH * ITERATIONS, eval_every=2 * BATCH)
    cfg.data.reward = "verify+test_dist_llm:digits"
    cfg.algo.lr = 3e-3
    cfg.device = "cpu"
    for key, value in dist.items():
        setattr(cfg.dist, key, value)
    return cfg


def _strip(history: list[dict], also: Sequence[str] = ()) -> list[dict]:
    """Records without wall-clock, system and dist/ fields (and ``also``)."""
    drop = ("time/", "sys/", "dist/", *also)
    return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in history]


def _fit(cfg: LLMTrainConfig, cut: int | None = None, between: Any = None) -> list[dict]:
    """Fit without a run folder (optionally stopping at env step ``cut`` to call ``between(trainer)``); the
    workers are stopped afterwards."""
    trainer = build_llm_trainer(cfg)
    try:
        if cut is not None:
            trainer.fit(total_steps=cut)
            between(trainer)
        return trainer.fit().history
    finally:
        trainer.collector.close()


@pytest.fixture(scope="module")
def pipelined(ray_local, tmp_path_factory) -> tuple[Path, list[dict]]:
    """A pipelined run with two workers and staleness 2, in a run folder: (folder, history)."""
    path = tmp_path_factory.mktemp("dist") / "pipelined"
    result, _ = train(_cfg(placement="separate", mode="pipelined", max_staleness=2, workers=2), run_dir=path)
    return path, result.history


def test_sync_separate_workers_give_the_colocated_numbers(ray_local, monkeypatch: pytest.MonkeyPatch) -> None:
    from pickaxe.dist import llm_engines

    monkeypatch.setattr(llm_engines, "BUCKET_BYTES", 8192)  # the tiny policy published in many buckets
    colocated = _fit(_cfg())
    separate = _fit(_cfg(placement="separate"))
    assert _strip(separate) == _strip(colocated)  # every metric but time/ and dist/, bit for bit
    assert all(r["rollout/staleness_max"] == 0 and r["check/logprob_diff_max"] < 1e-5 for r in separate)
    assert all(r["dist/weight_sync_mb"] > 0 and r["dist/worker_restarts"] == 0 for r in separate)
    assert "time/weight_sync_s" in separate[0] and "dist/weight_sync_mb" not in colocated[0]
    _assert_workers_gone(ray_local)


def test_sync_separate_workers_run_agent_episodes_as_colocated(ray_local) -> None:
    """Multi-turn agent episodes through engine workers: the rollout runs each turn on the workers, the tools here,
    and every number is the colocated run's."""
    cfg = LLM_RECIPES["calc-agent-grpo"].make()
    cfg.model = LMConfig(hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64, max_positions=192)
    cfg.warm_start = WarmStartConfig(updates=60, batch_size=16, lr=1e-2, log_every=30)  # long enough to open calls
    cfg.collector = TextCollectorConfig(prompts=2, group_size=4)
    cfg.engine.max_new_tokens = 24
    cfg.eval = LLMEvalConfig(prompts=4, samples=2, pass_k=2)
    cfg.trainer = TrainerConfig(total_steps=16, eval_every=16)
    cfg.device = "cpu"
    colocated = _fit(cfg)
    cfg.dist.placement = "separate"
    separate = _fit(cfg)
    assert _strip(separate) == _strip(colocated)
    assert all(r["rollout/agent/turns"] > 1 for r in separate if "rollout/agent/turns" in r)
    _assert_workers_gone(ray_local)


def _assert_workers_gone(ray: Any) -> None:
    """Every CPU of the test cluster is free again (the workers were stopped; 120 s is only a safety net)."""
    deadline = time.monotonic() + 120
    while ray.available_resources().get("CPU") != ray.cluster_resources().get("CPU"):
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.2)


def test_pipelined_staleness_is_exact_and_a_killed_worker_changes_no_number(pipelined, ray_local) -> None:
    _, history = pipelined
    # batch k is generated by version max(0, k - 2): behind the learner by 0, 1, then 2 at every update
    assert [r["rollout/staleness_max"] for r in history] == [0.0, 1.0, 2.0, 2.0, 2.0]
    assert [r["rollout/staleness_mean"] for r in history] == [0.0, 1.0, 2.0, 2.0, 2.0]
    assert [r["rollout/policy_version"] for r in history] == [0.0, 0.0, 0.0, 1.0, 2.0]
    assert history[-1]["check/logprob_diff_max"] > 1e-3  # the stale batches really are off-policy

    def kill(trainer: Any) -> None:  # after iteration 2, with batches 2 and 3 in flight (perhaps done)
        ray_local.kill(trainer.collector.engine.actors[0])  # batch 4, submitted next, is sure to find it dead

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no off-policy warning for batches stale by design
        disturbed = _fit(_cfg(placement="separate", mode="pipelined", max_staleness=2, workers=2), 2 * BATCH, kill)
    assert disturbed[-1]["dist/worker_restarts"] == 1.0
    assert _strip(disturbed) == _strip(history)  # a second run, with a worker replaced: the same numbers


def test_pipelined_workers_score_the_reference_as_the_learner_would(ray_local) -> None:
    """In pipelined mode the workers also score the reference log-probs (off the learner's path): the same values
    as the learner's own scoring of the batch, 0 off the loss mask."""
    trainer = build_llm_trainer(_cfg(placement="separate", mode="pipelined", max_staleness=1, workers=2))
    try:
        collector = trainer.collector
        own = collector.reference_logprobs
        calls = []
        collector.reference_logprobs = lambda *a: calls.append(a) or own(*a)  # type: ignore[method-assign]
        for _ in range(2):
            batch = collector.collect()
            assert not calls  # scored by the workers, not here
            learner = own(batch, collector.sampling.temperature or 1.0)
            torch.testing.assert_close(batch["ref_logprob"], learner, rtol=0, atol=1e-5)
            assert bool((batch["ref_logprob"][~batch["loss_mask"]] == 0).all())
            trainer.algo.update(batch)
    finally:
        collector.close()


@pytest.mark.slow  # a child process and three more workers: about 50 s on a busy 2-core machine
def test_pipelined_run_resumes_exactly_after_a_sigkill(pipelined, ray_local, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from pickaxe.train.build import resume

    reference, _ = pipelined
    cfg = _cfg(placement="separate", mode="pipelined", max_staleness=2, workers=2)
    cfg.dist.address = ray_local.get_runtime_context().gcs_address  # the child joins this Ray
    (tmp_path / "cfg.json").write_text(json.dumps(cfg.to_dict()))
    script = (
        "import json, sys; from pickaxe.train.build import config_from_dict, train; "
        "train(config_from_dict(json.load(open(sys.argv[1]))), run_dir=sys.argv[2])"
    )
    env = {**os.environ, "PICKAXE_FAULT": "iteration:3", "PYTHONPATH": os.pathsep.join([TESTS, *sys.path])}
    child = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "cfg.json"), str(tmp_path / "run")], env=env, timeout=300
    )
    assert child.returncode == -9  # killed after iteration 3; the newest checkpoint is at step 32
    resume(tmp_path / "run")
    assert read_metrics(tmp_path / "run", deterministic=True) == read_metrics(reference, deterministic=True)
    full, cut = load_file(str(reference / "model.safetensors")), load_file(str(tmp_path / "run" / "model.safetensors"))
    assert all(torch.equal(full[k], cut[k]) for k in full)


def test_async_grpo_with_staleness_1_learns_within_its_bound(ray_local, tmp_path: Path) -> None:
    cfg = _cfg(placement="separate", mode="async", max_staleness=1)
    cfg.data.reward = "test_dist_llm:digits"  # dense: learnable in a few updates
    cfg.collector = TextCollectorConfig(prompts=8, group_size=4)
    cfg.algo.lr = 1e-2
    cfg.trainer.total_steps, cfg.trainer.eval_every = 32 * 16, 0
    result, _ = train(cfg, run_dir=tmp_path / "a")
    assert all(r["rollout/staleness_max"] <= 1 and r["rollout/dropped_stale"] == 0 for r in result.history)
    reward = [r["rollout/reward_mean"] for r in result.history]
    assert sum(reward[-4:]) / 4 > sum(reward[:4]) / 4 + 0.3  # seeds 3, 4: 0.14 -> 0.70, 0.16 -> 0.72
    events = (tmp_path / "a" / "events.jsonl").read_text()
    assert "not reproducible" in events
    _assert_workers_gone(ray_local)  # train() let go of them


class _VersionEngine:
    """An in-process RequestEngine that tags completions with the version published when they were submitted."""

    def __init__(self) -> None:
        self.version = -1
        self.requests: dict[int, tuple[list[list[int]], int]] = {}

    def publish(self, policy: Any, version: int) -> None:
        self.version = version

    def submit(self, prompts: Sequence[Sequence[int]], params: SamplingParams, newest: bool = False) -> int:
        self.requests[len(self.requests)] = ([list(p) for p in prompts], self.version)
        return len(self.requests) - 1

    def result(self, ticket: int) -> list[Completion]:
        prompts, version = self.requests[ticket]
        return [Completion(i, [1], [0.0], True, version) for i in range(len(prompts))]

    def discard(self, ticket: int) -> None:
        pass


def _async_scheduler(learner: dict[str, int]) -> RolloutScheduler:
    """An async scheduler of 3 prompts at ``max_staleness`` 1 whose learner is at ``learner["version"]``."""
    tok = char_tokenizer()
    return RolloutScheduler(
        _VersionEngine(),  # type: ignore[arg-type]
        PromptEnv(Arithmetic(2), seed=0),
        lambda examples: encode_prompts(tok, examples),
        prompts=3,
        sampling=SamplingParams(n=1),
        policy=torch.nn.Linear(1, 1),
        version_fn=lambda: learner["version"],
        mode="async",
        max_staleness=1,
    )


def test_async_drops_and_regenerates_a_batch_behind_the_bound() -> None:
    learner = {"version": 0}
    scheduler = _async_scheduler(learner)
    _, _, done = scheduler.next_batch()
    assert scheduler.dropped == 0 and {c.version for c in done} == {0}
    queued = [ex.prompt for ex in scheduler.queue[0].examples]  # generated by version 0, in flight
    learner["version"] = 3  # the learner moved on by 3 versions: that batch is 3 behind, the bound is 1
    examples, _, done = scheduler.next_batch()
    assert scheduler.metrics() == {"rollout/dropped_stale": 1.0}
    assert [ex.prompt for ex in examples] == queued  # the same prompts, regenerated with the newest weights
    assert {c.version for c in done} == {3}


def _scheduler(env: PromptEnv, learner: dict[str, int], mode: str = "pipelined") -> RolloutScheduler:
    tok = char_tokenizer()
    return RolloutScheduler(
        _VersionEngine(),  # type: ignore[arg-type]
        env,
        lambda examples: encode_prompts(tok, examples),
        prompts=3,
        sampling=SamplingParams(n=1),
        policy=torch.nn.Linear(1, 1),
        version_fn=lambda: learner["version"],
        mode=mode,  # type: ignore[arg-type]
        max_staleness=2,
    )


def test_scheduler_state_holds_the_batches_in_flight_and_their_prompts() -> None:
    learner = {"version": 0}
    a = _scheduler(PromptEnv(Arithmetic(2), seed=0), learner)
    for version in range(2):
        learner["version"] = version
        a.next_batch()
    env_at_save = a.env.state_dict()
    state = copy.deepcopy(a.state_dict())  # batches 2 and 3 (versions 0 and 1) generated, not yet trained on
    assert len(state["batches"]) == 2 and a.env.state_dict() == env_at_save  # saving sampled nothing
    learner["version"] = 2
    want = a.next_batch()
    b = _scheduler(PromptEnv(Arithmetic(2), seed=99), learner)  # another prompt stream, replaced by the state
    b.load_state_dict(state)
    assert b.env.state_dict() == env_at_save
    got = b.next_batch()
    assert [ex.prompt for ex in got[0]] == [ex.prompt for ex in want[0]] and got[1] == want[1]
    assert [(c.token_ids, c.logprobs, c.version) for c in got[2]] == [(c.token_ids, c.logprobs, 0) for c in want[2]]


class FakeVLLM:
    """``VLLMEngine``'s constructor over an ``HFEngine`` that loads the model folder on CPU."""

    def __init__(self, model_path: str, eos_token_id: int, seed: int, gpu_memory_utilization: float, dtype: str):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_path)
        self.engine = HFEngine(model, eos_token_id, int(model.config.pad_token_id), seed=seed)
        self.version = 0
        self.loads: list[int] = []

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        assert set(state) == set(self.engine.model.state_dict())  # vLLM gets every tensor, not the trainable ones
        self.engine.model.load_state_dict(state)
        self.version = version

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        return self.engine.generate(prompts, params)

    def state_dict(self) -> dict[str, Any]:
        return self.engine.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state)


def test_vllm_engine_workers_wiring_with_a_fake_engine_class(ray_local, tmp_path: Path) -> None:
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the fake travels to the worker by value
    tok = char_tokenizer()
    model = tiny_lm(len(tok), hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64, seed=1,
                    pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    model.save_pretrained(tmp_path / "m")
    twin = copy.deepcopy(model)  # the local engines' copy, given the same weights as each published version
    local = [HFEngine(twin, tok.eos_token_id, tok.pad_token_id, seed=7 + i) for i in range(2)]  # worker i: seed + i
    cfg = _cfg(placement="separate", workers=2)
    cfg.engine.name, cfg.model.path = "vllm", str(tmp_path / "m")
    group = build_engine_group(cfg, model, tok, seed=7, run=None, vllm_class=FakeVLLM)
    try:
        prompts = [encode_prompts(tok, PromptEnv(Arithmetic(2), seed=0).sample(1))[0] for _ in range(2)]
        params = SamplingParams(max_new_tokens=4, n=2)
        for version in (0, 1):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.05 * version)
            group.publish(model, version)
            twin.load_state_dict(model.state_dict())
            got = group.generate(prompts, params)  # one prompt to each worker
            want = [c for i, p in enumerate(prompts) for c in local[i].generate([p], params)]
            assert [c.token_ids for c in got] == [c.token_ids for c in want]
            assert [c.prompt_index for c in got] == [0, 0, 1, 1] and {c.version for c in got} == {version}
    finally:
        group.close()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def test_workers_that_do_not_fit_on_this_machine_fail_in_one_line(ray_local) -> None:
    from pickaxe.dist.engine_worker import HFEngineFactory
    from pickaxe.dist.llm_engines import EngineGroup
    from pickaxe.errors import PickaxeError

    tok = char_tokenizer()
    with pytest.raises(PickaxeError, match=r"5 engine workers x --dist.worker-cpus 1 need 5 CPUs, Ray on this machine"):
        EngineGroup(torch.nn.Linear(1, 1), HFEngineFactory(tok.eos_token_id, tok.pad_token_id), workers=5)


def test_bad_dist_flag_combinations_fail_in_one_line() -> None:
    """Checked with the config (``cfg.check``, before any run folder exists), for every kind of LLM run."""
    cfg = _cfg(placement="separate", workers=8)
    with pytest.raises(ConfigError, match=r"--dist.workers 8 is more than --collector.prompts 4"):
        cfg.check()
    cfg = _cfg(placement="separate")
    cfg.engine.name = "vllm"
    with pytest.raises(ConfigError, match=r"needs a GPU each: add --dist.worker-gpus 1"):
        cfg.check()
    for recipe, name in (("arith-sft", "SFTConfig"), ("synthetic-dpo", "DPOConfig"), ("synthetic-rm", "RewardModel")):
        cfg = LLM_RECIPES[recipe].make()
        cfg.dist.placement = "separate"
        with pytest.raises(ConfigError, match=rf"{name}\w* has no rollouts: drop --dist.placement"):
            cfg.check()
    cfg = LLM_RECIPES["synthetic-bon"].make()
    cfg.dist.learners = 2
    with pytest.raises(ConfigError, match=r"BestOfNConfig does not split its update among learners"):
        cfg.check()
    for recipe in ("synthetic-dpo", "synthetic-rm"):  # pair learners split their updates
        cfg = LLM_RECIPES[recipe].make()
        cfg.dist.learners = 2
        cfg.check()


class _RecordingEngine:
    """A worker's engine that records the weights loaded into it and its sampler state."""

    def __init__(self, model: Any, seed: int, device: str) -> None:
        self.loads: list[tuple[str, int]] = []
        self.sampler = {"seed": seed}

    def load_weights(self, state: dict[str, Any], version: int) -> None:
        self.loads.append((state["name"], version))

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        return [Completion(i, [1], [0.0], True) for i in range(len(prompts))]

    def state_dict(self) -> dict[str, Any]:
        return dict(self.sampler)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler = dict(state)


def test_an_engine_worker_reloads_its_weights_after_a_state_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker loads a version's weights only when it holds another version, but after ``load_state`` (a
    rollback: a version number may now name new weights) the next request loads them whatever it held. Run in
    process, with ``ray.get`` the identity."""
    from types import SimpleNamespace

    from pickaxe.dist import engine_worker, runtime

    monkeypatch.setattr(runtime, "import_ray", lambda: SimpleNamespace(get=lambda ref: ref))
    worker = engine_worker.EngineWorker(None, _RecordingEngine, seed=7, torch_threads=1, device="cpu")
    params = SamplingParams(n=1)
    completions, version, state = worker.generate([[1, 2]], params, 3, [{"name": "v3"}])
    assert version == 3 and [c.version for c in completions] == [3] and state == {"seed": 7}
    worker.generate([[1, 2]], params, 3, [{"name": "v3"}])
    assert worker.engine.loads == [("v3", 3)]  # the same version again: no reload
    worker.load_state({"seed": 11})
    assert worker.state() == {"seed": 11}
    worker.generate([[1, 2]], params, 3, [{"name": "v3 after the rollback"}])
    assert worker.engine.loads == [("v3", 3), ("v3 after the rollback", 3)]
    worker.generate([[1, 2]], params, 4, [{"name": "v4"}])
    assert worker.engine.loads[-1] == ("v4", 4)


def test_weights_are_published_and_loaded_bucket_by_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    """A publish puts consecutive buckets of at most ``BUCKET_BYTES`` (a larger tensor alone, every name once, in
    order); a worker loads every bucket of a version it does not hold."""
    from types import SimpleNamespace

    from pickaxe.dist import engine_worker, runtime
    from pickaxe.dist.llm_engines import weight_buckets

    state = {"a": torch.zeros(10), "b": torch.zeros(10), "big": torch.zeros(100), "c": torch.zeros(5)}
    assert weight_buckets(state, limit=80) == [["a", "b"], ["big"], ["c"]]
    assert weight_buckets(state) == [["a", "b", "big", "c"]]
    monkeypatch.setattr(runtime, "import_ray", lambda: SimpleNamespace(get=lambda ref: ref))
    worker = engine_worker.EngineWorker(None, _RecordingEngine, seed=7, torch_threads=1, device="cpu")
    worker.generate([[1, 2]], SamplingParams(n=1), 2, [{"name": "part 1"}, {"name": "part 2"}])
    assert worker.engine.loads == [("part 1", 2), ("part 2", 2)]


@pytest.mark.parametrize("behind, dropped", [(1, 0), (2, 1)])
def test_async_keeps_a_batch_exactly_at_the_staleness_bound(behind: int, dropped: int) -> None:
    """max_staleness 1: a batch 1 version behind the learner is trained on; 2 behind, it is regenerated."""
    learner = {"version": 0}
    scheduler = _async_scheduler(learner)
    scheduler.next_batch()
    learner["version"] = behind
    _, _, done = scheduler.next_batch()
    assert scheduler.metrics() == {"rollout/dropped_stale": float(dropped)}
    assert {c.version for c in done} == {0 if dropped == 0 else behind}


def test_pipelined_batch_k_is_generated_by_version_k_minus_the_staleness() -> None:
    """max_staleness 2, one update per batch: batches 0..5 come from versions 0, 0, 0, 1, 2, 3, and exactly two
    batches are in flight after each collect."""
    learner = {"version": 0}
    scheduler = _scheduler(PromptEnv(Arithmetic(2), seed=0), learner)
    versions = []
    for k in range(6):
        learner["version"] = k
        _, _, done = scheduler.next_batch()
        versions.append({c.version for c in done})
        assert len(scheduler.queue) == 2
    assert versions == [{0}, {0}, {0}, {1}, {2}, {3}]


@pytest.mark.parametrize("mode", ["pipelined", "async"])
def test_only_async_lets_workers_take_newer_weights(mode: str) -> None:
    """Pipelined batches are generated by exactly the version they were submitted with (reproducible); only async
    requests let a worker use newer weights it finds published."""
    engine = _VersionEngine()
    flags: list[bool] = []
    submit = engine.submit
    engine.submit = lambda prompts, params, newest=False: flags.append(newest) or submit(prompts, params, newest)
    learner = {"version": 0}
    scheduler = _scheduler(PromptEnv(Arithmetic(2), seed=0), learner, mode)
    scheduler.engine = engine
    for version in range(3):
        learner["version"] = version
        scheduler.next_batch()
    assert flags and set(flags) == {mode == "async"}
