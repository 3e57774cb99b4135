"""PPO with a critic on a causal LM, as in InstructGPT and "The N+ implementation details of RLHF with PPO".

Per batch of scored completions (a ``TextCollector`` batch):

1. once, without gradient, in eval mode: the learner's log-probs of the sampled tokens (``old_logprob``) and the
   critic's values of the states before them (``old_value``);
2. :func:`ppo_targets`: per-token rewards (the sequence ``reward`` at the last response token, minus ``kl_coef`` x
   the per-token KL to the reference when ``kl_in="reward"``), GAE over the response tokens, optional whitening;
3. ``epochs x mini_batches`` optimizer steps of :func:`ppo_loss`: PPO's clipped surrogate for the policy (plus the
   KL term when ``kl_in="loss"``), the clipped value loss for the critic, and with ``ptx_coef`` > 0 the
   language-modelling loss of a batch of demonstrations (PPO-ptx). Policy and critic are separate networks with
   their own AdamW and gradient clipping, stepped together after one host read.

Losses are normalised by the counts of the whole optimizer step, so micro-batching and layouts change the update
only by float rounding.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Protocol

import torch
from torch import nn

from pickaxe.algos.base import (
    all_reduce,
    all_reduce_gradients,
    clip_with_norm,
    data_parallel,
    drop_absent_gradients,
    first_nonfinite,
    reduce_sums,
    total_norm,
)
from pickaxe.algos.configs import LLMPPOConfig
from pickaxe.algos.core import clipped_surrogate
from pickaxe.algos.llm_core import (
    LMAlgorithm,
    aggregate,
    kl_estimate,
    masked,
    masked_mean,
    plan_micro_batches,
    sequence_sum,
    token_log_ratio,
    warn_off_policy,
)
from pickaxe.algos.rlhf_core import kl_shaped_token_rewards, token_gae, token_value_loss, whiten
from pickaxe.data.batch import Batch
from pickaxe.data.layout import SequenceBounds, TokenLayout, sequence_bounds
from pickaxe.errors import NonFiniteError
from pickaxe.models.lm import enable_checkpointing
from pickaxe.models.sharding import Offload, through_root
from pickaxe.models.value import ValueModel
from pickaxe.rollout.engines.base import SamplingParams


class BatchSource(Protocol):
    """Anything with ``collect() -> Batch`` of demonstrations (``input_ids``, ``attention_mask``, ``loss_mask``),
    e.g. ``pickaxe.rollout.text_collector.DemoCollector``: PPO-ptx's language-modelling data."""

    def collect(self) -> Batch:
        """One batch of demonstrations."""
        ...


class PPOTargets(NamedTuple):
    """What :func:`ppo_targets` returns, each ``[B, L]`` and 0 off the response mask: ``token_reward`` (the
    per-token reward GAE sees), ``kl`` (the per-token KL estimate of the old policy to the reference; 0 without
    one), ``advantage`` (whitened when asked) and ``returns`` (the critic's targets, advantage + value before
    whitening)."""

    token_reward: torch.Tensor
    kl: torch.Tensor
    advantage: torch.Tensor
    returns: torch.Tensor


def ppo_targets(
    reward: torch.Tensor,
    old_logprob: torch.Tensor,
    ref_logprob: torch.Tensor | None,
    old_values: torch.Tensor,
    mask: torch.Tensor,
    cfg: LLMPPOConfig,
) -> PPOTargets:
    """Advantages and returns of one whole batch (whitening is over the batch, so call it on all of it).

    ``reward`` is ``[B]`` (a reward model's score or a rule's), placed at each row's last response token;
    with ``cfg.kl_in == "reward"`` every response token also gets ``-cfg.kl_coef * kl_t``, ``kl_t`` the
    ``cfg.kl_estimator`` estimate from ``old_logprob`` and ``ref_logprob`` (k1: ``old_logprob - ref_logprob``).
    GAE runs over each row's response tokens with ``cfg.gamma`` and ``cfg.lam``, terminal at the last one
    (``rlhf_core.token_gae``); ``old_values[b, t]`` is the critic's value of the state before token ``t``.
    ``ref_logprob`` may be None only when ``cfg.kl_coef`` is 0.
    """
    m = mask.bool()
    if ref_logprob is None:
        if cfg.kl_coef > 0:
            raise ValueError(
                "LLMPPO with kl_coef > 0 needs ref_logprob in the batch: give the TextCollector a reference model "
                "or set kl_coef=0"
            )
        ref_logprob = old_logprob  # KL of a policy to itself: 0
    coef = cfg.kl_coef if cfg.kl_in == "reward" else 0.0
    token_reward, kl = kl_shaped_token_rewards(reward, old_logprob, ref_logprob, m, coef, cfg.kl_estimator)
    advantage, returns = token_gae(token_reward, old_values, m, cfg.gamma, cfg.lam)
    if cfg.whiten_advantages:
        advantage = whiten(advantage, m)
    return PPOTargets(token_reward, kl, advantage, returns)


