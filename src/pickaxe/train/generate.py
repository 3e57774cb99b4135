"""Generation from any checkpoint of an LLM run: what the playground of ``pickaxe ui`` and ``pickaxe arena`` use.

:func:`load_run_policy` rebuilds a run's model from its ``config.json`` as training built it and loads the chosen
weights, verified, through :func:`pickaxe.runs.model.load_model` (the final model, a kept checkpoint or a kept
policy); :func:`generate` completes prompts with the HF engine, or with a vLLM run's own engine (greedy by default)
and returns the text, the token ids and, on request, each token's log-prob; :func:`prepare_arena` stores every
checkpoint's response to every prompt in an :class:`~pickaxe.eval.arena.ArenaStore` ahead of time.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pickaxe.errors import PickaxeError
from pickaxe.eval.arena import ArenaStore
from pickaxe.models.lora import merge_lora
from pickaxe.models.tokenizer import render_prompt
from pickaxe.rollout.engines.base import SamplingParams
from pickaxe.rollout.engines.hf import HFEngine
from pickaxe.rollout.text_collector import completion_text
from pickaxe.runs.choices import NO_POLICY_ALGOS, available_checkpoints
from pickaxe.runs.model import checkpoint_choice, final_model_step
from pickaxe.runs.run import Run
from pickaxe.train.build import config_from_dict
from pickaxe.train.llm_config import LLMTrainConfig

__all__ = [
    "Generation",
    "RunPolicy",
    "available_checkpoints",
    "checkpoint_label",
    "generate",
    "load_run_policy",
    "prepare_arena",
]


@dataclass
class RunPolicy:
    """An LLM run's policy at one checkpoint, ready to generate: the model (eval mode, LoRA merged), its tokenizer,
    the run's config, and which weights were loaded (``checkpoint`` as ``checkpoint_choice`` returns it)."""

    run_dir: Path
    checkpoint: str | int
    model: nn.Module
    tokenizer: Any
    config: LLMTrainConfig
    engine: Any = None
    """The run's own engine, built on the first :meth:`generate` that needs it (vLLM runs); None for HF runs,
    which generate from ``model`` directly."""

    @property
    def label(self) -> str:
        """How the arena and the playground name these weights (``final`` or ``step N``)."""
        return checkpoint_label(self.checkpoint)

    def generate(
        self,
        prompts: str | Sequence[str],
        max_new_tokens: int | None = None,
        temperature: float = 0.0,
        seed: int = 0,
        logprobs: bool = False,
    ) -> Any:
        """Complete one prompt (a ``Generation``) or each of a list (a list of them): :func:`generate` with this
        policy through the engine the run trained with (``engine.name``: HF, or vLLM loaded with these weights),
        greedy by default."""
        engine = self.config.engine.name
        if isinstance(prompts, str):
            return generate(self, [prompts], max_new_tokens, temperature, seed, logprobs, engine)[0]
        return generate(self, prompts, max_new_tokens, temperature, seed, logprobs, engine)

    def run_engine(self, seed: int) -> Any:
        """The run's vLLM engine (:class:`~pickaxe.rollout.engines.vllm.VLLMEngine`), built once from the folder the
        run's engine loaded (``model.path``, or the ``engine_model`` it saved in the run folder) and loaded with this
        policy's weights; each call starts its sampling afresh from ``seed``."""
        if self.engine is None:
            from pickaxe.rollout.engines import vllm as vllm_engines

            cfg = self.config
            path = cfg.model.path or str(self.run_dir / "engine_model")
            self.engine = vllm_engines.VLLMEngine(
                path, int(self.tokenizer.eos_token_id), seed, cfg.engine.gpu_memory_utilization, cfg.model.dtype
            )
            version = self.checkpoint if isinstance(self.checkpoint, int) else 0
            self.engine.load_weights(self.model.state_dict(), version)
        self.engine.seed = seed
        self.engine.load_state_dict({"calls": 0, "version": self.engine.version})
        return self.engine

    @property
    def max_positions(self) -> int | None:
        """The longest prompt + completion the model takes (None: not recorded)."""
        value = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return int(value) if value else None


