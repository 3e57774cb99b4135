"""Collectors for language models: ``TextCollector`` (groups of sampled completions, scored) and
``DemoCollector`` (prompt + reference answer, for SFT). Both return a 1-D ``Batch`` over sequences."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from pickaxe.data.batch import Batch
from pickaxe.envs.text.example import Example
from pickaxe.envs.text.prompt_env import PromptEnv
from pickaxe.envs.text.rewards import RewardFailedError, RewardFailure, RewardScores, RewardWarning
from pickaxe.models.lm import Autocast, completion_logprobs
from pickaxe.models.tokenizer import render_prompt
from pickaxe.rollout.engines.base import Completion, Engine, SamplingParams
from pickaxe.utils import visiting

if TYPE_CHECKING:
    from pickaxe.rollout.pipelined import RolloutScheduler


def pack(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_token_id: int,
    completion_logprobs: Sequence[Sequence[float]] | None = None,
    completion_masks: Sequence[Sequence[bool] | None] | None = None,
) -> dict[str, torch.Tensor]:
    """Lay out prompt/completion pairs as one padded ``[B, P + T]`` block: prompts left-padded to the longest
    (``P``), completions right after them and right-padded (``T``).

    Returns ``input_ids``, ``attention_mask`` (1 on real tokens), ``loss_mask`` (1 exactly on completion tokens,
    EOS included when present; 0 on prompt and padding; with ``completion_masks``, a completion's mask where it
    has one: a multi-turn episode's model tokens) and, given ``completion_logprobs``, ``logprob`` (the sampler's
    log-prob on completion tokens, 0 elsewhere).
    """
    B = len(prompts)
    P = max(len(p) for p in prompts)
    T = max(1, max(len(c) for c in completions))
    ids = np.full((B, P + T), pad_token_id, dtype=np.int64)
    attn = np.zeros((B, P + T), dtype=np.int64)
    loss = np.zeros((B, P + T), dtype=np.bool_)
    logp = np.zeros((B, P + T), dtype=np.float32)
    for r, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[r, P - len(p) : P] = p
        ids[r, P : P + len(c)] = c
        attn[r, P - len(p) : P + len(c)] = 1
        mask = completion_masks[r] if completion_masks is not None else None
        loss[r, P : P + len(c)] = True if mask is None else np.asarray(mask, dtype=np.bool_)
        if completion_logprobs is not None:
            logp[r, P : P + len(c)] = completion_logprobs[r]
    out = {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(attn),
        "loss_mask": torch.from_numpy(loss),
    }
    if completion_logprobs is not None:
        out["logprob"] = torch.from_numpy(logp)
    return out


def encode_prompts(tokenizer: Any, examples: Sequence[Example]) -> list[list[int]]:
    """Token ids of each prompt as the policy sees it (:func:`~pickaxe.models.tokenizer.render_prompt`: through the
    tokenizer's chat template when it has one, else the plain encoding with the tokenizer's own special tokens)."""
    return [render_prompt(tokenizer, ex.prompt) for ex in examples]


def completion_text(tokenizer: Any, token_ids: Sequence[int], eos_token_id: int) -> str:
    """The text a reward function sees: the completion's tokens before EOS, special tokens dropped."""
    ids = list(token_ids)
    if ids and ids[-1] == eos_token_id:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=True)


def score_completions(env: Any, examples: Sequence[Example], completions: Sequence[Completion], tokenizer: Any) -> Any:
    """``env.score_batch`` of every completion against the example of its prompt (``examples[c.prompt_index]``): the
    text it carries (a multi-turn episode's final answer) or else its decoded tokens (:func:`completion_text`), and
    an episode's counts when completions carry them."""
    eos = int(tokenizer.eos_token_id)
    texts = [c.text if c.text is not None else completion_text(tokenizer, c.token_ids, eos) for c in completions]
    infos = [c.info for c in completions] if any(c.info is not None for c in completions) else None
    return env.score_batch([examples[c.prompt_index] for c in completions], texts, infos)


