"""LLM training: ``LLMTrainConfig``, the held-out text evaluator and ``build_llm_trainer``.

``build_llm_trainer`` builds tokenizer, model, ``PromptEnv``, engine, collector and algorithm (SFT or GRPO) from
one config, runs the optional SFT warm start (logged under ``warm_start/``), evaluates the starting policy on
held-out prompts (logged at step 0) and returns a ``Trainer`` whose summary shows held-out accuracy before and
after with 95% Wilson intervals. ``pickaxe.train.build.train(cfg)`` finds it through the config's ``KIND``.
"""

from __future__ import annotations

import copy
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from torch import nn

from pickaxe.algos.base import Algorithm
from pickaxe.algos.configs import GRPOConfig, SFTConfig
from pickaxe.algos.grpo import GRPO
from pickaxe.algos.sft import SFT
from pickaxe.envs.text.prompt_env import PromptEnv, load_examples
from pickaxe.envs.text.rewards import REWARDS
from pickaxe.envs.text.tasks import make_task
from pickaxe.errors import ConfigError
from pickaxe.eval.stats import pass_at_k, wilson_interval
from pickaxe.models.lm import load_lm, num_parameters, tiny_lm
from pickaxe.models.tokenizer import char_tokenizer, load_tokenizer
from pickaxe.rollout.engines.base import Completion, Engine, SamplingParams
from pickaxe.rollout.engines.hf import HFEngine
from pickaxe.rollout.text_collector import DemoCollector, TextCollector, completion_text, encode_prompts
from pickaxe.runs.model import load_model
from pickaxe.runs.run import Run
from pickaxe.train.llm_config import LLMEvalConfig, LLMTrainConfig
from pickaxe.train.trainer import FitResult, Trainer
from pickaxe.utils import resolve_device, seed_everything, set_torch_threads

# ---------------------------------------------------------------------------------------------- evaluation


class TextEvaluator:
    """Scores the current policy on the env's held-out prompts: greedy accuracy (the first reward function is the
    correctness check; correct means >= 1) with its 95% Wilson interval, the mean greedy reward, and with
    ``samples`` > 0 the unbiased sampled pass@1 and pass@k. Sampling is re-seeded every call, so an evaluation
    is a pure function of the weights."""

    def __init__(
        self, env: PromptEnv, engine: Engine, tokenizer: Any, config: LLMEvalConfig, max_new_tokens: int, seed: int = 0
    ) -> None:
        self.env = env
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.examples = env.eval_examples(config.prompts)
        self.prompt_ids = encode_prompts(tokenizer, self.examples)
        self.eos = int(tokenizer.eos_token_id)

    def _correct(self, completions: list[Completion]) -> tuple[np.ndarray, np.ndarray]:
        """Per completion: correct by the first reward (>= 1), and the total weighted reward."""
        first = self.env.rewards[0][0]
        correct, total = [], []
        for c in completions:
            text = completion_text(self.tokenizer, c.token_ids, self.eos)
            ex = self.examples[c.prompt_index]
            reward, _ = self.env.score(ex, text)
            total.append(reward)
            correct.append(float(first(ex.prompt, text, ex.reward_metadata())) >= 1.0)
        return np.array(correct), np.array(total)

    def __call__(self, algo: Algorithm) -> dict[str, float]:
        """Evaluate ``algo``'s model (synced into the engine first)."""
        cfg = self.config
        model = getattr(algo, "model", None)
        if model is not None:
            self.engine.sync_weights(model, getattr(algo, "version", 0))
        generator = getattr(self.engine, "generator", None)
        saved = generator.get_state() if generator is not None else None
        if generator is not None:
            generator.manual_seed(self.seed)
        try:
            greedy = self.engine.generate(self.prompt_ids, SamplingParams(self.max_new_tokens, temperature=0.0))
            correct, reward = self._correct(greedy)
            n, hits = len(correct), int(correct.sum())
            low, high = wilson_interval(hits, n)
            out = {
                "eval/accuracy": hits / max(n, 1),
                "eval/accuracy_ci_low": low,
                "eval/accuracy_ci_high": high,
                "eval/return_mean": float(reward.mean()),
                "eval/completion_length": float(np.mean([len(c.token_ids) for c in greedy])),
                "eval/prompts": float(n),
            }
            if cfg.samples > 0:
                params = SamplingParams(self.max_new_tokens, temperature=cfg.temperature, n=cfg.samples)
                sampled_correct, _ = self._correct(self.engine.generate(self.prompt_ids, params))
                per_prompt = sampled_correct.reshape(n, cfg.samples).sum(1)
                for k in sorted({1, min(cfg.pass_k, cfg.samples)}):
                    out[f"eval/pass@{k}"] = float(np.mean([pass_at_k(cfg.samples, int(c), k) for c in per_prompt]))
        finally:
            if generator is not None:
                generator.set_state(saved)
        return out


