"""Best-of-n against a reward model: the no-training baseline of the RLHF recipes.

For every held-out prompt the policy samples ``max(n)`` completions once (seeded); for each ``n`` the samples are
cut into disjoint groups of ``n``, the reward model (``proxy``) picks the best of each group, and the mean gold and
proxy scores of the picks are logged at step ``n`` with the analytic bound KL(best-of-n || policy) <=
log n - (n - 1) / n (Stiennon et al. 2020), so best-of-n sits on the same gold-versus-KL plot as the RL methods.
"""

from __future__ import annotations

import math
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from pickaxe.errors import ConfigError
from pickaxe.rollout.engines.base import SamplingParams
from pickaxe.rollout.engines.hf import HFEngine
from pickaxe.rollout.text_collector import encode_prompts, score_completions
from pickaxe.runs.run import Run
from pickaxe.train.llm import build_env, start_policy
from pickaxe.train.llm_config import LLMTrainConfig
from pickaxe.train.trainer import FitResult

__all__ = ["BestOfN", "best_of_n_kl", "build_best_of_n", "pick_best"]


def best_of_n_kl(n: int) -> float:
    """The upper bound ``log n - (n - 1) / n`` on KL(best-of-n || policy) (0 for n = 1)."""
    return math.log(n) - (n - 1) / n


def pick_best(proxy: np.ndarray, gold: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """For ``[prompts, N]`` scores, cut each prompt's ``N`` samples into ``N // n`` disjoint groups of ``n`` and
    return the proxy and gold scores of each group's highest-proxy sample (first one on ties), flattened."""
    prompts, total = proxy.shape
    groups = total // n
    p = proxy[:, : groups * n].reshape(prompts, groups, n)
    g = gold[:, : groups * n].reshape(prompts, groups, n)
    best = p.argmax(-1)[..., None]
    return np.take_along_axis(p, best, -1).ravel(), np.take_along_axis(g, best, -1).ravel()


class BestOfN:
    """Runs best-of-n for each ``cfg.algo.n`` and logs one record per n; has the ``fit``/``resume``/``close`` of a
    Trainer, so ``pickaxe train``, the queue and ``pickaxe compare`` treat it like any run. It is a pure function of
    the weights and the seed: a resumed run simply evaluates again."""

    def __init__(self, cfg: LLMTrainConfig, run: Run | None = None, progress: bool = False) -> None:
        self.cfg, self.run, self.progress = cfg, run, progress
        # best-of-n keeps no checkpoints: `pickaxe resume` starts it again from step 0 (pickaxe.train.build.resume)
        self.model, self.tokenizer, seeds, device, _ = start_policy(cfg, run, progress)
        self.env = build_env(cfg, seeds["env"], seeds["eval_env"], self.tokenizer, device)
        self.engine = HFEngine(self.model.eval(), self.tokenizer.eos_token_id, self.tokenizer.pad_token_id,
                               cfg.engine.max_batch, seeds["eval"])  # fmt: skip
        if "proxy" not in self.env.reward_names:
            raise ConfigError("best-of-n ranks samples by a reward model: set --data.reward-model DIR")
        self.has_gold = "gold" in self.env.reward_names

    def resume(self, allow_empty: bool = False) -> None:
        """Nothing to restore: the evaluation is recomputed from the weights and the seed (``pickaxe resume`` starts
        a best-of-n run again from step 0, in a folder cleared of the stopped attempt's records)."""

    def close(self) -> None:
        """Nothing to close."""

    def fit(self) -> FitResult:
        """Sample, score, pick and log; returns the records (``eval_return``: the proxy score at the largest n).
        ``status.json`` reads running (phase evaluating), then finished, or crashed / interrupted on an error."""
        if self.run is not None:
            self.run.set_phase("evaluating", step=0, total_steps=max(self.cfg.algo.n))
        try:
            result = self._evaluate()
        except BaseException as e:
            if self.run is not None:
                self.run.end_with(e)
            raise
        if self.progress:
            table = Table(title="pickaxe: best-of-n on held-out prompts")
            for col in ("n", "KL bound", "proxy", "gold"):
                table.add_column(col)
            for r in result.history:
                gold_text = f"{r['eval/reward/gold']:.3f}" if "eval/reward/gold" in r else "-"
                table.add_row(str(r["step"]), f"{r['eval/kl']:.3f}", f"{r['eval/reward/proxy']:.3f}", gold_text)
            Console().print(table)
        return result

    def _evaluate(self) -> FitResult:
        """The sampling, scoring and logging of :meth:`fit`."""
        cfg, start = self.cfg, time.perf_counter()
        examples = self.env.eval_examples(cfg.eval.prompts)
        e = cfg.engine
        most = max(cfg.algo.n)
        params = SamplingParams(e.max_new_tokens, cfg.eval.temperature, e.top_k, e.top_p, n=most)
        completions = self.engine.generate(encode_prompts(self.tokenizer, examples), params)
        scores = score_completions(self.env, examples, completions, self.tokenizer)
        proxy = np.asarray(scores.parts["proxy"], dtype=np.float64).reshape(len(examples), most)
        gold = np.asarray(scores.parts.get("gold", [np.nan] * len(completions)), dtype=np.float64)
        gold = gold.reshape(len(examples), most)
        result = FitResult(steps=most, wall_s=0.0)
        for n in sorted(set(cfg.algo.n)):
            p, g = pick_best(proxy, gold, n)
            record = {
                "bon/n": float(n),
                "eval/kl": best_of_n_kl(n),
                "eval/reward/proxy": float(p.mean()),
                "eval/return_mean": float(p.mean()),
                "eval/picks": float(len(p)),
            }
            if self.has_gold:
                record["eval/reward/gold"] = float(g.mean())
                record["eval/reward/gold_se"] = float(g.std(ddof=1) / math.sqrt(len(g))) if len(g) > 1 else 0.0
            if self.run is not None:
                self.run.log(record, n)
            result.history.append({"step": n, **record})
        result.wall_s = time.perf_counter() - start
        result.eval_return = result.history[-1]["eval/return_mean"]
        if self.run is not None:
            self.run.flush()
            self.run.set_status("finished", step=most)
        return result


def build_best_of_n(cfg: LLMTrainConfig, run: Run | None = None, progress: bool = False) -> BestOfN:
    """The best-of-n evaluation of ``cfg`` (``cfg.algo`` a ``BestOfNConfig``)."""
    return BestOfN(cfg, run, progress)
