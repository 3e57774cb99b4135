"""LLM training: ``build_llm_trainer`` and its parts (the held-out evaluator is ``train.text_eval``).

``build_llm_trainer`` builds tokenizer, model, ``PromptEnv``, engine, collector and algorithm (SFT or GRPO) from
one config, runs the optional SFT warm start (logged under ``warm_start/``), evaluates the starting policy on
held-out prompts (logged at step 0) and returns a ``Trainer`` whose summary shows held-out accuracy before and
after with 95% Wilson intervals. ``pickaxe.train.build.train(cfg)`` finds it through the config's ``KIND``.
"""

from __future__ import annotations

import contextlib
import copy
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from torch import nn

from pickaxe.algos.base import Algorithm
from pickaxe.algos.configs import GRPOConfig, LLMPPOConfig, LMConfig, SFTConfig
from pickaxe.algos.grpo import GRPO
from pickaxe.algos.llm_ppo import LLMPPO
from pickaxe.algos.sft import SFT
from pickaxe.envs.agents.sandbox import SandboxLimits
from pickaxe.envs.agents.tool_env import DEMOS, ToolEnv
from pickaxe.envs.agents.tools import make_tools, python_tools
from pickaxe.envs.text.example import Example
from pickaxe.envs.text.prompt_env import PromptEnv, load_examples
from pickaxe.envs.text.rewards import parse_reward_spec, python_rewards
from pickaxe.envs.text.synthetic_preferences import GOLD_SCORES
from pickaxe.envs.text.tasks import make_task
from pickaxe.errors import ConfigError
from pickaxe.models.export import export_model
from pickaxe.models.lm import load_lm, no_progress_bars, num_parameters, tiny_lm
from pickaxe.models.lora import apply_lora_config, is_lora, merge_lora, shared_reference
from pickaxe.models.reward import RewardModel
from pickaxe.models.sharding import is_meta
from pickaxe.models.tokenizer import char_tokenizer, load_tokenizer
from pickaxe.models.value import ValueModel
from pickaxe.rollout.agent import AgentDemoCollector, AgentRollout
from pickaxe.rollout.engines.base import Engine, SamplingParams
from pickaxe.rollout.engines.hf import HFEngine
from pickaxe.rollout.pairs import RewardModelScorer
from pickaxe.rollout.text_collector import DemoCollector, TextCollector, encode_prompts
from pickaxe.runs.checkpoint import has_checkpoint
from pickaxe.runs.model import load_collector_state, load_model, weights_source
from pickaxe.runs.run import Run
from pickaxe.train.inputs import check_inputs, verify_inputs
from pickaxe.train.llm_config import LLMTrainConfig
from pickaxe.train.runtime import settle_for_training
from pickaxe.train.text_eval import TextEvaluator
from pickaxe.train.trainer import FitResult, Trainer
from pickaxe.utils import resolve_device, seed_everything, set_torch_threads

# ---------------------------------------------------------------------------------------------- building


def derive_llm_seeds(seed: int) -> dict[str, int]:
    """Independent seeds for model init, training prompts, held-out prompts, sampling, warm start, eval."""
    names = ("model", "env", "eval_env", "engine", "warm_start", "eval", "algo")
    values = np.random.SeedSequence(seed).generate_state(len(names))
    return {name: int(v) for name, v in zip(names, values, strict=True)}


def build_model(cfg: LLMTrainConfig, device: torch.device, seed: int) -> tuple[nn.Module, Any]:
    """The tokenizer and causal LM of ``cfg.model``; on the ``meta`` device its shapes only (no memory, no weights
    read: what a sharded learner other than rank 0 builds, see :func:`builds_on_meta`)."""
    m = cfg.model
    on_meta = torch.device("meta") if device.type == "meta" else contextlib.nullcontext()  # LoRA's adapters too
    if m.path:
        tokenizer = load_tokenizer(m.path)
        model = load_lm(m.path, device, m.dtype)
        with on_meta:
            return apply_lora_config(model, m.lora, seed), tokenizer
    tokenizer = char_tokenizer(model_max_length=m.max_positions)
    shape = m.tiny_shape()  # the named shape's own fields, even when ``shape`` was set after the config was made
    with on_meta:
        return _tiny_model(cfg, tokenizer, shape, device, seed), tokenizer


def _tiny_model(cfg: LLMTrainConfig, tokenizer: Any, shape: Any, device: torch.device, seed: int) -> nn.Module:
    """:func:`build_model`'s random-weight model of ``cfg.model`` (its named or given shape), LoRA included."""
    m = cfg.model
    model = tiny_lm(
        shape.vocab if m.shape else len(tokenizer),
        arch=shape.arch,
        hidden=shape.hidden,
        layers=shape.layers,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        intermediate=shape.intermediate,
        max_positions=m.max_positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        seed=seed,
        tied=shape.tied,
    )
    if m.dtype not in ("auto", "float32"):
        model = model.to(getattr(torch, m.dtype))
    return apply_lora_config(model.to(device), m.lora, seed)