class TextCollector:
    """Samples ``prompts`` training prompts from ``env``, ``sampling.n`` completions each (a group), scores them.

    ``collect()`` returns a 1-D ``Batch`` over the ``prompts * n`` completions with the DESIGN LLM keys:
    ``input_ids``, ``attention_mask``, ``loss_mask`` (see ``pack``), ``logprob`` (sampler), ``ref_logprob``
    (given a ``reference`` model; same temperature, no top-k/top-p; completion tokens only, ``ref_rows`` sequences
    per forward, bf16 autocast with ``precision="bf16"``; with ``share_prompts`` each prompt's forward pass is
    shared by its completions, see :mod:`pickaxe.data.shared_prefix`), ``reward``, ``advantage`` (zeros: the
    algorithm computes it), ``group`` (a prompt id unique over the run), ``valid`` and ``policy_version``.

    Rewards are scored a batch at a time (``PromptEnv.score_batch``: batched rewards such as a reward model see
    every completion in one call). A completion that a trained-on reward cannot score (it raised or returned NaN or
    inf) is excluded from the update: ``valid`` False, ``loss_mask`` all 0, a ``group`` of its own (a negative id
    unique over the run, so the group statistics of GRPO, RLOO and REINFORCE++-baseline over the other completions
    of its prompt are exactly those of the valid ones, and its own advantage is 0) and as ``reward`` the mean of
    its group's valid rewards (so reward statistics are not skewed). A ``RewardWarning`` per failing reward and
    batch names the count and the first failing sample; ``rollout/reward/failed`` counts the excluded samples. A
    reward that fails on every completion of a batch, or a batch with no valid completion, raises
    ``RewardFailedError``.

    Before generating, the engine is synced to ``policy`` tagged ``version_fn()`` (the learner's update count).
    ``policy_version`` is per completion: the version that generated it (``Completion.version`` when the engine
    reports it, else the synced one). ``rollout/staleness_mean`` and ``rollout/staleness_max`` are how many versions
    the batch's completions are behind the learner at update time (0 unless generation runs ahead).

    Engine workers (``--dist.placement separate``): in sync mode ``engine`` is a
    :class:`~pickaxe.dist.llm_engines.EngineGroup` used through the ``Engine`` protocol; in pipelined and async mode
    a ``scheduler`` (:class:`~pickaxe.rollout.pipelined.RolloutScheduler`) samples the prompts and generates ahead,
    and its batches in flight are part of ``state_dict`` (exact resume). The engine's ``metrics()`` (weight sync,
    worker restarts) and the scheduler's (``rollout/dropped_stale``) join the collector's. With
    ``reference_on_workers`` (pipelined and async mode) the reference is sent to the workers once (again after a
    ``load_state_dict``) and they score the reference log-probs of their completions right after generating them,
    so that forward pass also runs while the learner updates; completions that come without them are scored here.

    ``encode`` turns examples into first prompts (default :func:`encode_prompts`). Multi-turn episodes come from an
    :class:`~pickaxe.rollout.agent.AgentRollout` as the ``engine`` (with its ``encode``): their completions carry a
    loss mask (the model's tokens only), the final answer the rewards score and the episode counts the
    per-episode rewards read.
    """

    def __init__(
        self,
        env: PromptEnv,
        engine: Engine,
        tokenizer: Any,
        prompts: int = 8,
        sampling: SamplingParams | None = None,
        policy: nn.Module | None = None,
        reference: nn.Module | None = None,
        version_fn: Callable[[], int] | None = None,
        device: str | torch.device = "cpu",
        ref_rows: int = 256,
        precision: Autocast = "off",
        offload_reference: bool = False,
        scheduler: RolloutScheduler | None = None,
        reference_on_workers: bool = False,
        encode: Callable[[Sequence[Example]], list[list[int]]] | None = None,
        share_prompts: bool = True,
    ) -> None:
        self.env = env
        self.share_prompts = share_prompts
        self.encode = encode or (lambda examples: encode_prompts(tokenizer, examples))
        self.scheduler = scheduler
        self.reference_on_workers = reference_on_workers and scheduler is not None and reference is not None
        self._reference_sent = False
        self.engine = engine
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.sampling = sampling or SamplingParams(n=8)
        self.policy = policy
        self.reference = reference
        self.version_fn = version_fn or (lambda: 0)
        self.device = torch.device(device)
        self.ref_rows = ref_rows
        self.precision = precision
        self.offload_reference = offload_reference
        if reference is not None and offload_reference:
            reference.to("cpu")
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.groups_seen = 0
        self.total_steps = 0
        self._metrics: dict[str, float] = {}

    def collect(self) -> Batch:
        """One batch of ``prompts * sampling.n`` scored completions."""
        t0 = time.perf_counter()
        version = int(self.version_fn())
        temperature = self.sampling.temperature if self.sampling.temperature > 0 else 1.0
        if self.scheduler is not None:
            if self.reference_on_workers and not self._reference_sent:
                assert self.reference is not None
                self.engine.set_reference(self.reference, temperature, self.precision, self.ref_rows)  # type: ignore[attr-defined]
                self._reference_sent = True
            examples, prompt_ids, completions = self.scheduler.next_batch()
        else:
            examples = self.env.sample(self.prompts)
            prompt_ids = self.encode(examples)
            if self.policy is not None:
                self.engine.sync_weights(self.policy, version)
            completions = self.engine.generate(prompt_ids, self.sampling)
        versions = [version if c.version is None else c.version for c in completions]
        t1 = time.perf_counter()
        scores = score_completions(self.env, examples, completions, self.tokenizer)
        self._report_failures(scores)
        group_of = [c.prompt_index for c in completions]
        rewards = _fill_failed(scores.total, scores.valid, group_of)
        t2 = time.perf_counter()
        data = pack(
            [prompt_ids[c.prompt_index] for c in completions],
            [c.token_ids for c in completions],
            self.pad_token_id,
            [c.logprobs for c in completions],
            [c.loss_mask for c in completions],
        )
        n = len(completions)
        valid = torch.tensor(scores.valid, dtype=torch.bool)
        data["loss_mask"] &= valid[:, None]
        data["valid"] = valid
        data["reward"] = torch.tensor(rewards, dtype=torch.float32)
        data["advantage"] = torch.zeros(n)
        data["group"] = torch.tensor(
            [
                self.groups_seen + g if ok else -(self.total_steps + i + 1)
                for i, (g, ok) in enumerate(zip(group_of, scores.valid, strict=True))
            ]
        )
        data["policy_version"] = torch.tensor(versions, dtype=torch.long)
        batch = TensorDict(data, batch_size=[n]).to(self.device)
        if self.reference is not None and all(c.ref_logprobs is not None for c in completions):
            ref = pack(
                [prompt_ids[c.prompt_index] for c in completions],
                [c.token_ids for c in completions],
                self.pad_token_id,
                [c.ref_logprobs or [] for c in completions],
            )["logprob"]  # multi-turn episodes come from an in-process rollout, never with reference log-probs
            mask = data["loss_mask"]  # 0 off the loss mask, as the learner's own scoring (failed samples included)
            batch["ref_logprob"] = torch.where(mask, ref, torch.zeros_like(ref)).to(self.device)
        elif self.reference is not None:
            batch["ref_logprob"] = self.reference_logprobs(batch, temperature)
        t3 = time.perf_counter()
        self.groups_seen += len(examples)
        self.total_steps += n
        self._metrics = self._summarise(completions, rewards, scores, batch)
        staleness = [version - v for v in versions]
        self._metrics["rollout/staleness_mean"] = float(np.mean(staleness))
        self._metrics["rollout/staleness_max"] = float(max(staleness))
        for source in (self.engine, self.scheduler):
            if source is not None and hasattr(source, "metrics"):
                self._metrics.update(source.metrics())
        gen_tokens = sum(len(c.token_ids) for c in completions)
        self._metrics.update(
            {
                "time/generate_s": t1 - t0,
                "time/reward_s": t2 - t1,
                "time/ref_logprob_s": t3 - t2,
                "time/generate_tokens_per_s": gen_tokens / max(t1 - t0, 1e-9),
            }
        )
        return batch

    def reference_logprobs(self, batch: Batch, temperature: float) -> torch.Tensor:
        """The frozen reference's log-probs of ``batch``'s completion tokens; with ``offload_reference`` the
        reference visits the batch's device for this call only."""
        assert self.reference is not None
        device = batch["input_ids"].device
        with visiting(self.reference, device if self.offload_reference else None), torch.no_grad():
            return completion_logprobs(
                self.reference,
                batch["input_ids"],
                batch["attention_mask"],
                batch["loss_mask"],
                temperature,
                precision=self.precision,
                rows=self.ref_rows,
                mode="shared-prefix" if self.share_prompts else "padded",
            )

    def close(self) -> None:
        """Stop the engine's workers, if it has any (engine workers; an in-process engine has nothing to stop)."""
        if hasattr(self.engine, "close"):
            self.engine.close()

    @property
    def envs(self) -> Any:
        """What ``Trainer.close()`` closes: the engine workers (an ``EngineGroup``), None for an engine in this
        process. Without it the workers would live until the Trainer is garbage-collected."""
        return self.engine if hasattr(self.engine, "close") else None

    def decode(self, token_ids: Sequence[int]) -> str:
        """Completion text: the tokens before EOS, special tokens dropped."""
        return completion_text(self.tokenizer, token_ids, self.eos_token_id)

    def _report_failures(self, scores: RewardScores) -> None:
        """One ``RewardWarning`` per reward that failed on some completions; ``RewardFailedError`` when a reward
        failed on all of them or no completion is left to train on."""
        n = len(scores.valid)
        by_reward: dict[str, list[RewardFailure]] = {}
        for failure in scores.failures:
            by_reward.setdefault(failure.reward, []).append(failure)
        weights = dict(zip(self.env.reward_names, (w for _, w in self.env.rewards), strict=True))
        for name, failed in by_reward.items():
            if len(failed) == n:
                raise RewardFailedError(
                    f"reward {name!r} failed on all {n} completions of the batch; the first: {failed[0].describe()}; "
                    "fix the reward function"
                ) from failed[0].exception
            effect = "excluded from the update" if weights[name] != 0 else "left out of its metric (weight 0)"
            warnings.warn(
                f"reward {name!r} failed on {len(failed)} of {n} completions, {effect}; the first: "
                f"{failed[0].describe()}",
                RewardWarning,
                stacklevel=3,
            )
        if not any(scores.valid):
            first = next(f for f in scores.failures if weights[f.reward] != 0)
            raise RewardFailedError(
                f"no completion of the batch could be scored (rewards failed on every one); the first: reward "
                f"{first.reward!r} on {first.describe()}; fix the reward functions"
            ) from first.exception

    def _summarise(
        self, completions: list[Completion], rewards: list[float], scores: RewardScores, batch: Batch
    ) -> dict[str, float]:
        valid = np.asarray(scores.valid, dtype=np.bool_)
        r = np.asarray(rewards, dtype=np.float64)[valid]
        by_group: dict[int, list[float]] = {}
        for c, value, ok in zip(completions, rewards, scores.valid, strict=True):
            if ok:
                by_group.setdefault(c.prompt_index, []).append(value)
        out = {
            "rollout/reward_mean": float(r.mean()),
            "rollout/reward_std": float(r.std()),
            "rollout/return_mean": float(r.mean()),
            "rollout/completion_length": float(np.mean([len(c.token_ids) for c in completions])),
            "rollout/truncated_fraction": float(np.mean([not c.finished for c in completions])),
            "rollout/solved_groups": float(np.mean([np.std(g) == 0 for g in by_group.values()])),
            "rollout/policy_version": float(batch["policy_version"].min()),
            "rollout/reward/failed": float((~valid).sum()),
        }
        for name, values in scores.parts.items():
            out[f"rollout/reward/{name}"] = float(np.nanmean(values))
        return out

    def state_support(self) -> str:
        """Prompt stream and sampling RNG are captured completely (``exact`` resume)."""
        return "exact"

    def metrics(self) -> dict[str, float]:
        """Reward statistics, completion lengths and timings of the last collect."""
        return dict(self._metrics)

    def state_dict(self) -> dict[str, Any]:
        """Env sampling state, engine RNG, counters and the reference model's weights."""
        state: dict[str, Any] = {
            "env": self.env.state_dict(),
            "groups_seen": self.groups_seen,
            "steps": self.total_steps,
        }
        if self.scheduler is not None:  # first: it waits for the batches in flight, which advances the samplers
            state["rollout"] = self.scheduler.state_dict()
        if hasattr(self.engine, "state_dict"):
            state["engine"] = self.engine.state_dict()
        if self.reference is not None:  # the starting policy; a resumed run cannot rebuild it otherwise
            state["reference"] = self.reference.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], reseed: int | None = None) -> None:
        """Restore what ``state_dict`` returned (exactly; ``reseed`` is unused, the state is complete)."""
        self.env.load_state_dict(state["env"])
        self.groups_seen, self.total_steps = int(state["groups_seen"]), int(state["steps"])
        if self.scheduler is not None and "rollout" in state:
            self.scheduler.load_state_dict(state["rollout"])
        if "engine" in state and hasattr(self.engine, "load_state_dict"):
            self.engine.load_state_dict(state["engine"])
        if "reference" in state and self.reference is not None:
            self.reference.load_state_dict(state["reference"])
            self._reference_sent = False  # the workers get the restored reference before the next batch


