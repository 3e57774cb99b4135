"""The held-out text evaluator of LLM runs: :class:`TextEvaluator` scores a policy on the env's held-out prompts
(greedy accuracy with its Wilson interval, sampled pass@k, reward terms, entropy and KL to the reference, each mean
with a bootstrap CI). Training runs, ``pickaxe eval`` and checkpoint selection share it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from pickaxe.algos.base import Algorithm
from pickaxe.envs.text.example import Example
from pickaxe.envs.text.prompt_env import PromptEnv
from pickaxe.eval.stats import pass_at_k
from pickaxe.models.lm import completion_logprobs
from pickaxe.rollout.engines.base import Completion, Engine, SamplingParams
from pickaxe.rollout.text_collector import encode_prompts, pack, score_completions
from pickaxe.train.evaluate import text_estimates
from pickaxe.train.llm_config import LLMEvalConfig


class TextEvaluator:
    """Scores the current policy on the env's held-out prompts: greedy accuracy (the first reward function is the
    correctness check; correct means >= 1) with its 95% Wilson interval, the mean greedy reward, each reward term's
    greedy mean (``eval/reward/<name>``), and with ``samples`` > 0 the unbiased sampled pass@1 and pass@k, each
    term's mean over the samples (``eval/sampled/<name>``), the sampled length, the per-token entropy estimate
    (``eval/entropy``: mean of -log pi(y_t) over the sampled tokens) and, given the frozen ``reference`` (a model,
    or a sharded one's scorer: ``(input_ids, attention_mask, loss_mask, temperature)`` -> log-probs), the KL of
    the policy to it estimated on those samples (``eval/kl``: mean over completions of the summed log-ratio, an
    unbiased estimate of the sequence KL). Every mean but the accuracy has a 95% bootstrap CI (``_ci_low``,
    ``_ci_high``; fixed seed). Sampling is re-seeded every call, so an evaluation is a pure function of the
    weights. :meth:`samples` gives the per-prompt and per-completion values the metrics are computed from
    (``pickaxe eval --checkpoints`` caches them). An agent run's ``engine`` is an
    :class:`~pickaxe.rollout.agent.AgentRollout` and ``encode`` its first prompts: a completion is then a whole
    episode, scored on its final answer."""

    def __init__(
        self,
        env: PromptEnv,
        engine: Engine,
        tokenizer: Any,
        config: LLMEvalConfig,
        max_new_tokens: int,
        seed: int = 0,
        reference: nn.Module | Callable[..., torch.Tensor] | None = None,
        encode: Callable[[Sequence[Example]], list[list[int]]] | None = None,
    ) -> None:
        self.env = env
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.reference = reference
        self.examples = env.eval_examples(config.prompts)
        self.prompt_ids = encode(self.examples) if encode is not None else encode_prompts(tokenizer, self.examples)

    def _score(self, completions: list[Completion]) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """Per completion: correct by the first reward (>= 1), the total weighted reward, and each term by name
        (NaN where a reward failed; batched rewards score all completions in one call)."""
        scores = score_completions(self.env, self.examples, completions, self.tokenizer)
        terms = {name: np.asarray(v, dtype=np.float64) for name, v in scores.parts.items()}
        correct = np.nan_to_num(next(iter(terms.values())), nan=0.0) >= 1.0
        return correct, np.asarray(scores.total, dtype=np.float64), terms

    def _logprobs(self, model: nn.Module, completions: list[Completion], temperature: float) -> dict[str, np.ndarray]:
        """Per completion: the summed -log pi(y_t) of its tokens and their count (policy at ``temperature``) and,
        given a reference, sum_t log pi(y_t) - log pi_ref(y_t) (float32, as the KL is averaged)."""
        data = pack([self.prompt_ids[c.prompt_index] for c in completions], [c.token_ids for c in completions],
                    int(self.tokenizer.pad_token_id), completion_masks=[c.loss_mask for c in completions])  # fmt: skip
        device = next(model.parameters()).device
        ids, attn, mask = (data[k].to(device) for k in ("input_ids", "attention_mask", "loss_mask"))
        out: dict[str, np.ndarray] = {}
        with torch.no_grad():
            logp = completion_logprobs(model, ids, attn, mask, temperature, rows=64)
            out["sampled/neg_logp"] = (-(logp * mask).sum(1)).double().cpu().numpy()
            out["sampled/tokens"] = mask.sum(1).double().cpu().numpy()
            if isinstance(self.reference, nn.Module):
                ref = completion_logprobs(self.reference, ids, attn, mask, temperature, rows=64)
            elif self.reference is not None:  # a sharded reference, scored by every learner together
                ref = self.reference(ids, attn, mask, temperature).to(logp.dtype)
            if self.reference is not None:
                out["sampled/kl"] = ((logp - ref) * mask).sum(1).float().cpu().numpy()
        return out

    def samples(self, algo: Algorithm) -> dict[str, np.ndarray]:
        """Evaluate ``algo``'s model (synced into the engine first); the per-sample values, in prompt order:
        ``greedy/correct``, ``greedy/reward``, ``greedy/length`` and ``greedy/term/<name>`` (one per prompt), with
        ``samples`` > 0 ``sampled/correct``, ``sampled/reward``, ``sampled/length``, ``sampled/term/<name>``,
        ``sampled/neg_logp``, ``sampled/tokens`` and with a reference ``sampled/kl`` (one per completion, prompt-
        major) and ``sampled/pass@<k>`` (one per prompt)."""
        cfg = self.config
        # the policy's whole weights: with --dist.shard fsdp, rank 0's unsharded policy (algo.model is its shard)
        model = getattr(algo, "policy", None) if hasattr(algo, "model") else None
        if model is not None:
            self.engine.sync_weights(model, getattr(algo, "version", 0))
        generator = getattr(self.engine, "generator", None)
        saved = generator.get_state() if generator is not None else None
        if generator is not None:
            generator.manual_seed(self.seed)
        was_training = model.training if model is not None else False
        if model is not None:
            model.eval()
        try:
            greedy = self.engine.generate(self.prompt_ids, SamplingParams(self.max_new_tokens, temperature=0.0))
            correct, reward, terms = self._score(greedy)
            out = {
                "greedy/correct": correct.astype(np.float64),
                "greedy/reward": reward,
                "greedy/length": np.array([len(c.token_ids) for c in greedy], dtype=np.float64),
                **{f"greedy/term/{k}": v for k, v in terms.items()},
            }
            if cfg.samples > 0:
                n = len(correct)
                params = SamplingParams(self.max_new_tokens, temperature=cfg.temperature, n=cfg.samples)
                sampled = self.engine.generate(self.prompt_ids, params)
                sampled_correct, sampled_reward, sampled_terms = self._score(sampled)
                out["sampled/correct"] = sampled_correct.astype(np.float64)
                out["sampled/reward"] = sampled_reward
                out["sampled/length"] = np.array([len(c.token_ids) for c in sampled], dtype=np.float64)
                out.update({f"sampled/term/{k}": v for k, v in sampled_terms.items()})
                per_prompt = sampled_correct.reshape(n, cfg.samples).sum(1)
                for k in sorted({1, min(cfg.pass_k, cfg.samples)}):
                    out[f"sampled/pass@{k}"] = np.array([pass_at_k(cfg.samples, int(c), k) for c in per_prompt])
                if model is not None:
                    out.update(self._logprobs(model, sampled, cfg.temperature))
        finally:
            if generator is not None:
                generator.set_state(saved)
            if model is not None:
                model.train(was_training)
        return out

    def __call__(self, algo: Algorithm) -> dict[str, float]:
        """Evaluate ``algo``'s model: the metrics of :func:`text_estimates` over :meth:`samples`, each mean with its
        ``_ci_low``/``_ci_high``, and ``eval/prompts``."""
        values = self.samples(algo)
        out: dict[str, float] = {}
        for name, e in text_estimates(values).items():
            out.update({name: e.mean, f"{name}_ci_low": e.low, f"{name}_ci_high": e.high})
        out["eval/prompts"] = float(len(values["greedy/correct"]))
        return out