# ---------------------------------------------------------------------------------------------- building


def derive_llm_seeds(seed: int) -> dict[str, int]:
    """Independent seeds for model init, training prompts, held-out prompts, sampling, warm start, eval."""
    names = ("model", "env", "eval_env", "engine", "warm_start", "eval", "algo")
    values = np.random.SeedSequence(seed).generate_state(len(names))
    return {name: int(v) for name, v in zip(names, values, strict=True)}


def build_model(cfg: LLMTrainConfig, device: torch.device, seed: int) -> tuple[nn.Module, Any]:
    """The tokenizer and causal LM of ``cfg.model``."""
    m = cfg.model
    if m.path:
        tokenizer = load_tokenizer(m.path)
        return load_lm(m.path, device, m.dtype), tokenizer
    tokenizer = char_tokenizer(model_max_length=m.max_positions)
    model = tiny_lm(
        len(tokenizer),
        arch=m.arch,
        hidden=m.hidden,
        layers=m.layers,
        heads=m.heads,
        kv_heads=m.kv_heads,
        intermediate=m.intermediate,
        max_positions=m.max_positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        seed=seed,
    )
    if m.dtype not in ("auto", "float32"):
        model = model.to(getattr(torch, m.dtype))
    return model.to(device), tokenizer


def build_env(cfg: LLMTrainConfig, seed: int, eval_seed: int) -> PromptEnv:
    """The ``PromptEnv`` of ``cfg.data`` (a prompt file) or else ``cfg.task``."""
    d = cfg.data
    if d.path:
        examples = load_examples(d.path, d.prompt_key, d.answer_key)
        eval_examples = load_examples(d.eval_path, d.prompt_key, d.answer_key) if d.eval_path else None
        return PromptEnv(
            examples, [REWARDS[d.reward]], eval_examples, seed=seed, eval_size=cfg.eval.prompts, eval_seed=eval_seed
        )
    t = cfg.task
    task = make_task(t.name, t.digits, t.min_len, t.max_len, t.heldout_fraction)
    return PromptEnv(task, seed=seed, eval_size=cfg.eval.prompts, eval_seed=eval_seed)


def build_engine(cfg: LLMTrainConfig, model: nn.Module, tokenizer: Any, seed: int, run: Run | None) -> Engine:
    """The rollout engine of ``cfg.engine`` (``hf`` shares the learner's model: no copy, no sync cost)."""
    e = cfg.engine
    if e.name == "hf":
        return HFEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, e.max_batch, seed)
    from pickaxe.rollout.engines.vllm import VLLMEngine

    path = cfg.model.path
    if path is None:  # vLLM loads from disk: save the tiny model next to the run
        if run is None:
            raise ConfigError("the vllm engine with a tiny model needs a run directory to save the model into")
        path = str(run.path / "engine_model")
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return VLLMEngine(path, tokenizer.eos_token_id, seed, e.gpu_memory_utilization, cfg.model.dtype)


def warm_start(
    cfg: LLMTrainConfig, model: nn.Module, tokenizer: Any, seed: int, run: Run | None, progress: bool
) -> dict[str, float]:
    """SFT for ``cfg.warm_start.updates`` updates on the task's reference answers, or fewer once the windowed
    token NLL reaches ``cfg.warm_start.target_nll``; records under ``warm_start/`` (logged at step 0). Uses its
    own prompt stream, so the RL prompts do not depend on it."""
    w = cfg.warm_start
    env = build_env(cfg, seed, seed)  # its own prompt stream; its held-out set is unused
    collector = DemoCollector(env, tokenizer, w.batch_size, device=next(model.parameters()).device)
    a = cfg.algo  # the run's compute options (layout, checkpointing, autocast, chunks) apply to the warm start too
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
    return {"warm_start/wall_s": time.perf_counter() - start, "warm_start/updates": float(sft.version), **last}


