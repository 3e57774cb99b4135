"""Pieces shared by the LLM algorithms (SFT, GRPO and its variants): loss functions (pure functions of tensors,
tested against hand-computed values), micro-batching and the ``LMAlgorithm`` optimizer plumbing.

Shapes: per-sequence tensors are ``[B]``; per-token tensors are ``[B, L]`` aligned with ``input_ids`` (column ``j``
is about token ``j``), and ``mask`` (the Batch's ``loss_mask``) selects the generated tokens.

Off the mask, log-probs may be ``-inf`` (a prompt token outside the top-k/top-p of the processed logits), so every
piece replaces masked-out inputs with 0 through ``torch.where`` BEFORE any arithmetic: ``-inf - -inf`` or
``exp(inf)`` off the mask would give a NaN value whose gradient (0 x NaN) poisons every parameter, even though the
aggregation drops that value.
"""

from __future__ import annotations

import copy
import time
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.tensor import DTensor

from pickaxe.algos.base import Algorithm, all_reduce, clip_and_step, data_parallel, my_share
from pickaxe.algos.configs import Aggregation, KLEstimator
from pickaxe.algos.core import cosine_schedule
from pickaxe.data.layout import SequenceBounds, TokenLayout, plan_layout
from pickaxe.data.shared_prefix import plan_shared_prefix
from pickaxe.errors import NonFiniteError, PickaxeError
from pickaxe.models.host_optimizer import adamw_for
from pickaxe.models.lm import completion_logprobs, enable_checkpointing, layout_logprobs
from pickaxe.models.lora import SharedReference, is_lora
from pickaxe.models.sharding import (
    Offload,
    broadcast_module,
    compute_device,
    gather_into,
    group_device,
    is_meta,
    load_sharded,
    load_sharded_optimizer,
    local_tensor,
    scatter_into,
    shard_from,
    shard_model,
    through_root,
)

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def masked(values: torch.Tensor, mask: torch.Tensor | None, fill: float = 0.0) -> torch.Tensor:
    """``values`` on ``mask`` and ``fill`` elsewhere, through ``torch.where``: the gradient off the mask is exactly 0,
    whatever ``values`` holds there (``-inf`` included). ``mask`` None returns ``values``."""
    if mask is None:
        return values
    return torch.where(mask.bool(), values, torch.full_like(values, fill))


def group_advantages(reward: torch.Tensor, group: torch.Tensor, scale: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO's group-normalised advantages ``(r - mean_g) / (std_g + eps)``; ``scale=False`` gives Dr. GRPO's
    ``r - mean_g``. ``group`` holds any integer id per sequence; std is the unbiased (n - 1) one, 0 for a group
    of one."""
    ids, inverse = torch.unique(group, return_inverse=True)
    r = reward.float()
    count = torch.zeros(len(ids), device=r.device).index_add_(0, inverse, torch.ones_like(r))
    mean = torch.zeros(len(ids), device=r.device).index_add_(0, inverse, r) / count
    centered = r - mean[inverse]
    if not scale:
        return centered
    sq = torch.zeros(len(ids), device=r.device).index_add_(0, inverse, centered.pow(2))
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    return centered / (std[inverse] + eps)


def zero_variance_groups(reward: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: True for sequences whose group's rewards are all equal (they carry no GRPO signal; DAPO's
    dynamic sampling drops them)."""
    ids, inverse = torch.unique(group, return_inverse=True)
    r = reward.float()
    high = torch.full((len(ids),), -torch.inf, device=r.device).scatter_reduce(0, inverse, r, "amax")
    low = torch.full((len(ids),), torch.inf, device=r.device).scatter_reduce(0, inverse, r, "amin")
    return (high == low)[inverse]


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: Aggregation = "token-mean",
    total_tokens: float | torch.Tensor | None = None,
    total_seqs: float | None = None,
    norm: float = 1.0,
) -> torch.Tensor:
    """Reduce a per-token ``loss`` over ``mask`` to a scalar.

    * ``token-mean``: sum over every token / ``total_tokens`` (all sequences weigh by their length);
    * ``seq-mean-token-mean``: mean over tokens in each sequence, then sum / ``total_seqs``;
    * ``seq-mean-token-sum-norm``: sum over tokens in each sequence / ``norm`` (a constant, e.g. the generation
      budget: Dr. GRPO's length-unbiased form), then sum / ``total_seqs``.

    ``total_tokens`` and ``total_seqs`` are the counts of the whole optimizer step (all micro-batches), so the sum
    of the micro-batch losses equals the loss of the full batch (gradient accumulation is exact); they default to
    this call's own counts.
    """
    m = mask.bool()
    masked = torch.where(m, loss, torch.zeros_like(loss))
    if mode == "token-mean":
        denom = m.sum() if total_tokens is None else total_tokens
        return masked.sum() / denom
    seqs = float(loss.shape[0]) if total_seqs is None else total_seqs
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(-1) / m.sum(-1).clamp(min=1)
    elif mode == "seq-mean-token-sum-norm":
        per_seq = masked.sum(-1) / norm
    else:
        raise ValueError(f"unknown aggregation {mode!r}; choose one of {AGGREGATIONS}")
    return per_seq.sum() / seqs