def load_run_lm(
    cfg: LLMTrainConfig, run_dir: str | Path, device: str, checkpoint: str | int = "final"
) -> tuple[nn.Module, Any]:
    """An LLM run's model rebuilt from its config with the weights of ``checkpoint`` loaded (verified; see
    ``pickaxe.runs.model.load_model``) on ``device`` (``cpu``, ``cuda``, ``cuda:N`` or ``auto``; a malformed one is a
    one-line ``ConfigError``), and its tokenizer. What export, the playground and the arena load. The run's starting
    model (``model.path``: its architecture and tokenizer) is checked against its export's digests first."""
    try:
        dev = resolve_device(device)
    except RuntimeError:  # torch's error for a malformed device string
        raise ConfigError(f"--device {device!r} is not a device; use cpu, cuda, cuda:N or auto") from None
    verify_inputs(cfg, options=("model.path",))
    model, tokenizer = build_model(cfg, dev, derive_llm_seeds(cfg.seed)["model"])
    load_model(run_dir, {"policy": model}, dev, checkpoint=checkpoint)
    return model, tokenizer


def build_critic(cfg: LLMTrainConfig, model: nn.Module, device: torch.device) -> ValueModel:
    """PPO's critic: from the reward model (``data.reward_model``) when there is one, as InstructGPT does, else
    from the policy's decoder with a zero head. For a policy on the ``meta`` device (a sharded learner other than
    rank 0) the critic's shapes only, on it too: sharding fills them with rank 0's weights."""
    meta = is_meta(model)
    with torch.device("meta") if meta else contextlib.nullcontext():
        if cfg.data.reward_model:
            reward_model = RewardModel.load(cfg.data.reward_model, "meta" if meta else device)
            return ValueModel.from_reward_model(reward_model).train()
        critic = ValueModel.from_lm(merge_lora(model))
    return critic if meta else critic.to(device)


def ptx_source(cfg: LLMTrainConfig, tokenizer: Any, device: torch.device) -> DemoCollector | None:
    """PPO-ptx's demonstrations (``algo.ptx_coef`` > 0): reference answers of the task's training prompts, drawn
    from their own stream, ``warm_start.batch_size`` a step."""
    if not isinstance(cfg.algo, LLMPPOConfig) or cfg.algo.ptx_coef == 0:
        return None
    seed = derive_llm_seeds(cfg.seed)["warm_start"] + 1
    demos = build_env(cfg, seed, derive_llm_seeds(cfg.seed)["eval_env"])
    return DemoCollector(demos, tokenizer, cfg.warm_start.batch_size, device=device)


def frozen_reference(model: nn.Module) -> nn.Module:
    """The KL reference: a frozen copy of ``model`` as it is now, or for a LoRA policy the policy itself with its
    adapters switched off (exact, and no second copy of the weights)."""
    if is_lora(model):
        return shared_reference(model)
    return copy.deepcopy(model).eval().requires_grad_(False)


