"""Supervised fine-tuning: cross-entropy on the ``loss_mask`` tokens (the answers) of a Batch of demonstrations."""

from __future__ import annotations

import torch
from torch import nn

from pickaxe.algos.configs import SFTConfig
from pickaxe.algos.llm_core import Aggregation, LMAlgorithm, aggregate, micro_batches
from pickaxe.data.batch import Batch
from pickaxe.models.lm import sequence_logprobs


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
    """SFT on a causal LM: one optimizer step per batch, gradients accumulated over micro-batches."""

    def __init__(self, model: nn.Module, config: SFTConfig | None = None) -> None:
        super().__init__(model, config or SFTConfig())

    def update(self, batch: Batch) -> dict[str, float]:
        """One step on ``input_ids``/``attention_mask``/``loss_mask``; reports the mean token NLL."""
        cfg = self.config
        batch = batch.to(next(self.model.parameters()).device)
        total_tokens = float(batch["loss_mask"].sum())
        total_seqs = float(batch.batch_size[0])
        norm = float(batch["loss_mask"].sum(-1).max())  # longest target of the batch, the same for every micro-batch
        self.model.train()
        loss_sum, nll_sum = 0.0, 0.0
        for mb in micro_batches(batch, cfg.micro_batch_size):
            logprob = sequence_logprobs(self.model, mb["input_ids"], mb["attention_mask"])
            loss = sft_loss(logprob, mb["loss_mask"], cfg.aggregation, total_tokens, total_seqs, norm)
            loss.backward()
            loss_sum += loss.item()
            nll_sum += float(-logprob.detach()[mb["loss_mask"]].sum())
        grad_norm, lr = self.optimizer_step(loss_sum)
        self.model.eval()
        self.version += 1
        nll = nll_sum / max(total_tokens, 1.0)
        return {
            "loss/sft": loss_sum,
            "sft/token_nll": nll,
            "sft/perplexity": float(torch.tensor(nll).exp()),
            "grad_norm": grad_norm,
            "sft/lr": lr,
            "sft/tokens": total_tokens,
        }
