"""GRPO and its variants (Dr. GRPO, DAPO, GSPO) as options of one algorithm, with KL to a frozen reference,
truncated importance sampling and built-in on-policy checks.

Per batch of groups (``G`` completions per prompt): advantages are group-normalised rewards; the loss is PPO's
clipped surrogate per token (or per sequence, GSPO), aggregated over the generated tokens with the chosen mode,
normalised by the counts of the whole optimizer step so micro-batching does not change the update.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pickaxe.algos.base import all_reduce
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
    masked_mean,
    plan_micro_batches,
    sequence_log_ratio,
    sequence_sum,
    token_log_ratio,
    truncated_is_weight,
    warn_off_policy,
    zero_variance_groups,
)
from pickaxe.algos.rlhf_core import reinforce_pp_advantages, rloo_advantages
from pickaxe.data.batch import Batch
from pickaxe.data.layout import sequence_bounds
from pickaxe.models.lm import shares_prompts
from pickaxe.rollout.engines.base import SamplingParams


def grpo_advantages(
    reward: torch.Tensor,
    group: torch.Tensor,
    cfg: GRPOConfig,
    logprob: torch.Tensor | None = None,
    ref_logprob: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Advantages of one batch, by ``cfg.advantage``: per sequence (``[B]``) group-normalised rewards
    (``cfg.scale_rewards``) or RLOO's leave-one-out ones, from rewards minus ``cfg.kl_coef`` x the sequence's summed
    KL estimate when ``cfg.kl_in == "reward"`` (then ``logprob``, the sampler's, ``ref_logprob`` and ``mask`` are
    needed); or per token (``[B, L]``) REINFORCE++'s whitened returns, the KL shaping each token's reward.
    Returns the advantages and metric tensors (not yet read from the device): ``kl/seq_sum_mean`` (the
    per-sequence summed KL, averaged over sequences) and ``kl/token_mean`` (per generated token)."""
    metrics: dict[str, torch.Tensor] = {}
    kl_reward = cfg.kl_coef > 0 and cfg.kl_in == "reward"
    if kl_reward and (logprob is None or ref_logprob is None or mask is None):
        raise ValueError("kl_in='reward' needs the sampler log-probs, reference log-probs and the loss mask")
    if cfg.advantage.startswith("reinforce++"):
        if logprob is None or mask is None:
            raise ValueError(f"advantage={cfg.advantage} needs the sampler log-probs and the loss mask")
        ref = ref_logprob if kl_reward else logprob  # no KL in the reward: k1 of a policy against itself is 0
        baseline = group if cfg.advantage == "reinforce++-baseline" else None
        coef = cfg.kl_coef if kl_reward else 0.0
        estimator = cfg.kl_estimator_in_effect
        advantage, _ = reinforce_pp_advantages(reward, logprob, ref, mask, coef, baseline, estimator=estimator)
        if kl_reward:
            metrics = _kl_metrics(sequence_sum(kl_estimate(logprob, ref, estimator, mask), mask), mask)
        return advantage, metrics
    if kl_reward:
        reward, kl_seq = kl_shaped_reward(reward, logprob, ref_logprob, mask, cfg.kl_coef, cfg.kl_estimator_in_effect)
        metrics = _kl_metrics(kl_seq, mask)
    if cfg.advantage == "rloo":
        return rloo_advantages(reward, group), metrics
    return group_advantages(reward, group, cfg.scale_rewards), metrics