def kl_estimate(
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    estimator: KLEstimator = "k3",
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from tokens sampled by the policy (Schulman's k1/k2/k3):
    with ``log_r = ref_logprob - logprob``: k1 ``-log_r``, k2 ``log_r**2 / 2``, k3 ``exp(log_r) - 1 - log_r``.

    With ``mask``, the estimate is 0 off the mask and on tokens the policy gives probability 0 (``logprob`` -inf:
    a token sampled by an older policy that the current top-k/top-p excludes; its importance weight is 0), with
    a zero gradient there.
    """
    if estimator not in ("k1", "k2", "k3"):
        raise ValueError(f"unknown KL estimator {estimator!r}; choose k1, k2 or k3")
    if mask is not None:
        mask = mask.bool() & torch.isfinite(logprob)
        logprob, ref_logprob = masked(logprob, mask), masked(ref_logprob, mask)
    log_r = ref_logprob - logprob
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r.pow(2)
    return log_r.exp() - 1.0 - log_r


def kl_shaped_reward(
    reward: torch.Tensor,
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
    estimator: KLEstimator = "k3",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The KL penalty in the reward (``kl_in=reward``): returns ``(reward - coef * kl_seq, kl_seq)`` where
    ``kl_seq`` is each sequence's summed per-token KL estimate over ``mask``. A sequence that drifts further from
    the reference gets a LOWER reward."""
    kl_seq = sequence_sum(kl_estimate(logprob, ref_logprob, estimator, mask), mask)
    return reward - coef * kl_seq, kl_seq


def sequence_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` sum of per-token ``values`` over ``mask``."""
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum(-1)


def token_log_ratio(logprob: torch.Tensor, old_logprob: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """PPO/GRPO's per-token log importance ratio ``log pi(y_t) - log pi_old(y_t)``; 0 off ``mask``."""
    return masked(logprob, mask) - masked(old_logprob, mask)


def sequence_log_ratio(logprob: torch.Tensor, old_logprob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's sequence-level log ratio, per token: ``sg[s_i] + log pi(y_t) - sg[log pi(y_t)]`` where ``s_i`` is
    the length-normalised sequence log ratio ``mean_t (log pi - log pi_old)``. Every token of a sequence shares the
    value ``s_i`` (so they are clipped together) and receives the gradient of its own log-prob scaled by it.
    Off the mask the gradient is 0; a token the current policy cannot produce (``logprob`` -inf) makes ``s_i``
    -inf (ratio 0) and gets no gradient."""
    m = mask.bool()
    seq = token_log_ratio(logprob, old_logprob, m).sum(-1) / m.sum(-1).clamp(min=1)
    live = masked(logprob, m & torch.isfinite(logprob))
    return seq.detach().unsqueeze(-1) + live - live.detach()


def truncated_is_weight(
    learner_logprob: torch.Tensor, sampler_logprob: torch.Tensor, cap: float, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Truncated importance sampling: per-token ``min(pi_learner / pi_sampler, cap)`` (no gradient), the
    correction for an engine whose probabilities differ from the learner's (e.g. vLLM in bf16); 1 off ``mask``."""
    return token_log_ratio(learner_logprob, sampler_logprob, mask).detach().exp().clamp(max=cap)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over ``mask`` (0 for an empty mask)."""
    m = mask.bool()
    return torch.where(m, values, torch.zeros_like(values)).sum() / m.sum().clamp(min=1)


def masked_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Max of ``values`` over ``mask`` (0 for an empty mask)."""
    m = mask.bool()
    if not m.any():
        return values.new_zeros(())
    return values[m].max()


def warn_off_policy(
    method: str,
    worst: float,
    tolerance: float,
    sampled_version: int,
    learner_version: int,
    tis: bool | None = None,
    allowed_lag: int = 0,
) -> None:
    """Warn when learner and sampler log-probs of the same tokens differ by more than ``tolerance`` (max
    ``worst``) before any optimizer step: the samples were drawn from another distribution than the policy the
    learner holds. The message says why: stale weights in the engine (``sampled_version`` behind
    ``learner_version``) or engine numerics; ``tis`` (None: the method has no TIS) says whether it is corrected.
    A batch up to ``allowed_lag`` versions behind the learner is stale by design (engine workers generating ahead,
    ``--dist.mode pipelined``/``async``, logged as ``rollout/staleness_*``): its policies differ, nothing to warn."""
    if worst <= tolerance or 0 < learner_version - sampled_version <= allowed_lag:
        return
    if sampled_version != learner_version:
        reason = (
            f"the batch was sampled with policy version {sampled_version} but the learner is at version "
            f"{learner_version} (stale weights in the engine: is sync_weights called?)"
        )
    elif tis is False:
        reason = (
            "same policy version, so the engine's numerics or logits processing differ from the learner's "
            "(temperature/top-k/top-p, dtype, attention kernel); set --algo.tis-cap to correct for it"
        )
    elif tis:
        reason = "engine and learner numerics differ; TIS is correcting for it"
    else:
        reason = (
            "same policy version, so the engine's numerics or logits processing differ from the learner's "
            "(temperature/top-k/top-p, dtype, attention kernel)"
        )
    warnings.warn(
        f"{method} on-policy check: before the first step learner and sampler should agree, but max |learner - "
        f"sampler log-prob| = {worst:.2e} > {tolerance:.0e}: {reason}",
        RuntimeWarning,
        stacklevel=3,
    )


def plan_micro_batches(
    input_ids: torch.Tensor,
    bounds: SequenceBounds,
    rows: list[int],
    size: int,
    layout: str = "padded",
    host_ids: np.ndarray | None = None,
) -> list[tuple[list[int], TokenLayout]]:
    """Cut sequences ``rows`` of a batch into micro-batches of ``size`` and lay each out for the model.

    ``layout``: ``padded`` keeps ``rows``' order, one sequence per model row; ``length-sorted`` orders them by
    length first (similar lengths share a micro-batch, so less padding); ``packed`` packs each micro-batch's
    sequences into as few rows as fit the longest; ``shared-prefix`` keeps ``rows``' order and runs a prompt that
    several sequences of a micro-batch start with once (:mod:`pickaxe.data.shared_prefix`; one host read of
    ``input_ids`` unless ``host_ids`` holds them). The sum of the micro-batch losses is the same in every layout
    (losses are normalised by the whole step's counts), so only float rounding differs.
    """
    if layout == "length-sorted":
        rows = sorted(rows, key=lambda r: bounds.length[r])
    mode = "packed" if layout == "packed" else "padded"
    host = None
    if layout == "shared-prefix":
        host = input_ids.detach().cpu().numpy() if host_ids is None else host_ids
    out: list[tuple[list[int], TokenLayout]] = []
    for s in range(0, len(rows), size):
        chunk = rows[s : s + size]
        if host is not None:
            out.append((chunk, plan_shared_prefix(input_ids, bounds, chunk, host)))
        else:
            out.append((chunk, plan_layout(input_ids, bounds, chunk, mode)))
    return out


class LMAlgorithm(Algorithm):
    """Plumbing shared by the LLM learners: the model (``policy``), AdamW, a learning-rate schedule with warmup,
    gradient clipping, the update counter ``version`` (the policy version of the current weights), state, and the
    forward pass of a micro-batch (layout, gradient checkpointing, bf16 autocast, vocabulary chunks).

    ``config`` is an ``LMConfig``; ``lr``, ``weight_decay`` and ``max_grad_norm`` are read at every step, so a live
    change takes effect. Subclasses implement ``update``, accumulating gradients and calling ``optimizer_step``
    once per optimizer step: its one host read is the step's only device synchronisation.
    """

    config: Any
    allowed_lag: int = 0
    """Policy versions a batch may lag the learner by design (the builder sets ``--dist.max-staleness`` when engine
    workers generate ahead); the on-policy check is quiet for such batches."""

    def __init__(self, model: nn.Module, config: Any, reference: nn.Module | None = None) -> None:
        self.policy = model
        self.model = model
        self.config = config
        self.sharded = False
        # the frozen reference this learner keeps in its state and scores itself (DPO's; GRPO's and LLM PPO's KL
        # reference with --dist.shard fsdp), or None (an unsharded run's KL reference is the collector's)
        self.reference = None if reference is None else reference.eval().requires_grad_(False)
        self.shard_reference = True  # whether shard() shards the reference (--dist.shard-reference)
        self.reference_sharded = False
        # the run's frozen reward model scorer (``RewardModelScorer``), given by the builder when it is sharded with
        # the learners' models (--dist.shard-reward-model); never in the state: it is read from its folder
        self.reward_scorer: Any = None
        fused = next(model.parameters()).dtype == torch.float32
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, fused=fused or None)
        self.version = 0
        self.progress = 0.0
        if config.gradient_checkpointing:
            enable_checkpointing(model)

    @property
    def device(self) -> torch.device:
        """Where the model computes: its parameters' device (a sharded model's mesh device: with ``offload`` its
        shards are on the host)."""
        return compute_device(self.model)

    def forward_logprobs(
        self, layout: TokenLayout, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
    ) -> torch.Tensor:
        """``[b, L]`` log-probs of a micro-batch's scored tokens under the current weights (0 elsewhere), with the
        config's chunking and autocast."""
        cfg = self.config
        logp = through_root(
            self.model,
            lambda: layout_logprobs(
                self.model, layout, temperature, top_k, top_p, cfg.logprob_chunk_tokens, cfg.autocast
            ),
        )
        return layout.scatter(logp)

    def share(self, count: int) -> list[tuple[int, float]]:
        """``(index, weight)`` of the micro-batches (of ``count``) this learner runs: its share (``my_share``) with
        weight 1, then, when sharded, padding passes ``(0, 0.0)`` up to the largest share: every forward and
        backward of a sharded model is a collective, so every learner runs the same number (a padding pass's loss
        is multiplied by 0: gradients unchanged, and its metrics are not counted)."""
        mine = [(j, 1.0) for j in my_share(count)]
        if self.sharded and count:
            mine += [(0, 0.0)] * (-(-count // data_parallel()[1]) - len(mine))
        return mine

    def shard(self, offload: Offload = "none") -> None:
        """Shard the model's parameters, gradients and optimizer state across the learners (FSDP2, one unit per
        decoder layer; ``--dist.shard fsdp``). Called on EVERY learner right after the process group exists, when
        every learner holds rank 0's state, or, for its models, their shapes on the ``meta`` device (a launcher's
        other learners build them there: they never hold a whole model). The weights every learner shards are
        rank 0's, scattered to them one decoder layer at a time; the optimizer state is kept (a resumed run shards
        its loaded optimizer state). On rank 0 ``policy`` stays the unsharded module (rollout engine, evaluation,
        export and LoRA's shared reference use it; ``update`` gathers the new weights into it) and ``model``
        becomes a sharded copy that trains; the other learners shard in place. A frozen ``reference`` the learner
        keeps is sharded in place on every learner, rank 0 included (each holds 1/N of it; scoring it is then a
        collective), unless ``shard_reference`` is False (then rank 0's is broadcast whole to the others); so is a
        ``reward_scorer``'s reward model (its ``shard``). ``config.autocast`` ``bf16`` gives FSDP's bf16 mixed
        precision (float32 master weights and reduction)."""
        if not self.supports_sharding:
            raise PickaxeError(f"{type(self).__name__} cannot shard its model; use --dist.shard none")
        if self.sharded:
            raise PickaxeError(f"{type(self).__name__} is already sharded; call shard() once")
        self.model, self.optimizer = self.sharded_twin(self.policy, self.optimizer, offload)
        reference = self.reference
        if reference is not None and not isinstance(reference, SharedReference):
            rank0 = data_parallel()[0] == 0
            if self.shard_reference:
                # frozen: sharded in place on every learner (no gradients, no optimizer), scored collectively; the
                # others built it on the meta device and get their rows from rank 0's, before it shards its own
                bf16 = self.config.autocast == "bf16"
                if rank0:
                    scatter_into(reference, None)
                    shard_model(reference, offload, bf16=bf16)
                else:
                    shard_from(reference, None, offload, bf16=bf16)
                self.reference_sharded = True
            else:  # kept whole on every learner (DPO's): rank 0's weights, whole
                if is_meta(reference):
                    reference.to_empty(device=group_device())
                broadcast_module(reference)
        if self.reward_scorer is not None:  # the frozen reward model, 1/N on every learner: scored collectively
            self.reward_scorer.shard(offload)
        self.sharded = True

    @torch.no_grad()
    def split_logprobs(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        loss_mask: torch.Tensor,
        processing: tuple[float, int, float] = (1.0, 0, 1.0),
        mode: str = "padded",
    ) -> torch.Tensor:
        """``[B, L]`` log-probs (no gradient) of the ``loss_mask`` tokens under ``model`` (``processing``:
        temperature, top-k, top-p; ``mode``: ``completion_logprobs``' layout), in blocks of ``micro_batch_size``
        rows. With data-parallel learners each computes its share of the blocks and the rows are summed over the
        learners (each computed by one, 0 on the others): a collective every learner calls. A sharded learner with
        fewer blocks runs block 0 again (full: only the last block may be short, and a learner with fewer blocks
        never has it), so every learner runs as many forward passes."""
        cfg = self.config

        def logprobs(rows: torch.Tensor | slice) -> torch.Tensor:
            return through_root(
                model,
                lambda: completion_logprobs(
                    model,
                    input_ids[rows],
                    attention_mask[rows],
                    loss_mask[rows],
                    *processing,
                    chunk_tokens=cfg.logprob_chunk_tokens,
                    precision=cfg.autocast,
                    rows=cfg.micro_batch_size,
                    mode=mode,  # type: ignore[arg-type]
                ),
            )

        if data_parallel()[1] == 1:
            return logprobs(slice(None))
        n, size = input_ids.shape[0], cfg.micro_batch_size
        blocks = self.share(-(-n // size))
        mine = [r for j, w in blocks if w for r in range(j * size, min((j + 1) * size, n))]
        padding = [r for j, w in blocks if not w for r in range(j * size, min((j + 1) * size, n))]
        out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        if mine or padding:
            computed = logprobs(torch.tensor(mine + padding, device=input_ids.device))
            if mine:
                out[torch.tensor(mine, device=input_ids.device)] = computed[: len(mine)].float()
        return all_reduce(out)

    def score_reference(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor, temperature: float = 1.0
    ) -> torch.Tensor:
        """``[B, L]`` log-probs of the ``loss_mask`` tokens under the frozen ``reference`` at ``temperature`` (no
        top-k/top-p; 0 elsewhere), outside an update: rank 0's evaluation (``eval/kl``, DPO's held-out pairs). When
        sharded, a collective: the launcher's ``Leader`` has the other learners join each call."""
        if self.reference is None:
            raise PickaxeError(f"{type(self).__name__} keeps no reference model to score with")
        device = self.device
        ids, attn, mask = (t.to(device) for t in (input_ids, attention_mask, loss_mask))
        mode = "shared-prefix" if getattr(self.config, "share_prompts", True) else "padded"
        return self.split_logprobs(self.reference, ids, attn, mask, (temperature, 0, 1.0), mode)

    def add_reference_logprobs(self, data: Any, temperature: float) -> None:
        """When the KL reference is sharded (kept by this learner): ``data["ref_logprob"]``, its log-probs of the
        batch's completion tokens at the sampler's ``temperature`` (as the collector scores them unsharded), each
        learner scoring its share of the rows with the sharded reference (a collective every learner calls)."""
        if not (self.reference_sharded and getattr(self.config, "kl_coef", 0) > 0):
            return
        ids, attn, mask = data["input_ids"], data["attention_mask"], data["loss_mask"]
        mode = "shared-prefix" if getattr(self.config, "share_prompts", True) else "padded"
        data["ref_logprob"] = self.split_logprobs(self.reference, ids, attn, mask, (temperature, 0, 1.0), mode)

    def sharded_twin(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, offload: Offload
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """``module`` sharded (a copy on rank 0, itself elsewhere) and an AdamW over its sharded parameters holding
        ``optimizer``'s settings and state (each learner keeps its rows; with ``optimizer`` offload on an
        accelerator a :class:`~pickaxe.models.host_optimizer.HostAdamW`, its state in host memory). Every
        learner's shards get rank 0's weights (:func:`~pickaxe.models.sharding.shard_from`, a collective); the
        other learners' ``module`` may be on the meta device (built there: they never hold it whole). Rank 0 shards
        a whole copy (with a meta copy filled by the scatter its training peaks in ``benchmarks/sharding.py`` sat
        highest; see docs/distributed.md)."""
        rank0 = data_parallel()[0] == 0
        twin = copy.deepcopy(module) if rank0 else module
        state = optimizer.state_dict()
        shard_from(twin, module if rank0 else None, offload, bf16=self.config.autocast == "bf16")
        if any(getattr(v, "is_meta", False) for entry in state["state"].values() for v in entry.values()):
            raise PickaxeError(  # after the collective: rank 0 is not left waiting in it
                f"{type(self).__name__}: a learner built on the meta device holds optimizer state it cannot shard; "
                "shard before the first update (the launcher does)"
            )
        group = optimizer.param_groups[0]
        params = [p for p in twin.parameters() if p.requires_grad]
        fresh = adamw_for(params, group["lr"], group["weight_decay"], group.get("fused"), offload)
        load_sharded_optimizer(fresh, state)
        return twin, fresh

    def sync_policy(self, metrics: dict[str, float]) -> dict[str, float]:
        """When sharded: gather the trained weights into rank 0's unsharded ``policy`` (a collective every learner
        calls after every update; only LoRA's adapters when the base is frozen) and add ``sync/gather_bytes`` and
        ``time/gather_s`` (under ``time/``: a wall time, left out of deterministic metric comparisons) to
        ``metrics``. Unsharded: ``metrics`` as they are."""
        metrics = {**metrics, "mem/train_state_bytes": float(self.train_state_bytes())}
        if not self.sharded:
            return metrics
        return {**metrics, **self.gather(self.model, self.policy, "gather")}

    def trained(self) -> list[tuple[nn.Module, torch.optim.Optimizer]]:
        """The models this learner trains, each with its optimizer (sharded ones when sharded)."""
        return [(self.model, self.optimizer)]

    def train_state_bytes(self) -> int:
        """This learner's training state in bytes (logged as ``mem/train_state_bytes``): the weights of the models it
        trains, the gradients of their trained parameters (each its parameter's shape) and the optimizer state; only
        this learner's shards of each when sharded. Frozen models and rank 0's unsharded copy are not in it."""

        def size(t: torch.Tensor) -> int:
            t = local_tensor(t)
            return t.numel() * t.element_size()

        total = 0
        for model, optimizer in self.trained():
            for p in model.parameters():
                total += size(p) * (2 if p.requires_grad else 1)
            total += sum(size(v) for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))
        return total

    def gather(self, sharded: nn.Module, full: nn.Module, name: str, whole: bool = False) -> dict[str, float]:
        """:func:`~pickaxe.models.sharding.gather_into` of ``sharded`` into ``full`` on rank 0 (trainable
        parameters only for LoRA, unless ``whole``); its bytes and time as ``sync/{name}_bytes`` and
        ``time/{name}_s``."""
        start = time.perf_counter()
        target = full if data_parallel()[0] == 0 else None
        nbytes = gather_into(sharded, target, trainable_only=is_lora(sharded) and not whole)
        return {f"sync/{name}_bytes": float(nbytes), f"time/{name}_s": time.perf_counter() - start}

    def set_progress(self, step: int, total_steps: int) -> None:
        """Record training progress for the learning-rate schedule."""
        self.progress = step / max(total_steps, 1)

    def current_lr(self) -> float:
        """Learning rate of the next step: linear warmup over ``warmup_updates``, then the schedule."""
        cfg = self.config
        if cfg.warmup_updates and self.version < cfg.warmup_updates:
            return cfg.lr * (self.version + 1) / cfg.warmup_updates
        p = min(max(self.progress, 0.0), 1.0)
        if cfg.lr_schedule == "linear":
            return cfg.lr * (1.0 - p)
        if cfg.lr_schedule == "cosine":
            return cosine_schedule(cfg.lr, p)
        return cfg.lr

    def load_sharded_module(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        full: nn.Module,
        weights: dict[str, Any],
        optimizer_state: dict[str, Any],
    ) -> None:
        """Load ``weights`` and ``optimizer_state`` into sharded ``module`` and ``optimizer`` (each learner its own
        rows) and, on rank 0, the whole ``weights`` into ``full``. Values that are full tensors or lazy readers are
        read locally: no collective, so learners may load one after the other. DTensors (a sharded ``state_dict``
        given back as it was) are loaded from this learner's shards and gathered into ``full``: then a collective
        every learner calls."""
        load_sharded(module, weights)
        load_sharded_optimizer(optimizer, optimizer_state)
        if any(isinstance(v, DTensor) for v in weights.values()):
            self.gather(module, full, "load_gather", whole=True)
        elif data_parallel()[0] == 0:
            load_sharded(full, weights)

    def optimizer_step(
        self, loss: torch.Tensor, extra: torch.Tensor | None = None, sums: torch.Tensor | None = None
    ) -> tuple[float, float, float, list[float]]:
        """Clip the accumulated gradients, step, zero them; returns ``(grad_norm, loss, lr, [*extra, *sums])`` as
        floats.

        ``loss`` is the step's summed micro-batch losses (a tensor; not read before this call), ``extra`` any metric
        tensors to read in the same host synchronisation and ``sums`` metric sums over this learner's micro-batches.
        With data-parallel learners (an algorithm with ``supports_data_parallel``), gradients, ``loss`` and ``sums``
        are summed over the learners in one collective first; ``extra`` must be alike on every learner. Refuses a
        non-finite loss or gradient with ``NonFiniteError`` BEFORE ``optimizer.step()``, so the weights and the
        optimizer state stay as they were (the gradients are dropped; see :func:`~pickaxe.algos.base.clip_and_step`).
        """
        lr = self.current_lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
            group["weight_decay"] = self.config.weight_decay
        try:
            values = clip_and_step(
                self.model,
                self.optimizer,
                self.config.max_grad_norm,
                loss,
                extra,
                sums=sums,
                reduce=self.supports_data_parallel,
            )
        except NonFiniteError as e:
            raise NonFiniteError(f"{e.what} ({type(self).__name__} update {self.version})") from None
        self.optimizer.zero_grad(set_to_none=True)
        return values[0], values[1], lr, values[2:]

    def networks(self) -> dict[str, nn.Module]:
        """The language model (its full weights: the unsharded ``policy``)."""
        return {"policy": self.policy}

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer, update counter, schedule position and the reference's weights when it keeps one. When
        sharded, the models' and optimizer's tensors are FSDP2's (DTensors holding this learner's rows, the same
        keys as unsharded)."""
        state = {
            "policy": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "progress": self.progress,
        }
        if self.reference is not None:  # sharded: this learner's rows, like the policy's
            state["reference"] = self.reference.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned. When sharded (a collective), the model's, the reference's and the
        optimizer's values may be full tensors or lazy readers (``.shape``, ``.dtype``, ``value[a:b]``): each
        learner reads its own rows, and rank 0's ``policy`` gets the loaded weights."""
        if self.sharded:
            self.load_sharded_module(self.model, self.optimizer, self.policy, state["policy"], state["optimizer"])
        else:
            self.model.load_state_dict(state["policy"])
            self.optimizer.load_state_dict(state["optimizer"])
        if self.reference is not None and "reference" in state:
            if self.reference_sharded:
                load_sharded(self.reference, state["reference"])
            else:
                self.reference.load_state_dict(state["reference"])
        self.version = int(state["version"])
        self.progress = float(state["progress"])
