"""Supervised fine-tuning: cross-entropy on the ``loss_mask`` tokens (the answers) of a Batch of demonstrations."""

from __future__ import annotations

import math

import torch
from torch import nn

from pickaxe.algos.configs import SFTConfig
from pickaxe.algos.llm_core import Aggregation, LMAlgorithm, aggregate, masked, plan_micro_batches
from pickaxe.data.batch import Batch
from pickaxe.data.layout import sequence_bounds


def sft_loss(
    logprob: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: Aggregation,
    total_tokens: float,
    total_seqs: float,
    norm: float = 1.0,
) -> torch.Tensor:
    """Negative log-likelihood of the target tokens, aggregated with ``mode`` over the whole batch's counts
    (``norm``: the divisor of ``seq-mean-token-sum-norm``)."""
    return aggregate(-logprob, loss_mask, mode, total_tokens, total_seqs, norm)


class SFT(LMAlgorithm):
    """SFT on a causal LM: one optimizer step per batch, gradients accumulated over micro-batches (with
    data-parallel learners, each computes its share of them)."""

    supports_data_parallel = True
    supports_sharding = True

    def __init__(self, model: nn.Module, config: SFTConfig | None = None) -> None:
        super().__init__(model, config or SFTConfig())

    def update(self, batch: Batch) -> dict[str, float]:
        """One step on ``input_ids``/``attention_mask``/``loss_mask``; reports the mean token NLL. Device
        synchronisations: one read of the sequence bounds and the optimizer step's one read."""
        cfg = self.config
        data = batch.to(self.device)
        bounds = sequence_bounds(data["attention_mask"], data["loss_mask"])
        n = data.batch_size[0]
        total_tokens = float(sum(len(s) for s in bounds.scored))
        norm = float(max((len(s) for s in bounds.scored), default=0))  # longest target, the same in every micro-batch
        zero = torch.zeros((), device=self.device)
        loss_total, nll_sum, real, slots = zero, zero, 0, 0
        self.model.train()
        plan = plan_micro_batches(
            data["input_ids"], bounds, list(range(n)), cfg.micro_batch_size, cfg.micro_batch_layout
        )
        for _, layout in plan:
            real, slots = real + layout.real_tokens, slots + layout.slots
        for j, weight in self.share(len(plan)):
            rows, layout = plan[j]
            mb = data[torch.tensor(rows, device=self.device)]
            logprob = self.forward_logprobs(layout)
            loss = sft_loss(logprob, mb["loss_mask"], cfg.aggregation, total_tokens, float(n), norm)
            if not weight:  # a sharded learner's padding pass: the others' collectives, no gradient
                (loss * 0.0).backward()
                continue
            loss.backward()
            loss_total = loss_total + loss.detach()
            nll_sum = nll_sum + masked(-logprob.detach(), mb["loss_mask"]).sum()
        grad_norm, loss_value, lr, (nll_total,) = self.optimizer_step(loss_total, sums=nll_sum)
        self.model.eval()
        self.version += 1
        nll = nll_total / max(total_tokens, 1.0)
        return self.sync_policy(
            {
                "loss/sft": loss_value,
                "sft/token_nll": nll,
                "sft/perplexity": math.exp(min(nll, 700.0)),
                "grad_norm": grad_norm,
                "sft/lr": lr,
                "sft/tokens": total_tokens,
                "perf/padding_fraction": 1.0 - real / max(slots, 1),
            }
        )