def load_reward_model(
    path: str, tokenizer: Any, device: torch.device, offload: bool = False, on_meta: bool = False
) -> RewardModelScorer:
    """The reward model saved in folder ``path`` as a batched reward, with the folder's tokenizer when it has one
    (else the policy's, which must then be the reward model's); with ``offload`` loaded into host memory, visiting
    ``device`` only while it scores; ``on_meta``: its shapes only, the weights not read (a sharded learner other
    than rank 0, which gets its rows from rank 0's when the model is sharded)."""
    model = RewardModel.load(path, "meta" if on_meta else torch.device("cpu") if offload else device)
    has_tokenizer = any((Path(path) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
    return RewardModelScorer(
        model, load_tokenizer(path) if has_tokenizer else tokenizer, offload_to=device if offload else None
    )


def build_env(
    cfg: LLMTrainConfig, seed: int, eval_seed: int, tokenizer: Any = None, device: torch.device | None = None
) -> PromptEnv:
    """The ``PromptEnv`` of ``cfg.data`` (a prompt file) or else ``cfg.task``.

    Rewards: ``data.reward`` (a spec, see :func:`~pickaxe.envs.text.rewards.parse_reward_spec`; a task's own check
    is the name ``verify``, Python rewards (``data.python_rewards``) their names), by default the file's exact match
    or the task's check. With ``data.reward_model`` the reward model, named ``proxy``, is the training reward and
    the rest are logged only (weight 0); ``data.gold`` adds logged-only terms (one term is named ``gold``). The first
    reward stays the correctness check."""
    d = cfg.data
    source: Any
    eval_examples = None
    python = python_rewards(d.python_rewards)  # before the data: a missing one is the first error
    if d.path:
        source = load_examples(d.path, d.prompt_key, d.answer_key)
        eval_examples = load_examples(d.eval_path, d.prompt_key, d.answer_key) if d.eval_path else None
        named: dict[str, Any] = {}
    else:
        t = cfg.task
        source = make_task(t.name, t.digits, t.min_len, t.max_len, t.heldout_fraction)
        named = {"verify": source.verify}
    spec = d.reward or ("verify" if "verify" in named else "exact")
    rewards: list[tuple[str, Any, float]] = parse_reward_spec(spec, {**named, **python})
    # without a tokenizer: a prompt stream (warm start, ptx); a learner other than rank 0 scores rollouts only with
    # its shard of a sharded reward model, when rank 0 asks
    if d.reward_model and tokenizer is not None and (sharded_reward_model(cfg) or not _follows(cfg)):
        proxy = load_reward_model(d.reward_model, tokenizer, device or torch.device("cpu"),
                                  offload=cfg.collector.offload_reward_model, on_meta=builds_on_meta(cfg))  # fmt: skip
        rewards = [(name, fn, 0.0) for name, fn, _ in rewards] + [("proxy", proxy, d.reward_model_weight)]
    if d.gold:
        gold = parse_reward_spec(d.gold, {**GOLD_SCORES, **python})
        rewards += [("gold" if len(gold) == 1 else name, fn, 0.0) for name, fn, _ in gold]
    return PromptEnv(source, rewards, eval_examples, seed=seed, eval_size=cfg.eval.prompts, eval_seed=eval_seed)


def build_tool_env(cfg: LLMTrainConfig, prompts: PromptEnv) -> ToolEnv:
    """The ``ToolEnv`` of ``cfg.agent`` around ``prompts``: its tools (the python one sandboxed with the
    ``agent.python_*`` limits; the user's own by name, ``agent.python_tools``), turn and token limits, per-episode
    reward weights and demonstrations."""
    a = cfg.agent
    limits = SandboxLimits(cpu_s=a.python_cpu_s, memory_mb=a.python_memory_mb, wall_s=a.python_wall_s,
                           output_chars=a.output_chars)  # fmt: skip
    tools = make_tools(a.tools, a.corpus, limits, a.tool_workers, python_tools(a.python_tools))
    demo = DEMOS.get(a.demo)
    return ToolEnv(prompts, tools, system_prompt=a.system_prompt, max_turns=a.max_turns, max_tokens=a.max_tokens,
                   format_weight=a.format_weight, turn_cost=a.turn_cost, demo=demo,
                   describe_tools=a.describe_tools)  # fmt: skip


def agent_rollouts(
    cfg: LLMTrainConfig, env: PromptEnv, engines: Sequence[Engine], tokenizer: Any
) -> tuple[Any, list[Any], Callable[[Sequence[Example]], list[list[int]]] | None]:
    """With ``cfg.agent`` on: the ``ToolEnv`` around ``env``, each engine wrapped in one ``AgentRollout`` (an engine
    listed twice gets the same wrapper) and the encoder of the episodes' first prompts. Off: ``env``, the engines
    and None."""
    if not cfg.agent.enabled:
        return env, list(engines), None
    tool_env = build_tool_env(cfg, env)
    wrapped: dict[int, AgentRollout] = {}
    for e in engines:
        if id(e) not in wrapped:
            wrapped[id(e)] = AgentRollout(e, tool_env, tokenizer)
    rollouts = [wrapped[id(e)] for e in engines]
    return tool_env, rollouts, rollouts[0].encode


def agent_sampling(cfg: LLMTrainConfig, sampling: SamplingParams) -> SamplingParams:
    """The sampling params an algorithm is built with: with tools, the trajectory budget ``agent.max_tokens`` is the
    length normaliser in place of one turn's ``max_new_tokens``."""
    return replace(sampling, max_new_tokens=cfg.agent.max_tokens) if cfg.agent.enabled else sampling


def build_engine(cfg: LLMTrainConfig, model: nn.Module, tokenizer: Any, seed: int, run: Run | None) -> Engine:
    """The rollout engine of ``cfg.engine`` (``hf`` shares the learner's model: no copy, no sync cost)."""
    e = cfg.engine
    if e.name == "hf":
        return HFEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, e.max_batch, seed)
    from pickaxe.rollout.engines.vllm import VLLMEngine

    path = vllm_model_path(cfg, model, tokenizer, run)
    return VLLMEngine(path, tokenizer.eos_token_id, seed, e.gpu_memory_utilization, cfg.model.dtype)


def vllm_model_path(cfg: LLMTrainConfig, model: nn.Module, tokenizer: Any, run: Run | None) -> str:
    """The folder vLLM loads the policy from: ``model.path``, or for a tiny model the model saved next to the run."""
    if cfg.model.path is not None:
        return cfg.model.path
    if run is None:
        raise ConfigError("the vllm engine with a tiny model needs a run directory to save the model into")
    path = str(run.path / "engine_model")
    with no_progress_bars():
        model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_engine_group(
    cfg: LLMTrainConfig,
    model: nn.Module,
    tokenizer: Any,
    seed: int,
    run: Run | None,
    vllm_class: Any = None,
) -> Any:
    """``cfg.dist.workers`` engine workers (Ray actors, see :class:`~pickaxe.dist.llm_engines.EngineGroup`) for
    ``--dist.placement separate``: an ``HFEngine`` on its own copy of the policy each (worker ``i`` seeded
    ``seed + i``), or with ``--engine.name vllm`` a ``VLLMEngine`` built inside each worker from the model folder,
    sent the full (LoRA-merged) weights of every version. ``vllm_class`` replaces ``VLLMEngine`` in the workers
    (tests: a fake with its constructor, on CPU; the real one has not run in a worker yet)."""
    from pickaxe.dist.engine_worker import HFEngineFactory, VLLMEngineFactory
    from pickaxe.dist.llm_engines import EngineGroup, full_weights, trainable_weights

    d, e = cfg.dist, cfg.engine
    factory: Any = HFEngineFactory(tokenizer.eos_token_id, tokenizer.pad_token_id, e.max_batch)
    weights = trainable_weights
    if e.name == "vllm":
        path = vllm_model_path(cfg, model, tokenizer, run)
        factory = VLLMEngineFactory(path, tokenizer.eos_token_id, e.gpu_memory_utilization, cfg.model.dtype, vllm_class)
        weights = full_weights
    on_event = (lambda message: run.event(message)) if run is not None else None
    return EngineGroup(
        model,
        factory,
        workers=d.workers,
        seed=seed,
        torch_threads=cfg.torch_threads,
        worker_cpus=d.worker_cpus,
        worker_gpus=d.worker_gpus,
        address=d.address,
        weights=weights,
        async_board=d.mode == "async",
        on_event=on_event,
    )


def warm_start(
    cfg: LLMTrainConfig, model: nn.Module, tokenizer: Any, seed: int, run: Run | None, progress: bool
) -> dict[str, float]:
    """SFT for ``cfg.warm_start.updates`` updates on the task's reference answers, or fewer once the windowed
    token NLL reaches ``cfg.warm_start.target_nll``; records under ``warm_start/`` (logged at step 0). Uses its
    own prompt stream, so the RL prompts do not depend on it."""
    w = cfg.warm_start
    env = build_env(cfg, seed, seed)  # its own prompt stream; its held-out set is unused
    device = next(model.parameters()).device
    if cfg.agent.enabled:  # demonstration episodes, laid out as the agent's rollouts are
        collector: DemoCollector = AgentDemoCollector(build_tool_env(cfg, env), tokenizer, w.batch_size, device=device)
    else:
        collector = DemoCollector(env, tokenizer, w.batch_size, device=device)
    # the run's compute options (layout, checkpointing, autocast, chunks) apply to the warm start too
    a = cfg.algo if isinstance(cfg.algo, LMConfig) else SFTConfig()
    compute = {
        "micro_batch_layout": a.micro_batch_layout,
        "gradient_checkpointing": a.gradient_checkpointing,
        "autocast": a.autocast,
        "logprob_chunk_tokens": a.logprob_chunk_tokens,
    }
    sft = SFT(model, SFTConfig(lr=w.lr, lr_schedule=w.lr_schedule, micro_batch_size=w.batch_size, **compute))
    start, last = time.perf_counter(), {}
    window: list[float] = []
    reached = False
    for i in range(w.updates):
        sft.set_progress(i, w.updates)
        last = sft.update(collector.collect())
        window = [*window[-(w.NLL_WINDOW - 1) :], last["sft/token_nll"]]
        reached = w.target_nll is not None and len(window) == w.NLL_WINDOW and sum(window) / len(window) <= w.target_nll
        if (i + 1) % w.log_every == 0 or i + 1 == w.updates or reached:
            record = {f"warm_start/{k.split('/')[-1]}": v for k, v in last.items()}
            record.update({"warm_start/update": float(i + 1), "time/warm_start_s": time.perf_counter() - start})
            record["warm_start/window_nll"] = sum(window) / len(window)
            if run is not None:
                run.log(record, 0)
                run.report_progress(warm_start_update=i + 1, warm_start_updates=w.updates)
            if progress:
                Console().print(f"warm start (SFT) {i + 1}/{w.updates}: token NLL {last['sft/token_nll']:.3f}")
        if reached:
            if progress:
                Console().print(f"warm start reached token NLL {w.target_nll} after {i + 1} updates")
            break
    if w.target_nll is not None and w.updates > 0 and not reached:
        warnings.warn(
            f"warm start: token NLL {sum(window) / len(window):.3f} after {w.updates} updates has not reached "
            f"warm_start.target_nll {w.target_nll}; the model may still be before SFT's fast phase, where GRPO "
            "gains little: raise --warm-start.updates",
            RuntimeWarning,
            stacklevel=2,
        )
    if isinstance(collector, AgentDemoCollector):
        collector.env.close()
    return {"warm_start/wall_s": time.perf_counter() - start, "warm_start/updates": float(sft.version), **last}


class LLMTrainer(Trainer):
    """The ``Trainer`` with an LLM summary (held-out accuracy with 95% CIs before and after training) and, given
    ``export_model`` (a model and its tokenizer), an export to ``RUN_DIR/export`` once the run has finished, which
    the next stage of a pipeline loads by path."""

    before: dict[str, float] | None = None
    export_model: tuple[nn.Module, Any] | None = None

    @classmethod
    def assemble(
        cls,
        cfg: LLMTrainConfig,
        algo: Algorithm,
        collector: Any,
        evaluator: Any,
        run: Run | None,
        progress: bool,
        resuming: bool,
        export: tuple[nn.Module, Any],
    ) -> LLMTrainer:
        """The Trainer of an LLM run: ``export`` (a model and its tokenizer) is written to ``RUN_DIR/export`` when the
        run finishes, and a fresh run evaluates its starting point first (``eval.before``, logged at step 0)."""
        trainer = cls(algo, collector, run=run, config=cfg.trainer, progress=progress,
                      torch_threads=cfg.torch_threads, evaluator=evaluator, select=cfg.select,
                      alarms=cfg.alarms)  # fmt: skip
        trainer.export_model = export
        if cfg.eval.before and not resuming:
            if run is not None:
                run.set_phase("evaluating")
            trainer.log_before(evaluator(algo))
        return trainer

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """``Trainer.load_state_dict``, with the KL reference's weights taken from where they were saved: the
        algorithm's state when its learners kept it sharded, the collector's otherwise (a run resumed with another
        ``--shard`` or learner count finds them in the other place)."""
        super().load_state_dict(place_reference(state, getattr(self.algo, "reference", None) is not None))

    def log_before(self, record: dict[str, float]) -> None:
        """Record the evaluation of the starting point (logged at step 0, its policy kept, shown in the summary)."""
        self.before = record
        logged = {**record, "eval/phase_before": 1.0}
        logged.update(self.observe_alarms(logged))
        if self.run is not None:
            self.run.log(logged, 0)
        self.keep_evaluated(logged)
        if self.progress and "eval/accuracy_ci_low" in record:
            Console().print(
                f"held-out accuracy before training: {record['eval/accuracy']:.3f} "
                f"[{record['eval/accuracy_ci_low']:.3f}, {record['eval/accuracy_ci_high']:.3f}]"
            )

    def finalize(self) -> None:
        """Export the model (when configured) to ``RUN_DIR/export`` before the run reads finished: a run whose export
        failed (a full disk) is crashed, and ``pickaxe resume`` exports again."""
        if self.export_model is None or self.run is None:
            return
        self.run.set_phase("exporting")
        model, tokenizer = self.export_model
        source = weights_source(self.run.path, self.run.config(), "final")  # what `pickaxe export` records
        out = export_model(model, tokenizer, self.run.path / "export", source, overwrite=True)
        if self.progress:
            Console().print(f"exported to {out}")

    def fit(self, total_steps: int | None = None) -> FitResult:
        """Train, export (when configured, see :meth:`finalize`) and, with progress on, print held-out accuracy
        before and after."""
        result = super().fit(total_steps)
        if self.progress:
            print_llm_summary(self.before, result)
        return result


def _final_eval(result: FitResult) -> dict[str, float] | None:
    for record in reversed(result.history):
        if "eval/accuracy" in record:
            return record
    return None


def print_llm_summary(before: dict[str, float] | None, result: FitResult) -> None:
    """A table of held-out accuracy (95% Wilson CI), pass@k and mean reward, before and after."""
    after = _final_eval(result)
    table = Table(title="pickaxe: held-out evaluation")
    table.add_column("")
    table.add_column("accuracy (greedy) [95% CI]")
    table.add_column("pass@k (sampled)")
    table.add_column("mean reward")
    for name, rec in (("before", before), ("after", after)):
        if rec is None:
            continue
        passes = ", ".join(
            f"{k.split('/')[1]}={v:.3f}" + (f" [{rec[k + '_ci_low']:.3f}, {rec[k + '_ci_high']:.3f}]"
                                            if k + "_ci_low" in rec else "")
            for k, v in rec.items()
            if k.startswith("eval/pass@") and not k.endswith(("_ci_low", "_ci_high"))
        )  # fmt: skip
        table.add_row(
            name,
            f"{rec['eval/accuracy']:.3f} [{rec['eval/accuracy_ci_low']:.3f}, {rec['eval/accuracy_ci_high']:.3f}]",
            passes or "-",
            f"{rec['eval/return_mean']:.3f}",
        )
    Console().print(table)


def start_policy(
    cfg: LLMTrainConfig, run: Run | None, progress: bool
) -> tuple[nn.Module, Any, dict[str, int], torch.device, bool]:
    """What every LLM run starts with: torch threads, seeds, device, the policy and its tokenizer, warm-started with
    SFT on a fresh run. Returns ``(model, tokenizer, seeds, device, resuming)``; a resumed run (one with
    checkpoints) gets its weights from the checkpoint, so it skips the warm start. Input files are checked first,
    before any model is loaded: exports and generated preference files against their recorded digests, and on a
    resume against the ones the run started with (:func:`~pickaxe.train.inputs.check_inputs`)."""
    set_torch_threads(cfg.torch_threads)
    seed_everything(cfg.seed)
    seeds = derive_llm_seeds(cfg.seed)
    device = resolve_device(cfg.device)
    resuming = run is not None and has_checkpoint(run.path)
    check_inputs(cfg, run, resuming)  # before any model is loaded: a damaged export is one line, not a traceback
    model, tokenizer = build_model(cfg, torch.device("meta") if builds_on_meta(cfg) else device, seeds["model"])
    if progress:
        Console().print(f"model: {type(model).__name__}, {num_parameters(model):,} parameters on {device}")
    if cfg.warm_start.updates > 0 and not resuming:
        if run is not None:
            run.set_phase("warm_start")
        warm_start(cfg, model, tokenizer, seeds["warm_start"], run, progress)
    return model, tokenizer, seeds, device, resuming


def builds_on_meta(cfg: LLMTrainConfig) -> bool:
    """Whether this process builds its models on the ``meta`` device (shapes, no memory, no weights read): a
    sharded learner other than rank 0 (``--dist.shard fsdp``), whose policy, critic and sharded frozen models get
    their rows from rank 0's whole ones when the launcher shards them, so it never holds a whole model."""
    return cfg.dist.shard == "fsdp" and _follows(cfg)


def build_llm_trainer(cfg: LLMTrainConfig, run: Run | None = None, progress: bool = False) -> LLMTrainer:
    """Seed everything; build tokenizer, model, env, engine, collector and algorithm; warm-start with SFT if
    configured; evaluate the starting point (logged at step 0); return the Trainer.

    With ``--dist.placement separate`` the rollouts come from engine workers (:func:`build_engine_group`) and, in
    pipelined and async mode, run ahead of
    the learner through a :class:`~pickaxe.rollout.pipelined.RolloutScheduler`; held-out evaluation stays in this
    process on the learner's module (an ``HFEngine`` sharing it), so its numbers are colocated's."""
    model, tokenizer, seeds, device, resuming = start_policy(cfg, run, progress)
    env = build_env(cfg, seeds["env"], seeds["eval_env"], tokenizer, device)
    separate = cfg.dist.placement == "separate" and isinstance(cfg.algo, GRPOConfig | LLMPPOConfig)
    if separate:
        engine: Any = HFEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, cfg.engine.max_batch,
                               seeds["engine"])  # fmt: skip
        rollout_engine = build_engine_group(cfg, model, tokenizer, seeds["engine"], run)
    else:
        engine = rollout_engine = build_engine(cfg, model, tokenizer, seeds["engine"], run)
    e = cfg.engine
    sampling = SamplingParams(e.max_new_tokens, e.temperature, e.top_k, e.top_p, n=cfg.collector.group_size)
    env, (engine, rollout_engine), encode = agent_rollouts(cfg, env, (engine, rollout_engine), tokenizer)
    reference = None
    scorer: Any = None  # what the evaluator scores the KL reference with
    if isinstance(cfg.algo, SFTConfig):
        algo: Algorithm = SFT(model, cfg.algo)
        collector: Any = DemoCollector(env, tokenizer, cfg.collector.prompts, device=device)
    elif isinstance(cfg.algo, GRPOConfig | LLMPPOConfig):
        # frozen copy of the starting (warm-started) policy; unsharded, a learner other than rank 0 never collects:
        # none; sharded, every learner keeps its shard of it in the algorithm, which scores it (the collector not)
        sharded_reference = sharded_kl_reference(cfg, model)
        if cfg.algo.kl_coef > 0 and (sharded_reference or not _follows(cfg)):
            reference = scorer = frozen_reference(model)
        kept = reference if sharded_reference else None
        if isinstance(cfg.algo, GRPOConfig):
            algo = GRPO(model, cfg.algo, agent_sampling(cfg, sampling), seed=seeds["algo"], reference=kept)
        else:
            algo = LLMPPO(model, build_critic(cfg, model, device), cfg.algo, agent_sampling(cfg, sampling),
                          ptx_source(cfg, tokenizer, device), seed=seeds["algo"], reference=kept)  # fmt: skip
        if sharded_reference:
            scorer, reference = reference_scorer(algo), None
        learner = algo
        scheduler = None
        if separate and cfg.dist.mode != "sync":
            from pickaxe.rollout.pipelined import RolloutScheduler

            algo.allowed_lag = cfg.dist.max_staleness  # stale by design: the on-policy check is quiet for these

            scheduler = RolloutScheduler(
                rollout_engine,
                env,
                lambda examples: encode_prompts(tokenizer, examples),
                cfg.collector.prompts,
                sampling,
                model,
                lambda: learner.version,
                cfg.dist.mode,
                cfg.dist.max_staleness,
            )
            if cfg.dist.mode == "async" and run is not None:
                run.event(
                    f"--dist.mode async: engine workers generate ahead with the newest weights they hold (batches at "
                    f"most {cfg.dist.max_staleness} versions stale), so this run is not reproducible from its seed "
                    "(pipelined mode is)"
                )
        collector = TextCollector(
            env,
            rollout_engine,
            tokenizer,
            cfg.collector.prompts,
            sampling,
            model,
            reference,
            lambda: learner.version,
            device,
            precision=cfg.algo.autocast,
            offload_reference=cfg.collector.offload_reference,
            scheduler=scheduler,
            # the workers score the reference too, off the learner's path; not LoRA's shared reference (the policy
            # with its adapters off) and not vLLM (no module in the worker to copy)
            reference_on_workers=scheduler is not None and not is_lora(model) and e.name == "hf",
            encode=encode,
            share_prompts=getattr(cfg.algo, "share_prompts", True),
        )
    else:
        raise ConfigError(f"no LLM algorithm for config type {type(cfg.algo).__name__}")
    keep_reward_model(cfg, getattr(env, "prompts", env), algo)  # an agent's ToolEnv wraps the PromptEnv
    evaluator = TextEvaluator(env, engine, tokenizer, cfg.eval, e.max_new_tokens, seeds["eval"], scorer, encode)
    settle_for_training()  # the models are built: freeze them out of full GC passes, keep the allocator's blocks
    return LLMTrainer.assemble(cfg, algo, collector, evaluator, run, progress, resuming, (model, tokenizer))


