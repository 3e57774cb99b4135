"""GRPO and its variants (Dr. GRPO, DAPO, GSPO) as options of one algorithm, with KL to a frozen reference,
truncated importance sampling and built-in on-policy checks.

Per batch of groups (``G`` completions per prompt): advantages are group-normalised rewards; the loss is PPO's
clipped surrogate per token (or per sequence, GSPO), aggregated over the generated tokens with the chosen mode,
normalised by the counts of the whole optimizer step so micro-batching does not change the update.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from pickaxe.algos.configs import GRPOConfig
from pickaxe.algos.core import clipped_surrogate
from pickaxe.algos.llm_core import (
    LMAlgorithm,
    aggregate,
    group_advantages,
    kl_estimate,
    kl_shaped_reward,
    masked,
    masked_max,
    micro_batches,
    sequence_log_ratio,
    sequence_sum,
    token_log_ratio,
    truncated_is_weight,
    zero_variance_groups,
)
from pickaxe.data.batch import Batch
from pickaxe.models.lm import chunked_logprobs, sequence_logprobs
from pickaxe.rollout.engines.base import SamplingParams


def grpo_advantages(
    reward: torch.Tensor,
    group: torch.Tensor,
    cfg: GRPOConfig,
    logprob: torch.Tensor | None = None,
    ref_logprob: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-sequence advantages of one batch: group-normalised rewards (``cfg.scale_rewards``), from rewards minus
    ``cfg.kl_coef`` x the sequence's summed KL estimate when ``cfg.kl_in == "reward"`` (then ``logprob``, the
    sampler's, ``ref_logprob`` and ``mask`` are needed). Returns the advantages and metrics."""
    metrics: dict[str, float] = {}
    if cfg.kl_coef > 0 and cfg.kl_in == "reward":
        if logprob is None or ref_logprob is None or mask is None:
            raise ValueError("kl_in='reward' needs the sampler log-probs, reference log-probs and the loss mask")
        reward, kl_seq = kl_shaped_reward(reward, logprob, ref_logprob, mask, cfg.kl_coef, cfg.kl_estimator)
        metrics["kl/reward_penalty"] = float(kl_seq.mean())
    return group_advantages(reward, group, cfg.scale_rewards), metrics