@dataclass(frozen=True)
class Generation:
    """One completion: the ``text`` a reward function would see (before EOS, special tokens dropped), the generated
    ``token_ids`` (EOS included when it ended), each token as text (``tokens``), each token's log-prob when asked
    (``logprobs``: under the sampling distribution; for greedy decoding the unscaled model distribution), and
    whether it ended with EOS (``finished``) rather than at ``max_new_tokens``."""

    prompt: str
    text: str
    token_ids: list[int]
    tokens: list[str]
    logprobs: list[float] | None
    finished: bool


def checkpoint_label(checkpoint: str | int) -> str:
    """``final`` for the final model, ``step N`` for the weights of env step N, else the word (``latest``)."""
    return f"step {checkpoint}" if isinstance(checkpoint, int) else str(checkpoint)


def llm_run_config(run_dir: Path) -> LLMTrainConfig:
    """The config of ``run_dir`` when it is an LLM run with a policy of its own (what the playground and the arena
    generate from); a one-line ``PickaxeError`` for a classic run or a reward-model or best-of-n run."""
    data = Run.open(run_dir).config()
    cfg = config_from_dict(data)
    if not isinstance(cfg, LLMTrainConfig):
        raise PickaxeError(f"{run_dir} is a classic RL run; only LLM runs generate text (pick an LLM run)")
    if data.get("algo_name") in NO_POLICY_ALGOS:
        raise PickaxeError(
            f"{run_dir} is a {data.get('algo_name')} run, which trains no policy of its own; pick an SFT, GRPO, PPO, "
            "RLOO or DPO run"
        )
    return cfg


def load_run_policy(
    run_dir: str | Path, checkpoint: str | int = "final", device: str | torch.device = "cpu"
) -> RunPolicy:
    """LLM run ``run_dir``'s policy at ``checkpoint`` (``"final"``, ``"latest"``, ``"best"`` or an env step, as
    for ``pickaxe eval``), on ``device``, in eval mode with LoRA adapters merged. Problems (not an LLM run, no such
    checkpoint, damaged weights) raise a one-line ``PickaxeError``."""
    from pickaxe.train.llm import load_run_lm

    run_path = Path(run_dir)
    cfg = llm_run_config(run_path)
    which = checkpoint_choice(checkpoint)
    model, tokenizer = load_run_lm(cfg, run_path, device, which)
    model = merge_lora(model, copy_model=False).eval().requires_grad_(False)
    return RunPolicy(run_path, which, model, tokenizer, cfg)


def generate(
    policy: RunPolicy,
    prompts: Sequence[str],
    max_new_tokens: int | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    logprobs: bool = False,
    engine: str = "hf",
) -> list[Generation]:
    """Complete each of ``prompts`` once with ``policy`` (rendered as training rendered them: the chat template
    when the tokenizer has one). ``max_new_tokens``: default the run's ``engine.max_new_tokens``; ``temperature``
    0 is greedy; sampling is seeded by ``seed``, so the same call gives the same text. ``engine``: ``hf`` (what the
    playground and the arena use, whatever the run trained with) or ``vllm`` (:meth:`RunPolicy.run_engine`). A prompt
    that is empty or leaves no room for ``max_new_tokens`` within the model's positions raises a one-line
    ``ValueError``."""
    if max_new_tokens is None:
        max_new_tokens = policy.config.engine.max_new_tokens
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    tok = policy.tokenizer
    ids = [render_prompt(tok, p) for p in prompts]
    limit = policy.max_positions
    for p, i in zip(prompts, ids, strict=True):
        if not i:
            raise ValueError("the prompt is empty; type some text")
        if limit is not None and len(i) + max_new_tokens > limit:
            raise ValueError(
                f"the prompt is {len(i)} tokens and {max_new_tokens} new tokens would pass the model's {limit} "
                f"positions; shorten the prompt (starts {p[:30]!r}) or ask for fewer new tokens"
            )
    if not ids:
        return []
    if engine == "vllm":
        runner: Any = policy.run_engine(seed)
    else:
        runner = HFEngine(policy.model, tok.eos_token_id, tok.pad_token_id, max_batch=64, seed=seed)
    completions = runner.generate(ids, SamplingParams(max_new_tokens, temperature=temperature))
    out = []
    for prompt, c in zip(prompts, completions, strict=True):
        pieces = [tok.decode([t], skip_special_tokens=False) for t in c.token_ids]
        out.append(
            Generation(
                prompt=prompt,
                text=completion_text(tok, c.token_ids, tok.eos_token_id),
                token_ids=list(c.token_ids),
                tokens=pieces,
                logprobs=[float(x) for x in c.logprobs] if logprobs else None,
                finished=c.finished,
            )
        )
    return out