def place_reference(state: dict[str, Any], algo_keeps: bool) -> dict[str, Any]:
    """``state`` (a trainer's) with the frozen reference's weights under ``algo`` when ``algo_keeps`` it, else
    under ``collector``, copied from the other entry when it was saved there; the entries themselves are not
    changed."""
    algo, collector = state.get("algo"), state.get("collector")
    if not isinstance(algo, dict) or not isinstance(collector, dict):
        return state
    if algo_keeps and "reference" not in algo and "reference" in collector:
        return {**state, "algo": {**algo, "reference": collector["reference"]}}
    if not algo_keeps and "reference" in algo and "reference" not in collector:
        return {**state, "collector": {**collector, "reference": algo["reference"]}}
    return state


def sharded_kl_reference(cfg: LLMTrainConfig, model: nn.Module) -> bool:
    """Whether a GRPO or LLM PPO run's KL reference is sharded across its learners (``--dist.shard fsdp`` on more
    than one learner with ``--dist.shard-reference``, ``kl_coef`` > 0, not LoRA, whose reference is the policy with
    its adapters off): then the algorithm keeps it and scores it, each learner its share of every batch."""
    return (
        cfg.dist.shard == "fsdp"
        and cfg.dist.shard_reference
        and cfg.dist.learners > 1
        and getattr(cfg.algo, "kl_coef", 0) > 0
        and not is_lora(model)
    )