def grpo_loss(
    logprob: torch.Tensor,
    mb: Batch,
    cfg: GRPOConfig,
    total_tokens: float,
    total_seqs: float,
    norm: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO loss of one micro-batch, given the learner's per-token ``logprob`` of its tokens.

    ``mb`` holds ``loss_mask``, ``advantage`` (per sequence), ``old_logprob`` (the behaviour policy's), optionally
    ``tis_weight`` and ``ref_logprob``. Returns the loss (already divided by the whole step's counts) and
    per-micro-batch sums for metrics. Log-probs may be ``-inf`` off the mask (top-k/top-p): every input is
    masked before any arithmetic, so loss and gradients stay finite.
    """
    mask = mb["loss_mask"].bool()
    # 1. importance ratio of the current policy to the one that sampled: per token, or GSPO's per sequence
    if cfg.ratio_level == "sequence":
        log_ratio = sequence_log_ratio(logprob, mb["old_logprob"], mask)
    else:
        log_ratio = token_log_ratio(logprob, mb["old_logprob"], mask)
    # 2. PPO's clipped surrogate with the sequence's advantage on each of its tokens
    advantage = mb["advantage"].unsqueeze(-1).expand_as(logprob)
    pg, ratio, clipped = clipped_surrogate(
        log_ratio, torch.zeros_like(log_ratio), advantage, cfg.clip_low, cfg.clip_high
    )
    # 3. truncated importance sampling corrects a sampler whose probabilities differ from the learner's
    tis_weight = mb.get("tis_weight", None)
    if tis_weight is not None:
        pg = pg * masked(tis_weight, mask)
    # 4. aggregate over generated tokens, normalised by the whole optimizer step's counts
    loss = aggregate(pg, mask, cfg.aggregation, total_tokens, total_seqs, norm)
    # 5. KL to the frozen reference, as a loss term
    kl_sum = logprob.new_zeros(())
    if cfg.kl_coef > 0 and cfg.kl_in == "loss":
        kl = kl_estimate(logprob, mb["ref_logprob"], cfg.kl_estimator, mask)
        loss = loss + cfg.kl_coef * aggregate(kl, mask, cfg.aggregation, total_tokens, total_seqs, norm)
        kl_sum = sequence_sum(kl.detach(), mask).sum()
    stats = {
        "tokens": mask.sum(),
        "clipped": (clipped & mask).sum(),
        "ratio_sum": masked(ratio.detach(), mask).sum(),
        "kl_sum": kl_sum,
    }
    return loss, stats


class GRPO(LMAlgorithm):
    """Group Relative Policy Optimization on a causal LM.

    ``sampling`` must be the collector's sampling params: learner log-probs use the same temperature/top-k/top-p
    processing as the sampler, and ``max_new_tokens`` is the default ``loss_norm``. Batches come from a
    ``TextCollector`` (``ref_logprob`` needed when ``kl_coef > 0``).
    """

    def __init__(
        self, model: nn.Module, config: GRPOConfig | None = None, sampling: SamplingParams | None = None, seed: int = 0
    ) -> None:
        super().__init__(model, config or GRPOConfig())
        self.sampling = sampling or SamplingParams()
        t = self.sampling.temperature
        self._processing = (t if t > 0 else 1.0, self.sampling.top_k, self.sampling.top_p)
        self.generator = torch.Generator().manual_seed(seed)

    def learner_logprobs(self, mb: Batch) -> torch.Tensor:
        """Per-token log-probs of ``mb`` under the current weights, processed like the sampler's."""
        return sequence_logprobs(self.model, mb["input_ids"], mb["attention_mask"], *self._processing)

    def update(self, batch: Batch) -> dict[str, float]:
        """Advantages, optional dynamic sampling and TIS, then ``epochs x mini_batches`` optimizer steps."""
        cfg = self.config
        batch = batch.to(next(self.model.parameters()).device)
        metrics: dict[str, float] = {}
        data = self.with_advantages(batch, metrics)
        n = data.batch_size[0]
        if n == 0:  # every group was uniform: nothing to learn from
            self.version += 1
            return {**metrics, "grpo/skipped": 1.0}
        tis_diff = self.add_behaviour_logprobs(data, metrics)
        norm = float(cfg.loss_norm or self.sampling.max_new_tokens)
        stale = bool((data["policy_version"] != self.version).any())
        totals = {"tokens": 0.0, "clipped": 0.0, "ratio_sum": 0.0, "kl_sum": 0.0}
        losses, grad_norms, lr = [], [], 0.0
        diffs: list[torch.Tensor] = []  # |learner - sampler| on generated tokens, before the first step
        self.model.train()
        for epoch in range(cfg.epochs):
            order = torch.randperm(n, generator=self.generator) if cfg.mini_batches > 1 else torch.arange(n)
            for k, idx in enumerate(order.chunk(cfg.mini_batches)):
                mini = data[idx.to(data.device)]
                step_tokens, step_seqs = float(mini["loss_mask"].sum()), float(mini.batch_size[0])
                loss_total = 0.0
                for j, mb in enumerate(micro_batches(mini, cfg.micro_batch_size)):
                    logprob = self.learner_logprobs(mb)
                    if epoch == 0 and k == 0:  # weights not yet stepped: learner and sampler should agree
                        diff = (logprob.detach() - mb["logprob"]).abs()
                        diffs.append(diff[mb["loss_mask"]])
                        if j == 0:
                            self._check_on_policy(diff, mb, stale)
                    loss, stats = grpo_loss(logprob, mb, cfg, step_tokens, step_seqs, norm)
                    loss.backward()
                    loss_total += loss.item()
                    for key, value in stats.items():
                        totals[key] += float(value)
                grad_norm, lr = self.optimizer_step(loss_total)
                losses.append(loss_total)
                grad_norms.append(grad_norm)
        self.model.eval()
        self.version += 1
        diff = tis_diff if tis_diff is not None else torch.cat(diffs)
        tokens = max(totals["tokens"], 1.0)
        metrics.update(
            {
                "loss/policy": sum(losses) / len(losses),
                "grad_norm": sum(grad_norms) / len(grad_norms),
                "grpo/lr": lr,
                "grpo/advantage_abs_mean": float(data["advantage"].abs().mean()),
                "grpo/clip_fraction": totals["clipped"] / tokens,
                "grpo/ratio_mean": totals["ratio_sum"] / tokens,
                "check/logprob_diff_mean": float(diff.mean()) if diff.numel() else 0.0,
                "check/logprob_diff_max": float(diff.max()) if diff.numel() else 0.0,
                "grpo/sequences": float(n),
            }
        )
        if cfg.kl_coef > 0 and cfg.kl_in == "loss":
            metrics["kl/mean"] = totals["kl_sum"] / max(float(cfg.epochs * n), 1.0)
        return metrics

    def with_advantages(self, batch: Batch, metrics: dict[str, Any] | None = None) -> Batch:
        """Write ``grpo_advantages`` of ``batch``'s rewards into ``batch["advantage"]`` (metrics into ``metrics``);
        return it, without the zero-variance groups under dynamic sampling."""
        cfg = self.config
        metrics = {} if metrics is None else metrics
        advantage, info = grpo_advantages(
            batch["reward"],
            batch["group"],
            cfg,
            batch.get("logprob", None),
            batch.get("ref_logprob", None),
            batch.get("loss_mask", None),
        )
        batch["advantage"] = advantage
        metrics.update(info)
        if not cfg.dynamic_sampling:
            return batch
        keep = ~zero_variance_groups(batch["reward"], batch["group"])
        metrics["grpo/kept_fraction"] = float(keep.float().mean())
        return batch[keep]

    def add_behaviour_logprobs(self, data: Batch, metrics: dict[str, Any]) -> torch.Tensor | None:
        """``old_logprob``: the sampler's log-probs, or with TIS the learner's recomputed ones plus ``tis_weight``;
        with TIS, returns |learner - sampler log-prob| on the batch's generated tokens."""
        cfg = self.config
        if cfg.tis_cap is None:
            data["old_logprob"] = data["logprob"]
            return None
        ids, attn, mask = data["input_ids"], data["attention_mask"], data["loss_mask"]
        old = chunked_logprobs(self.model, ids, attn, cfg.micro_batch_size, *self._processing)
        data["old_logprob"] = old
        data["tis_weight"] = truncated_is_weight(old, data["logprob"], cfg.tis_cap, mask)
        metrics["tis/weight_mean"] = float(data["tis_weight"][mask].mean())
        return (old - data["logprob"]).abs()[mask]

    def _check_on_policy(self, diff: torch.Tensor, mb: Batch, stale: bool) -> None:
        """Warn when the first micro-batch's ratio is not 1: learner and sampler disagree on the same weights."""
        worst = float(masked_max(diff, mb["loss_mask"]))
        if worst <= self.config.ratio_tolerance:
            return
        if stale:
            reason = (
                f"the batch was sampled with policy version {int(mb['policy_version'].min())} but the learner is at "
                f"version {self.version} (stale weights in the engine: is sync_weights called?)"
            )
        elif self.config.tis_cap is None:
            reason = (
                "same policy version, so the engine's numerics or logits processing differ from the learner's "
                "(temperature/top-k/top-p, dtype, attention kernel); set --algo.tis-cap to correct for it"
            )
        else:
            reason = "engine and learner numerics differ; TIS is correcting for it"
        warnings.warn(
            f"GRPO on-policy check: on the first micro-batch the ratio should be 1 but max |learner - sampler "
            f"log-prob| = {worst:.2e} > {self.config.ratio_tolerance:.0e}: {reason}",
            RuntimeWarning,
            stacklevel=3,
        )