class LLMTrainer(Trainer):
    """The ``Trainer`` with an LLM summary: held-out accuracy (95% CI) before and after training."""

    before: dict[str, float] | None = None

    def fit(self, total_steps: int | None = None) -> FitResult:
        """Train, then (with progress on) print held-out accuracy before and after."""
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
        passes = ", ".join(f"{k.split('/')[1]}={v:.3f}" for k, v in rec.items() if k.startswith("eval/pass@"))
        table.add_row(
            name,
            f"{rec['eval/accuracy']:.3f} [{rec['eval/accuracy_ci_low']:.3f}, {rec['eval/accuracy_ci_high']:.3f}]",
            passes or "-",
            f"{rec['eval/return_mean']:.3f}",
        )
    Console().print(table)


def build_llm_trainer(cfg: LLMTrainConfig, run: Run | None = None, progress: bool = False) -> LLMTrainer:
    """Seed everything; build tokenizer, model, env, engine, collector and algorithm; warm-start with SFT if
    configured; evaluate the starting point (logged at step 0); return the Trainer."""
    set_torch_threads(cfg.torch_threads)
    seed_everything(cfg.seed)
    seeds = derive_llm_seeds(cfg.seed)
    device = resolve_device(cfg.device)
    model, tokenizer = build_model(cfg, device, seeds["model"])
    if progress:
        Console().print(f"model: {type(model).__name__}, {num_parameters(model):,} parameters on {device}")
    # a resumed run gets its weights (policy and reference) from the checkpoint: no warm start, no "before" eval
    resuming = run is not None and any((run.path / "checkpoints").glob("*"))
    if cfg.warm_start.updates > 0 and not resuming:
        warm_start(cfg, model, tokenizer, seeds["warm_start"], run, progress)
    env = build_env(cfg, seeds["env"], seeds["eval_env"])
    engine = build_engine(cfg, model, tokenizer, seeds["engine"], run)
    e = cfg.engine
    sampling = SamplingParams(e.max_new_tokens, e.temperature, e.top_k, e.top_p, n=cfg.collector.group_size)
    if isinstance(cfg.algo, SFTConfig):
        algo: Algorithm = SFT(model, cfg.algo)
        collector: Any = DemoCollector(env, tokenizer, cfg.collector.prompts, device=device)
    elif isinstance(cfg.algo, GRPOConfig):
        grpo = GRPO(model, cfg.algo, sampling, seed=seeds["algo"])
        reference = None
        if cfg.algo.kl_coef > 0:  # frozen copy of the starting (warm-started) policy
            reference = copy.deepcopy(model).eval().requires_grad_(False)
        collector = TextCollector(
            env,
            engine,
            tokenizer,
            cfg.collector.prompts,
            sampling,
            model,
            reference,
            lambda: grpo.version,
            device,
            precision=cfg.algo.autocast,
            offload_reference=cfg.collector.offload_reference,
        )
        algo = grpo
    else:
        raise ConfigError(f"no LLM algorithm for config type {type(cfg.algo).__name__}")
    evaluator = TextEvaluator(env, engine, tokenizer, cfg.eval, e.max_new_tokens, seeds["eval"])
    trainer = LLMTrainer(
        algo,
        collector,
        run=run,
        config=cfg.trainer,
        progress=progress,
        torch_threads=cfg.torch_threads,
        evaluator=evaluator,
    )
    if cfg.eval.before and not resuming:
        before = evaluator(algo)
        trainer.before = before
        if run is not None:
            run.log({**before, "eval/phase_before": 1.0}, 0)
        if progress:
            Console().print(
                f"held-out accuracy before training: {before['eval/accuracy']:.3f} "
                f"[{before['eval/accuracy_ci_low']:.3f}, {before['eval/accuracy_ci_high']:.3f}]"
            )
    return trainer


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
    set_torch_threads(cfg.torch_threads)
    seeds = derive_llm_seeds(cfg.seed)
    device = resolve_device(cfg.device)
    model, tokenizer = build_model(cfg, device, seeds["model"])
    load_model(run_dir, {"policy": model}, device, checkpoint=checkpoint)
    env = build_env(cfg, seeds["env"], seeds["eval_env"])
    engine = HFEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, cfg.engine.max_batch, seeds["engine"])
    evaluator = TextEvaluator(env, engine, tokenizer, cfg.eval, cfg.engine.max_new_tokens, seeds["eval"])
    return evaluator(SFT(model, SFTConfig()))