def sharded_reward_model(cfg: LLMTrainConfig) -> bool:
    """Whether the run's reward model is sharded across its learners (``--data.reward-model`` with ``--dist.shard
    fsdp`` on more than one learner and ``--dist.shard-reward-model``): then every learner builds it (the others than
    rank 0 on the ``meta`` device, filled with their rows from rank 0's when it is sharded)."""
    d = cfg.dist
    return bool(cfg.data.reward_model) and d.shard == "fsdp" and d.shard_reward_model and d.learners > 1


def keep_reward_model(cfg: LLMTrainConfig, env: PromptEnv, algo: Algorithm) -> None:
    """With a sharded reward model: ``env``'s scorer of it (the ``proxy`` reward) becomes ``algo.reward_scorer``,
    sharded with the algorithm's models on every learner, which all join rank 0's scoring."""
    if sharded_reward_model(cfg) and "proxy" in env.reward_names:
        algo.reward_scorer = env.rewards[env.reward_names.index("proxy")][0]  # type: ignore[attr-defined]


def reference_scorer(algo: Algorithm) -> Callable[..., torch.Tensor]:
    """The evaluator's KL reference when the algorithm keeps it sharded: its ``score_reference`` (looked up at each
    call: the launcher's ``Leader`` replaces it with the call every learner joins)."""

    def score(*args: Any) -> torch.Tensor:
        return algo.score_reference(*args)  # type: ignore[attr-defined]

    return score