def ppo_loss(
    logprob: torch.Tensor,
    values: torch.Tensor,
    mb: Batch,
    cfg: LLMPPOConfig,
    total_tokens: float,
    total_seqs: float,
    norm: float,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The policy and value losses of one micro-batch given the learner's per-token ``logprob`` and the critic's
    ``values`` (``[b, L]``, aligned with the tokens).

    ``mb`` holds ``loss_mask``, ``old_logprob``, ``old_value``, ``advantage``, ``return`` and, when
    ``cfg.kl_in == "loss"`` with ``cfg.kl_coef`` > 0, ``ref_logprob``. The policy loss is PPO's clipped surrogate
    ``-min(r A, clip(r, 1 - clip, 1 + clip) A)`` aggregated with ``cfg.aggregation`` (``norm``: the divisor of
    ``seq-mean-token-sum-norm``), plus ``cfg.kl_coef`` x the aggregated KL estimate with ``kl_in="loss"``; the
    value loss is ``0.5 (V - G)^2`` (max with the clipped one, ``cfg.value_clip``) averaged over tokens, NOT yet
    multiplied by ``cfg.vf_coef``. Both are divided by the whole optimizer step's ``total_tokens`` /
    ``total_seqs``. Returns ``(policy_loss, value_loss, stats)``, stats being per-micro-batch sums for metrics.
    """
    mask = mb["loss_mask"].bool()
    log_ratio = token_log_ratio(logprob, mb["old_logprob"], mask)
    advantage = masked(mb["advantage"], mask)
    pg, ratio, clipped = clipped_surrogate(log_ratio, torch.zeros_like(log_ratio), advantage, cfg.clip, cfg.clip)
    policy_loss = aggregate(pg, mask, cfg.aggregation, total_tokens, total_seqs, norm)
    kl_sum = logprob.new_zeros(())
    if cfg.kl_coef > 0 and cfg.kl_in == "loss":
        kl = kl_estimate(logprob, mb["ref_logprob"], cfg.kl_estimator, mask)
        policy_loss = policy_loss + cfg.kl_coef * aggregate(kl, mask, cfg.aggregation, total_tokens, total_seqs, norm)
        kl_sum = sequence_sum(kl.detach(), mask).sum()
    old_values, returns = masked(mb["old_value"], mask), masked(mb["return"], mask)
    vl = token_value_loss(values, old_values, returns, mask, cfg.value_clip)
    value_loss = aggregate(vl, mask, "token-mean", total_tokens)
    value_clipped = torch.zeros_like(mask)
    if cfg.value_clip is not None:
        v = masked(values.detach(), mask)
        v_clipped = old_values + (v - old_values).clamp(-cfg.value_clip, cfg.value_clip)
        value_clipped = (v_clipped - returns).pow(2) > (v - returns).pow(2)
    lr_detached = log_ratio.detach()
    stats = {
        "tokens": mask.sum(),
        "clipped": (clipped & mask).sum(),
        "ratio_sum": masked(ratio.detach(), mask).sum(),
        "approx_kl_sum": masked(lr_detached.exp() - 1.0 - lr_detached, mask).sum(),  # k3 of KL(old || new)
        "value_clipped": (value_clipped & mask).sum(),
        "kl_loss_sum": kl_sum,
    }
    return policy_loss, value_loss, stats


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``1 - Var[G - V] / Var[G]`` over the mask, as a device tensor (no host read; NaN when the returns are
    constant)."""
    m = mask.bool()

    def var(x: torch.Tensor) -> torch.Tensor:
        return masked_mean((x - masked_mean(x, m)).pow(2), m)

    target = var(returns)
    ev = 1.0 - var(returns - values) / target.clamp(min=1e-30)
    return torch.where(target > 0, ev, torch.full_like(ev, math.nan))


class LLMPPO(LMAlgorithm):
    """PPO with a critic (``ValueModel``) on a causal LM ``policy``.

    ``sampling`` must be the collector's sampling params (log-probs use the same temperature/top-k/top-p;
    ``max_new_tokens`` is the divisor of ``seq-mean-token-sum-norm``). ``ptx`` (PPO-ptx, used when
    ``config.ptx_coef`` > 0) gives a batch of demonstrations at every optimizer step, e.g. a ``DemoCollector``;
    its ``state_dict`` (if any) is part of this algorithm's. ``seed`` seeds the mini-batch shuffling.

    ``update(batch)`` needs ``input_ids``, ``attention_mask``, ``loss_mask``, ``reward`` (``[B]``: the score of
    each whole sequence) and, when ``kl_coef`` > 0, ``ref_logprob``; ``logprob`` (the sampler's) and
    ``policy_version`` are used for checks when present.

    With data-parallel learners each computes its share of the micro-batches of every optimizer step (and of the
    old log-probs and values, gathered by a sum over learners, each row computed by one of them). ``reference``
    (``--dist.shard fsdp`` with ``kl_coef > 0``): the frozen KL reference, kept in this algorithm's state and
    sharded with the policy; each learner then scores its share of the batch's rows with it (``ref_logprob``).
    """

    config: LLMPPOConfig
    supports_data_parallel = True
    supports_sharding = True

    def __init__(
        self,
        policy: nn.Module,
        critic: ValueModel,
        config: LLMPPOConfig | None = None,
        sampling: SamplingParams | None = None,
        ptx: BatchSource | None = None,
        seed: int = 0,
        reference: nn.Module | None = None,
    ) -> None:
        if not hasattr(critic, "layout_values"):
            raise TypeError(
                f"LLMPPO's critic must be a ValueModel (pickaxe.models.value), got {type(critic).__name__}; build "
                "one with ValueModel.from_reward_model(rm) or ValueModel.from_lm(lm)"
            )
        config = config or LLMPPOConfig()
        if config.ptx_coef > 0 and ptx is None:
            raise ValueError("ptx_coef > 0 needs demonstrations: pass ptx=DemoCollector(...) or set ptx_coef=0")
        super().__init__(policy, config, reference)
        self.critic = critic
        self.full_critic = critic  # the critic's full weights (the sharded critic trains: see shard)
        self.ptx = ptx
        fused = next(critic.parameters()).dtype == torch.float32
        params = [p for p in critic.parameters() if p.requires_grad]
        self.critic_optimizer = torch.optim.AdamW(
            params, lr=self.critic_lr(config.lr), weight_decay=config.weight_decay, fused=fused or None
        )
        if config.gradient_checkpointing:
            enable_checkpointing(critic)
        self.sampling = sampling or SamplingParams()
        t = self.sampling.temperature
        self._processing = (t if t > 0 else 1.0, self.sampling.top_k, self.sampling.top_p)
        self.generator = torch.Generator().manual_seed(seed)

    def critic_lr(self, policy_lr: float) -> float:
        """The critic's learning rate when the policy's is ``policy_lr``: ``critic_lr`` (or ``lr``) on the same
        warmup and schedule."""
        cfg = self.config
        base = cfg.lr if cfg.critic_lr is None else cfg.critic_lr
        return base * policy_lr / cfg.lr

    def networks(self) -> dict[str, nn.Module]:
        """The policy and the critic (their full weights)."""
        return {"policy": self.policy, "critic": self.full_critic}

    def trained(self) -> list[tuple[nn.Module, torch.optim.Optimizer]]:
        """The policy and the critic, each with its optimizer."""
        return [(self.model, self.optimizer), (self.critic, self.critic_optimizer)]

    def shard(self, offload: Offload = "none") -> None:
        """``LMAlgorithm.shard`` for the policy, and the critic sharded the same way with its own optimizer (rank 0
        keeps the unsharded critic as ``full_critic``, which ``update`` gathers the new weights into)."""
        super().shard(offload)
        self.critic, self.critic_optimizer = self.sharded_twin(self.full_critic, self.critic_optimizer, offload)

    def critic_values(self, layout: TokenLayout) -> torch.Tensor:
        """``[b, L]`` values of a micro-batch from the critic (through the sharded root when sharded)."""
        if not self.sharded:
            return self.critic(layout, self.config.autocast)
        values = through_root(self.critic, lambda: self.critic.layout_values(layout, self.config.autocast))
        return layout.scatter(values)

    def state_dict(self) -> dict[str, Any]:
        """Both models, both optimizers, update counter, schedule position, the shuffling generator and the ptx
        source's state."""
        state = super().state_dict()
        state["critic"] = self.critic.state_dict()
        state["critic_optimizer"] = self.critic_optimizer.state_dict()
        state["generator"] = self.generator.get_state()
        if self.ptx is not None and hasattr(self.ptx, "state_dict"):
            state["ptx"] = self.ptx.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (when sharded, full tensors or lazy readers: see
        ``LMAlgorithm.load_state_dict``)."""
        super().load_state_dict(state)
        if self.sharded:
            critic, optimizer = state["critic"], state["critic_optimizer"]
            self.load_sharded_module(self.critic, self.critic_optimizer, self.full_critic, critic, optimizer)
        else:
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.generator.set_state(state["generator"])
        if "ptx" in state and self.ptx is not None and hasattr(self.ptx, "load_state_dict"):
            self.ptx.load_state_dict(state["ptx"])

    @torch.no_grad()
    def prepare(self, batch: Batch, bounds: SequenceBounds | None = None) -> tuple[Batch, dict[str, torch.Tensor]]:
        """The batch on the learner's device with ``old_logprob`` and ``old_value`` (current policy and critic, eval
        mode, no gradient, micro-batched like the update) and :func:`ppo_targets`' ``token_reward``, ``kl``,
        ``advantage`` and ``return`` written in; plus metric tensors (not yet read from the device)."""
        cfg = self.config
        data = batch.to(self.device)
        _check_keys(data)
        self.add_reference_logprobs(data, self._processing[0])  # sharded with a KL reference: scored here
        if bounds is None:
            bounds = sequence_bounds(data["attention_mask"], data["loss_mask"])
        n, width = data["input_ids"].shape
        old_logprob = torch.zeros(n, width, device=self.device)
        old_value = torch.zeros(n, width, device=self.device)
        self.model.eval()
        self.critic.eval()
        plan = plan_micro_batches(
            data["input_ids"], bounds, list(range(n)), cfg.micro_batch_size, cfg.micro_batch_layout
        )
        real = sum(layout.real_tokens for _, layout in plan)
        slots = sum(layout.slots for _, layout in plan)
        for j, weight in self.share(len(plan)):
            rows, layout = plan[j]
            logprob = self.forward_logprobs(layout, *self._processing)
            values = self.critic_values(layout)
            if weight:  # not a sharded learner's padding pass (the others' collectives, discarded)
                idx = torch.tensor(rows, device=self.device)
                old_logprob[idx], old_value[idx] = logprob, values
        if data_parallel()[1] > 1:  # each row was computed by one learner, 0 on the others: the sum gathers them
            old_logprob, old_value = all_reduce(torch.stack([old_logprob, old_value])).unbind()
        mask = data["loss_mask"].bool()
        ref = data.get("ref_logprob", None)
        targets = ppo_targets(data["reward"], old_logprob, ref, old_value, mask, cfg)
        data["old_logprob"], data["old_value"] = old_logprob, old_value
        data["token_reward"], data["kl"] = targets.token_reward, targets.kl
        data["advantage"], data["return"] = targets.advantage, targets.returns
        tokens = mask.sum().clamp(min=1)
        live = mask.any(-1)  # rows the collector excluded (a failed reward: loss mask zeroed) are not counted
        seqs = live.sum().clamp(min=1)
        metrics = {
            "ppo/score_mean": masked(data["reward"].float(), live).sum() / seqs,
            "ppo/shaped_reward_mean": sequence_sum(targets.token_reward, mask).sum() / seqs,
            "ppo/value_mean": masked_mean(old_value, mask),
            "ppo/return_mean": masked_mean(targets.returns, mask),
            "ppo/explained_variance": explained_variance(old_value, targets.returns, mask),
            "ppo/entropy_approx": masked(-old_logprob, mask & torch.isfinite(old_logprob)).sum() / tokens,
            "perf/padding_fraction": torch.tensor(1.0 - real / max(slots, 1)),
        }
        if ref is not None:
            kl_seq = sequence_sum(targets.kl, mask)
            metrics["kl/token_mean"] = kl_seq.sum() / tokens
            metrics["kl/seq_sum_mean"] = kl_seq.sum() / seqs
        if "logprob" in data:  # the sampler's: should match the learner's on the same weights
            diff = masked((old_logprob - data["logprob"]).abs(), mask)
            metrics["check/logprob_diff_mean"] = diff.sum() / tokens
            metrics["check/logprob_diff_max"] = diff.max()
        if "policy_version" in data:
            metrics["check/policy_lag"] = self.version - data["policy_version"].min()
        return data, metrics

    def update(self, batch: Batch) -> dict[str, float]:
        """Old log-probs, values and advantages, then ``epochs x mini_batches`` optimizer steps of policy and
        critic (and PPO-ptx). Device synchronisations: one read of the sequence bounds and one per optimizer step
        (the last one also reads every metric); a ptx batch on the GPU adds one read of its bounds per step."""
        cfg = self.config
        if cfg.ptx_coef > 0 and self.ptx is None:
            raise ValueError("ptx_coef > 0 needs demonstrations: pass ptx=DemoCollector(...) or set ptx_coef=0")
        data = batch.to(self.device)
        _check_keys(data)
        bounds = sequence_bounds(data["attention_mask"], data["loss_mask"])
        n = data.batch_size[0]
        if n == 0:
            raise ValueError("LLMPPO.update got an empty batch; collect at least one completion")
        data, reads = self.prepare(data, bounds)
        norm = float(self.sampling.max_new_tokens)
        zero = torch.zeros((), device=self.device)
        keys = ("tokens", "clipped", "ratio_sum", "approx_kl_sum", "value_clipped", "kl_loss_sum")
        totals = dict.fromkeys(keys, zero)
        policy_losses: list[float] = []
        value_losses: list[float] = []
        ptx_losses: list[float] = []
        policy_norms: list[float] = []
        critic_norms: list[float] = []
        lr, extra, final = 0.0, [], {}
        size = -(-n // cfg.mini_batches)
        steps = cfg.epochs * -(-n // size)
        self.model.train()
        self.critic.train()
        for _ in range(cfg.epochs):
            order = torch.randperm(n, generator=self.generator).tolist() if cfg.mini_batches > 1 else list(range(n))
            for k in range(cfg.mini_batches):
                mini = order[k * size : (k + 1) * size]
                if not mini:
                    continue
                step_tokens = float(max(sum(len(bounds.scored[r]) for r in mini), 1))
                # rows without scored tokens (a sample a reward failed on: loss mask zeroed) are not sequences
                step_seqs = float(max(sum(1 for r in mini if bounds.scored[r]), 1))
                policy_total, value_total = zero, zero
                plan = plan_micro_batches(data["input_ids"], bounds, mini, cfg.micro_batch_size, cfg.micro_batch_layout)
                for j, weight in self.share(len(plan)):
                    rows, layout = plan[j]
                    mb = data[torch.tensor(rows, device=self.device)]
                    logprob = self.forward_logprobs(layout, *self._processing)
                    values = self.critic_values(layout)
                    policy_loss, value_loss, stats = ppo_loss(logprob, values, mb, cfg, step_tokens, step_seqs, norm)
                    if not weight:  # a sharded learner's padding pass: the others' collectives, no gradient
                        ((policy_loss + cfg.vf_coef * value_loss) * 0.0).backward()
                        continue
                    (policy_loss + cfg.vf_coef * value_loss).backward()
                    policy_total = policy_total + policy_loss.detach()
                    value_total = value_total + value_loss.detach()
                    for key, value in stats.items():
                        totals[key] = totals[key] + value
                ptx_total = self._ptx_backward() if cfg.ptx_coef > 0 else zero
                values_read, summed = None, None
                if len(policy_norms) == steps - 1:  # the last step also reads every metric
                    alike = {name: v.detach().float().reshape(()).to(self.device) for name, v in reads.items()}
                    final = {**alike, **totals}
                    values_read = torch.stack(list(alike.values())) if alike else None
                    summed = torch.stack([t.float().reshape(()) for t in totals.values()])
                losses = torch.stack([policy_total, value_total, ptx_total])
                policy_norm, critic_norm, lr, (pl, vl, xl), extra = self.optimizer_steps(losses, values_read, summed)
                policy_losses.append(pl)
                value_losses.append(vl)
                ptx_losses.append(xl)
                policy_norms.append(policy_norm)
                critic_norms.append(critic_norm)
        self.model.eval()
        self.critic.eval()
        self.version += 1
        got = dict(zip(final, extra, strict=True))
        tokens = max(got.pop("tokens"), 1.0)
        kl_loss_sum = got.pop("kl_loss_sum")
        metrics = {
            "loss/policy": _mean(policy_losses),
            "loss/value": _mean(value_losses),
            "grad_norm": _mean(policy_norms),
            "grad_norm/critic": _mean(critic_norms),
            "ppo/lr": lr,
            "ppo/critic_lr": self.critic_lr(lr),
            "ppo/clip_fraction": got.pop("clipped") / tokens,
            "ppo/value_clip_fraction": got.pop("value_clipped") / tokens,
            "ppo/ratio_mean": got.pop("ratio_sum") / tokens,
            "ppo/approx_kl": got.pop("approx_kl_sum") / tokens,
            "ppo/sequences": float(sum(1 for s in bounds.scored if s)),
        }
        if cfg.ptx_coef > 0:
            metrics["loss/ptx"] = _mean(ptx_losses)
        if cfg.kl_coef > 0 and cfg.kl_in == "loss":
            metrics["ppo/kl_loss_token_mean"] = kl_loss_sum / tokens  # over the update's steps, current weights
        if "check/logprob_diff_max" in got:  # old log-probs are the learner's, so this biases nothing: it tells
            learner = self.version - 1  # that the samples came from another policy (stale weights, numerics)
            sampled = learner - int(got.get("check/policy_lag", 0.0))
            worst = got["check/logprob_diff_max"]
            warn_off_policy("PPO", worst, cfg.ratio_tolerance, sampled, learner, allowed_lag=self.allowed_lag)
        if self.sharded:  # the critic's full weights too (checkpoints and the final model read them on rank 0)
            metrics.update(self.gather(self.critic, self.full_critic, "critic_gather"))
        return self.sync_policy({**metrics, **got})

    def _ptx_backward(self) -> torch.Tensor:
        """PPO-ptx: backward of ``ptx_coef`` x the mean token NLL of one batch of demonstrations; returns the NLL
        (a device tensor). The bounds are read before the batch moves, so a CPU batch costs no device read."""
        cfg = self.config
        assert self.ptx is not None
        demo = self.ptx.collect()
        bounds = sequence_bounds(demo["attention_mask"], demo["loss_mask"])
        demo = demo.to(self.device)
        total_tokens = float(max(sum(len(s) for s in bounds.scored), 1))
        total = torch.zeros((), device=self.device)
        rows = list(range(demo.batch_size[0]))
        plan = plan_micro_batches(demo["input_ids"], bounds, rows, cfg.micro_batch_size, cfg.micro_batch_layout)
        for j, weight in self.share(len(plan)):
            chunk, layout = plan[j]
            mask = demo["loss_mask"][torch.tensor(chunk, device=self.device)]
            logprob = self.forward_logprobs(layout)
            nll = aggregate(-logprob, mask, "token-mean", total_tokens)
            if not weight:  # a sharded learner's padding pass: the others' collectives, no gradient
                (nll * 0.0).backward()
                continue
            (cfg.ptx_coef * nll).backward()
            total = total + nll.detach()
        return total

    def optimizer_steps(
        self, losses: torch.Tensor, extra: torch.Tensor | None = None, sums: torch.Tensor | None = None
    ) -> tuple[float, float, float, list[float], list[float]]:
        """Clip the policy's and the critic's accumulated gradients (each to its own max norm), step both
        optimizers and zero the gradients; returns ``(policy_grad_norm, critic_grad_norm, lr, losses, [*extra,
        *sums])`` as floats, all read in ONE host synchronisation.

        ``losses`` is ``[k]`` (the step's summed losses), ``extra`` metric tensors alike on every learner and
        ``sums`` metric sums over this learner's micro-batches. With data-parallel learners, both models'
        gradients, ``losses`` and ``sums`` are summed over the learners in one collective first. A non-finite loss
        or gradient raises ``NonFiniteError`` before either optimizer steps (gradients dropped, weights and
        optimizer states unchanged), as ``LMAlgorithm.optimizer_step`` does for one model.
        """
        cfg = self.config
        lr = self.current_lr()
        for optimizer, rate in ((self.optimizer, lr), (self.critic_optimizer, self.critic_lr(lr))):
            for group in optimizer.param_groups:
                group["lr"] = rate
                group["weight_decay"] = cfg.weight_decay
        models = (self.model, self.critic)
        k = losses.numel()
        present = None
        if self.sharded:  # FSDP's reduce-scatter summed the gradients: the losses and sums remain
            params = [[p for p in m.parameters() if p.grad is not None] for m in models]
            losses, sums = reduce_sums([losses, sums])
        elif data_parallel()[1] > 1:
            params = [[p for p in m.parameters() if p.requires_grad] for m in models]
            local = torch.cat([losses.float().reshape(-1)] + ([] if sums is None else [sums.float().reshape(-1)]))
            summed, present = all_reduce_gradients(params[0] + params[1], local)
            assert summed is not None
            losses, sums = summed[:k], (summed[k:] if sums is not None else None)
        else:
            params = [[p for p in m.parameters() if p.grad is not None] for m in models]
        norms = [total_norm([p.grad for p in ps]) if ps else torch.zeros((), device=self.device) for ps in params]
        parts = [
            t.detach().float().reshape(-1).to(self.device)
            for t in (*norms, losses, extra, sums, present)
            if t is not None
        ]
        values = torch.cat(parts).tolist()  # the step's one host read
        if present is not None:  # the flags came last
            flags = values[len(values) - len(present) :]
            values = values[: len(values) - len(present)]
            split = len(params[0])
            params = [drop_absent_gradients(params[0], flags[:split]), drop_absent_gradients(params[1], flags[split:])]
        what = None
        if not all(math.isfinite(v) for v in values[2 : 2 + k]):
            names = ("policy loss", "value loss", "ptx loss")
            bad = next(i for i, v in enumerate(values[2 : 2 + k]) if not math.isfinite(v))
            what = first_nonfinite(self._named_parameters()) or f"{names[bad]} = {values[2 + bad]}"
        elif not (math.isfinite(values[0]) and math.isfinite(values[1])):
            what = first_nonfinite(self._named_parameters(), grads=True) or f"gradient norms = {values[:2]}"
        if what is not None:
            self.optimizer.zero_grad(set_to_none=True)
            self.critic_optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(f"{what} (LLMPPO update {self.version})")
        for ps, norm, max_norm in zip(params, norms, (cfg.max_grad_norm, cfg.critic_max_grad_norm), strict=True):
            if ps:
                clip_with_norm(ps, max_norm, norm)
        self.optimizer.step()
        self.critic_optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.critic_optimizer.zero_grad(set_to_none=True)
        return values[0], values[1], lr, values[2 : 2 + k], values[2 + k :]

    def _named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """Policy parameters, then the critic's (prefixed ``critic.``), for naming a non-finite one."""
        named = list(self.model.named_parameters())
        return named + [(f"critic.{name}", p) for name, p in self.critic.named_parameters()]


def _check_keys(data: Batch) -> None:
    """Refuse a batch without the keys every update needs, naming them."""
    missing = [k for k in ("input_ids", "attention_mask", "loss_mask", "reward") if k not in data]
    if missing:
        raise KeyError(f"LLMPPO needs batch keys {missing}; collect batches with a TextCollector")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