def _kl_metrics(kl_seq: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """``kl/seq_sum_mean`` and ``kl/token_mean`` of per-sequence summed KL estimates ``kl_seq`` over ``mask``."""
    return {"kl/seq_sum_mean": kl_seq.mean(), "kl/token_mean": kl_seq.sum() / mask.sum().clamp(min=1)}


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
    # 2. PPO's clipped surrogate with the sequence's advantage on each of its tokens (or per-token advantages)
    advantage = mb["advantage"]
    advantage = advantage if advantage.ndim == 2 else advantage.unsqueeze(-1).expand_as(logprob)
    advantage = masked(advantage, mask)
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
        kl = kl_estimate(logprob, mb["ref_logprob"], cfg.kl_estimator_in_effect, mask)
        loss = loss + cfg.kl_coef * aggregate(kl, mask, cfg.aggregation, total_tokens, total_seqs, norm)
        kl_sum = sequence_sum(kl.detach(), mask).sum()
    stats = {
        "tokens": mask.sum(),
        "clipped": (clipped & mask).sum(),
        "ratio_sum": masked(ratio.detach(), mask).sum(),
        "kl_sum": kl_sum,
    }
    return loss, stats


_SUMMED = ("tokens", "clipped", "ratio_sum", "kl_sum", "diff_sum")
"""Final reads that are sums over a learner's micro-batches (summed over data-parallel learners)."""
_MAXED = ("diff_max", "diff_max_mb0")
"""Final reads that are maxima over a learner's micro-batches (0 where it had none; the max over learners)."""


def _split_reads(final: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``final`` as (values alike on every learner, with the maxima already reduced over the learners; sums to
    reduce in the optimizer step's collective)."""
    if not final:
        return {}, {}
    maxed = all_reduce(torch.stack([final[k] for k in _MAXED]), "max")
    alike = {k: v for k, v in final.items() if k not in _SUMMED and k not in _MAXED}
    alike.update(zip(_MAXED, maxed.unbind(), strict=True))
    return alike, {k: final[k] for k in _SUMMED}


class GRPO(LMAlgorithm):
    """Group Relative Policy Optimization on a causal LM.

    ``sampling`` must be the collector's sampling params: learner log-probs use the same temperature/top-k/top-p
    processing as the sampler, and ``max_new_tokens`` is the default ``loss_norm``. Batches come from a
    ``TextCollector`` (``ref_logprob`` needed when ``kl_coef > 0``). With data-parallel learners each computes its
    share of every optimizer step's micro-batches and of TIS's old log-probs (advantages are computed on every
    learner alike). ``reference`` (``--dist.shard fsdp`` with ``kl_coef > 0``): the frozen KL reference, kept in
    this algorithm's state and sharded with the policy; each learner then scores its share of the batch's rows
    with it (``ref_logprob``, instead of the collector on rank 0).
    """

    supports_data_parallel = True
    supports_sharding = True

    def __init__(
        self,
        model: nn.Module,
        config: GRPOConfig | None = None,
        sampling: SamplingParams | None = None,
        seed: int = 0,
        reference: nn.Module | None = None,
    ) -> None:
        super().__init__(model, config or GRPOConfig(), reference)
        self.sampling = sampling or SamplingParams()
        t = self.sampling.temperature
        self._processing = (t if t > 0 else 1.0, self.sampling.top_k, self.sampling.top_p)
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def layout(self) -> str:
        """The micro-batch layout of the forward passes: ``shared-prefix`` (each prompt once per micro-batch) for the
        ``padded`` layout when ``share_prompts`` is on and the model's attention takes a 4-D mask, else the config's."""
        cfg = self.config
        if cfg.share_prompts and cfg.micro_batch_layout == "padded" and shares_prompts(self.model):
            return "shared-prefix"
        return cfg.micro_batch_layout

    def state_dict(self) -> dict[str, Any]:
        """``LMAlgorithm``'s state and the mini-batch shuffling generator (so a resume with ``mini_batches`` > 1
        draws the same mini-batches)."""
        return {**super().state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (a checkpoint from before the generator was saved keeps the fresh
        generator)."""
        super().load_state_dict(state)
        if "generator" in state:
            self.generator.set_state(state["generator"])

    def update(self, batch: Batch) -> dict[str, float]:
        """Advantages, optional dynamic sampling and TIS, then ``epochs x mini_batches`` optimizer steps.

        Device synchronisations: one read of the sequence bounds to plan the micro-batches (and one of the token ids
        when prompts are shared, see ``layout``), one per optimizer step
        (the guard's loss and gradient norm; the last step also reads every metric), plus one for dynamic sampling
        (the number of kept sequences).
        """
        cfg = self.config
        reads: dict[str, torch.Tensor] = {}  # metric tensors, read from the device with the last optimizer step
        data = batch.to(self.device)
        self.add_reference_logprobs(data, self._processing[0])  # sharded with a KL reference: scored here
        data = self.with_advantages(data, reads)
        n = data.batch_size[0]
        if n == 0:  # every group was uniform: nothing to learn from
            self.version += 1
            return {**{k: float(v) for k, v in reads.items()}, "grpo/skipped": 1.0}
        tis_diff = self.add_behaviour_logprobs(data, reads)
        norm = float(cfg.loss_norm or self.sampling.max_new_tokens)
        bounds = sequence_bounds(data["attention_mask"], data["loss_mask"])
        layout = self.layout
        host_ids = data["input_ids"].cpu().numpy() if layout == "shared-prefix" else None  # planned once per update
        zero = torch.zeros((), device=self.device)
        totals = {"tokens": zero, "clipped": zero, "ratio_sum": zero, "kl_sum": zero}
        first = {"diff_sum": zero, "diff_max": zero, "diff_max_mb0": zero}  # before the first step: should be 0
        first_tokens, real, slots = 0, 0, 0
        grad_norms: list[float] = []
        losses: list[float] = []
        lr, extra = 0.0, []
        size = -(-n // cfg.mini_batches)
        steps = cfg.epochs * -(-n // size)  # fewer than mini_batches when the batch has fewer sequences
        self.model.train()
        for epoch in range(cfg.epochs):
            order = torch.randperm(n, generator=self.generator).tolist() if cfg.mini_batches > 1 else list(range(n))
            for k in range(cfg.mini_batches):
                mini = order[k * size : (k + 1) * size]
                if not mini:
                    continue
                step_tokens = float(sum(len(bounds.scored[r]) for r in mini))
                # rows without scored tokens (a sample a reward failed on: loss mask zeroed) are not sequences
                step_seqs = float(sum(1 for r in mini if len(bounds.scored[r]) > 0))
                loss_total = zero
                plan = plan_micro_batches(data["input_ids"], bounds, mini, cfg.micro_batch_size, layout, host_ids)
                if epoch == 0 and k == 0:  # counted over every learner's micro-batches (host numbers of the plan)
                    for _, layout in plan:
                        first_tokens += len(layout.targets)
                        real, slots = real + layout.real_tokens, slots + layout.slots
                for j, weight in self.share(len(plan)):
                    rows, layout = plan[j]
                    mb = data[torch.tensor(rows, device=self.device)]
                    logprob = self.forward_logprobs(layout, *self._processing)
                    if not weight:  # a sharded learner's padding pass: the others' collectives, no gradient
                        (grpo_loss(logprob, mb, cfg, step_tokens, max(step_seqs, 1.0), norm)[0] * 0.0).backward()
                        continue
                    if epoch == 0 and k == 0:  # weights not yet stepped: learner and sampler should agree
                        diff = masked((logprob.detach() - mb["logprob"]).abs(), mb["loss_mask"])
                        first["diff_sum"] = first["diff_sum"] + diff.sum()
                        first["diff_max"] = torch.maximum(first["diff_max"], diff.max())
                        if j == 0:
                            first["diff_max_mb0"] = diff.max()
                    loss, stats = grpo_loss(logprob, mb, cfg, step_tokens, max(step_seqs, 1.0), norm)
                    loss.backward()
                    loss_total = loss_total + loss.detach()
                    for key, value in stats.items():
                        totals[key] = totals[key] + value
                final = self._final_reads(data, reads, totals, first, tis_diff) if len(grad_norms) == steps - 1 else {}
                alike, sums = _split_reads(final)
                final = {**alike, **sums}  # the order optimizer_step returns them in
                values = torch.stack(list(alike.values())) if alike else None
                summed = torch.stack(list(sums.values())) if sums else None
                grad_norm, loss_value, lr, extra = self.optimizer_step(loss_total, values, summed)
                losses.append(loss_value)
                grad_norms.append(grad_norm)
        self.model.eval()
        self.version += 1
        got = dict(zip(final, extra, strict=True))
        tokens = max(got.pop("tokens"), 1.0)
        self._check_on_policy(got.pop("diff_max_mb0"), int(got.pop("oldest_version")))
        diff_sum, diff_max = got.pop("diff_sum"), got.pop("diff_max")
        if tis_diff is None:
            got["check/logprob_diff_mean"] = diff_sum / max(first_tokens, 1)
            got["check/logprob_diff_max"] = diff_max
        metrics = {
            "loss/policy": sum(losses) / len(losses),
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "grpo/lr": lr,
            "grpo/advantage_abs_mean": got.pop("advantage_abs_mean"),
            "grpo/clip_fraction": got.pop("clipped") / tokens,
            "grpo/ratio_mean": got.pop("ratio_sum") / tokens,
            "grpo/sequences": float(n),
            "perf/padding_fraction": 1.0 - real / max(slots, 1),
        }
        kl_sum = got.pop("kl_sum")
        if cfg.kl_coef > 0 and cfg.kl_in == "loss":
            metrics["kl/token_mean"] = kl_sum / tokens
            metrics["kl/seq_sum_mean"] = kl_sum / float(cfg.epochs * n)
        return self.sync_policy({**metrics, **got})

    def _final_reads(
        self,
        data: Batch,
        reads: dict[str, torch.Tensor],
        totals: dict[str, torch.Tensor],
        first: dict[str, torch.Tensor],
        tis_diff: torch.Tensor | None,
    ) -> dict[str, torch.Tensor]:
        """Every metric of the update as a named scalar device tensor, read with the last optimizer step."""
        adv = data["advantage"]
        out = {
            "advantage_abs_mean": masked_mean(adv.abs(), data["loss_mask"]) if adv.ndim == 2 else adv.abs().mean(),
            **totals,
            **first,
            "oldest_version": data["policy_version"].min(),
            **reads,
        }
        if tis_diff is not None:
            mask = data["loss_mask"].bool()
            out["check/logprob_diff_mean"] = masked_mean(tis_diff, mask)
            out["check/logprob_diff_max"] = masked_max(tis_diff, mask)
        return {k: v.detach().float().reshape(()) for k, v in out.items()}

    def with_advantages(self, batch: Batch, metrics: dict[str, Any] | None = None) -> Batch:
        """Write ``grpo_advantages`` of ``batch``'s rewards into ``batch["advantage"]`` (metric tensors into
        ``metrics``); return it, without the zero-variance groups under dynamic sampling."""
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
        metrics["grpo/kept_fraction"] = keep.float().mean()
        return batch[keep]

    def add_behaviour_logprobs(self, data: Batch, metrics: dict[str, Any]) -> torch.Tensor | None:
        """``old_logprob``: the sampler's log-probs, or with TIS the learner's recomputed ones plus ``tis_weight``
        (``tis/weight_mean`` into ``metrics`` as a tensor); with TIS, returns |learner - sampler log-prob| per
        token (0 off the loss mask)."""
        cfg = self.config
        if cfg.tis_cap is None:
            data["old_logprob"] = data["logprob"]
            return None
        mask = data["loss_mask"]
        mode = self.layout if self.layout in ("packed", "shared-prefix") else "padded"
        old = self.split_logprobs(self.model, data["input_ids"], data["attention_mask"], mask, self._processing, mode)
        data["old_logprob"] = old
        data["tis_weight"] = truncated_is_weight(old, data["logprob"], cfg.tis_cap, mask)
        metrics["tis/weight_mean"] = masked_mean(data["tis_weight"], mask)
        return masked((old - data["logprob"]).abs(), mask)

    def _check_on_policy(self, worst: float, oldest_version: int) -> None:
        """Warn when the first micro-batch's ratio is not 1: learner and sampler disagree on the same weights.
        Called after the update, with the version the learner had during it (``self.version - 1``)."""
        cfg = self.config
        tis = cfg.tis_cap is not None
        warn_off_policy("GRPO", worst, cfg.ratio_tolerance, oldest_version, self.version - 1, tis, self.allowed_lag)