def _follows(cfg: LLMTrainConfig) -> bool:
    """Whether this process is a data-parallel learner other than rank 0 (``pickaxe.dist`` imported only then)."""
    if cfg.dist.learners <= 1:
        return False
    from pickaxe.dist.learners import is_follower

    return is_follower()


def _run_reference(
    cfg: LLMTrainConfig, run_dir: str | Path, model: nn.Module, device: torch.device
) -> nn.Module | None:
    """The frozen reference a run kept (KL-regularised methods): the policy with adapters off for LoRA, else the
    weights saved in its checkpoints' collector state (the same in every checkpoint); None without either."""
    if getattr(cfg.algo, "kl_coef", 0) <= 0:
        return None
    if is_lora(model):
        return shared_reference(model)
    state = load_collector_state(run_dir, device)
    if state is None or "reference" not in state:
        return None
    reference = copy.deepcopy(model)
    reference.load_state_dict(state["reference"])
    return reference.eval().requires_grad_(False)


def run_evaluator(cfg: LLMTrainConfig, run_dir: str | Path) -> tuple[nn.Module, Algorithm, TextEvaluator, torch.device]:
    """What scores an LLM run's weights on its held-out prompts with the run's own evaluation settings: the model
    rebuilt from ``cfg`` (load a checkpoint's weights into it), the algorithm the evaluator scores it through, the
    ``TextEvaluator`` (the run's env, an ``HFEngine`` on the model, the run's KL reference) and the device. The
    exports it loads (``model.path``, ``data.reward_model``) are checked against their digests first."""
    verify_inputs(cfg, options=("model.path", "data.reward_model"))
    set_torch_threads(cfg.torch_threads)
    seeds = derive_llm_seeds(cfg.seed)
    device = resolve_device(cfg.device)
    model, tokenizer = build_model(cfg, device, seeds["model"])
    env = build_env(cfg, seeds["env"], seeds["eval_env"], tokenizer, device)
    engine = HFEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, cfg.engine.max_batch, seeds["engine"])
    env, (engine,), encode = agent_rollouts(cfg, env, (engine,), tokenizer)
    reference = _run_reference(cfg, run_dir, model, device)
    evaluator = TextEvaluator(env, engine, tokenizer, cfg.eval, cfg.engine.max_new_tokens, seeds["eval"], reference,
                              encode)  # fmt: skip
    return model, SFT(model, SFTConfig()), evaluator, device


def evaluate_llm_run(
    cfg: LLMTrainConfig, run_dir: str | Path, prompts: int | None = None, checkpoint: str | int = "final"
) -> dict[str, float]:
    """Rebuild an LLM run's model from its config, load its weights and evaluate it on the held-out prompts with
    the run's own evaluation settings (``cfg.eval``: prompts, samples, pass@k, temperature), so the numbers match
    what the run logged for the same weights; ``prompts`` overrides ``cfg.eval.prompts``. ``checkpoint``:
    ``"final"`` (``model.safetensors``), ``"latest"``, ``"best"`` or an env step (see
    ``pickaxe.runs.model.load_model``). What ``pickaxe eval RUN_DIR`` prints for LLM runs."""
    cfg = copy.deepcopy(cfg)  # the caller's config stays as it was
    if prompts is not None:
        cfg.eval.prompts = prompts
    model, algo, evaluator, device = run_evaluator(cfg, run_dir)
    load_model(run_dir, {"policy": model}, device, checkpoint=checkpoint)
    return evaluator(algo)