def _fill_failed(total: list[float], valid: list[bool], group_of: list[int]) -> list[float]:
    """``total`` with each invalid sample's reward replaced by the mean valid reward of its group (of the batch
    when its whole group failed): a neutral value, for metrics; the sample is not trained on."""
    ok = [t for t, v in zip(total, valid, strict=True) if v]
    batch_mean = float(np.mean(ok)) if ok else 0.0
    out = []
    for t, v, g in zip(total, valid, group_of, strict=True):
        if v:
            out.append(t)
            continue
        same = [x for x, w, h in zip(total, valid, group_of, strict=True) if w and h == g]
        out.append(float(np.mean(same)) if same else batch_mean)
    return out


class DemoCollector:
    """Supervised batches for SFT: ``batch_size`` training examples of ``env`` as prompt + reference answer +
    EOS, with ``loss_mask`` on the answer and EOS. Keys ``input_ids``, ``attention_mask``, ``loss_mask``,
    ``group``."""

    def __init__(
        self, env: PromptEnv, tokenizer: Any, batch_size: int = 64, device: str | torch.device = "cpu"
    ) -> None:
        self.env = env
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.total_steps = 0
        self._tokens = 0

    def collect(self) -> Batch:
        """One batch of demonstrations."""
        examples = self.env.sample(self.batch_size)
        missing = [ex.prompt for ex in examples if ex.answer is None]
        if missing:
            raise ValueError(f"SFT needs a reference answer for every prompt; {missing[0]!r} has none")
        prompts = encode_prompts(self.tokenizer, examples)
        answers = [
            [*self.tokenizer(ex.answer, add_special_tokens=False)["input_ids"], self.eos_token_id] for ex in examples
        ]
        data = pack(prompts, answers, self.pad_token_id)
        data["group"] = torch.arange(self.total_steps, self.total_steps + len(examples))
        self.total_steps += len(examples)
        self._tokens = int(data["loss_mask"].sum())
        return TensorDict(data, batch_size=[len(examples)]).to(self.device)

    def metrics(self) -> dict[str, float]:
        """Target tokens in the last batch."""
        return {"rollout/target_tokens": float(self._tokens)}

    def state_dict(self) -> dict[str, Any]:
        """Env sampling state and counter."""
        return {"env": self.env.state_dict(), "steps": self.total_steps}

    def load_state_dict(self, state: dict[str, Any], reseed: int | None = None) -> None:
        """Restore what ``state_dict`` returned (exactly; ``reseed`` is unused, the state is complete)."""
        self.env.load_state_dict(state["env"])
        self.total_steps = int(state["steps"])

    def state_support(self) -> str:
        """The prompt stream's state is captured completely."""
        return "exact"