def heldout_prompts(cfg: LLMTrainConfig, n: int) -> list[str]:
    """The first ``n`` held-out prompts of a run's task or prompt file (the ones its evaluation uses)."""
    from pickaxe.train.llm import build_env, derive_llm_seeds

    cfg = copy.deepcopy(cfg)
    cfg.eval.prompts = max(n, 1)
    seeds = derive_llm_seeds(cfg.seed)
    env = build_env(cfg, seeds["env"], seeds["eval_env"])  # no tokenizer: no reward model is loaded
    return [ex.prompt for ex in env.eval_examples(n)]


def resolve_checkpoints(run_dir: str | Path, checkpoints: Sequence[str | int] | str) -> list[str | int]:
    """``"all"`` (every kept step, and the final model unless its step is among them) or a list of checkpoint
    choices (``final``, ``latest``, ``best``, env steps), deduplicated in order."""
    if isinstance(checkpoints, str):
        checkpoints = [checkpoints]
    if list(checkpoints) == ["all"]:
        found = available_checkpoints(run_dir)
        final = final_model_step(run_dir)
        return [c for c in found if not (c == "final" and final in found)]
    out: list[str | int] = []
    for c in checkpoints:
        which = checkpoint_choice(c)
        if which not in out:
            out.append(which)
    return out


def prepare_arena(
    store: ArenaStore,
    name: str,
    run_dir: str | Path,
    checkpoints: Sequence[str | int] | str = "all",
    prompts: Sequence[str] | None = None,
    n_prompts: int = 32,
    max_new_tokens: int | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    device: str | torch.device = "cpu",
    progress: Callable[[str], None] | None = None,
) -> int:
    """Generate every checkpoint's response to every prompt ahead of time and store them as arena ``name``;
    returns how many responses were generated. ``prompts``: default the first ``n_prompts`` held-out prompts of the
    run's task. Responses already stored for the same prompt and checkpoint are kept, so a rerun only generates
    what is missing (e.g. the checkpoints written since). Needs at least two checkpoints (counting those stored)."""
    run_path = Path(run_dir)
    cfg = llm_run_config(run_path)
    chosen = resolve_checkpoints(run_path, checkpoints)
    stored = store.labels(name) if name in store.arenas() else []
    if len({*stored, *(checkpoint_label(c) for c in chosen)}) < 2:
        have = ", ".join(checkpoint_label(c) for c in available_checkpoints(run_path)) or "none"
        raise PickaxeError(f"an arena compares at least two checkpoints, got {len(chosen)}; {run_path} has: {have}")
    texts = list(prompts) if prompts is not None else heldout_prompts(cfg, n_prompts)
    if not texts:
        raise PickaxeError("an arena needs at least one prompt")
    if max_new_tokens is None:
        max_new_tokens = cfg.engine.max_new_tokens
    settings = {"max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed}
    known = store.prompts(name) if name in store.arenas() else {}
    clash = [i for i, p in enumerate(texts) if i in known and known[i] != p]
    if clash:
        raise PickaxeError(
            f"arena {name!r} in {store.path} already holds other prompts (prompt {clash[0]} differs); pick another "
            "--name or --db"
        )
    source = store.source(name) if name in store.arenas() else {}
    if source and source.get("settings") not in (None, settings):
        raise PickaxeError(
            f"arena {name!r} in {store.path} was generated with {source['settings']}, not {settings}; pick another "
            "--name, or the same settings"
        )
    labels = sorted({*source.get("checkpoints", []), *(checkpoint_label(c) for c in chosen)})
    store.add_arena(name, {"run": str(run_path.resolve()), "settings": settings, "checkpoints": labels})
    made = 0
    for which in chosen:
        label = checkpoint_label(which)
        todo = [i for i in range(len(texts)) if not store.has_response(name, i, label)]
        if not todo:
            if progress:
                progress(f"{label}: {len(texts)} responses already stored")
            continue
        policy = load_run_policy(run_path, which, device)
        out = generate(policy, [texts[i] for i in todo], max_new_tokens, temperature, seed)
        store.add_responses(name, [(i, texts[i], label, g.text) for i, g in zip(todo, out, strict=True)])
        made += len(out)
        if progress:
            progress(f"{label}: {len(out)} responses generated")
        del policy
    return made
