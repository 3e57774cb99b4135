"""Reward-model training: the Bradley–Terry loss on preference pairs, one optimizer step per batch of pairs.

A batch comes from ``pickaxe.rollout.pairs.pack_pairs`` (chosen and rejected rows tied by ``pair``). Each sequence
is scored at its last real token (``RewardModel.layout_scores``); micro-batches hold whole pairs and the loss is
normalised by the step's pair count, so any ``micro_batch_size`` or layout gives the same update up to float
rounding. By default (``share_prompts``) a pair's two responses share one pass over their prompt and both scores
come from it. Data-parallel learners each compute their share of the micro-batches; sharded learners
(``--dist.shard fsdp``) run padding passes up to the largest share, and rank 0 keeps the whole reward model.
"""

from __future__ import annotations

import torch

from pickaxe.algos.configs import RewardModelConfig
from pickaxe.algos.llm_core import LMAlgorithm
from pickaxe.algos.pairs_core import Pairs, pair_layout, plan_pair_micro_batches, read_pairs, run_pair_plan
from pickaxe.algos.rlhf_core import PairLoss, bradley_terry_loss
from pickaxe.data.batch import Batch
from pickaxe.data.layout import SequenceBounds, TokenLayout, sequence_bounds
from pickaxe.models.reward import RewardModel
from pickaxe.models.sharding import through_root


def last_token_bounds(bounds: SequenceBounds) -> SequenceBounds:
    """The same sequences with only their last real token scored: a layout planned from these puts, for each
    sequence, the index of the hidden state just before its last token in ``hidden_index`` and of the last token
    itself in ``token_index()`` (where a reward model reads)."""
    return SequenceBounds(bounds.start, bounds.length, [[n - 1] if n > 1 else [] for n in bounds.length])


def score_prefix_lengths(bounds: SequenceBounds) -> list[int]:
    """Per sequence of ``bounds`` (response tokens scored), how many leading tokens a shared-prefix layout of its
    last-token bounds shares: its prompt (the tokens before its first scored one; the whole sequence without
    any), as for the policy's log-probs."""
    return [scored[0] if scored else n for scored, n in zip(bounds.scored, bounds.length, strict=True)]


class RewardModelTrainer(LMAlgorithm):
    """Trains a :class:`~pickaxe.models.reward.RewardModel` with the Bradley–Terry loss
    ``-log sigmoid(r_chosen - r_rejected - margin)`` (``margin``: the config's plus a batch's per-pair ``margin``).

    ``update(batch)`` takes one optimizer step over all the batch's pairs; ``evaluate(batch)`` returns the
    held-out pairwise accuracy (ties count as wrong). Exported like any model: ``networks()`` is ``{"policy":
    reward_model}`` (the whole weights, also when sharded); ``RewardModel.save(dir)`` writes a folder that
    ``RewardModel.load`` reads.
    """

    supports_data_parallel = True
    supports_sharding = True

    def __init__(self, model: RewardModel, config: RewardModelConfig | None = None) -> None:
        if not hasattr(model, "layout_scores"):
            raise TypeError(
                f"RewardModelTrainer needs a RewardModel (pickaxe.models.reward), got {type(model).__name__}; "
                "build one with RewardModel.from_lm(lm) or tiny_reward_model(vocab)"
            )
        super().__init__(model, config or RewardModelConfig())

    @property
    def layout(self) -> str:
        """The micro-batch layout of the forward passes (see :func:`~pickaxe.algos.pairs_core.pair_layout`:
        ``shared-prefix`` by default)."""
        return pair_layout(self.config, self.policy)

    def _plan(self, batch: Batch) -> tuple[Pairs, Batch, list[tuple[list[int], list[int], TokenLayout]]]:
        """The pairs of ``batch``, the batch on the device and its micro-batches, each sequence scored at its last
        real token. Device synchronisations: the pair ids (free for a CPU batch), the sequence bounds and the token
        ids (shared prompts)."""
        cfg = self.config
        pairs = read_pairs(batch)
        data = batch.to(self.device)
        full = sequence_bounds(data["attention_mask"], data["loss_mask"])
        layout = self.layout
        host = data["input_ids"].cpu().numpy() if layout == "shared-prefix" else None
        plan = plan_pair_micro_batches(
            data["input_ids"],
            last_token_bounds(full),
            pairs,
            cfg.micro_batch_size,
            layout,
            host_ids=host,
            prefix_lengths=score_prefix_lengths(full) if host is not None else None,
        )
        return pairs, data, plan

    def update(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on every pair of ``batch`` (with data-parallel learners, each computes its share of the
        micro-batches; gradients and sums are reduced in ``optimizer_step``; sharded, each also runs padding passes up
        to the largest share and rank 0's ``policy`` gets the new weights). Device synchronisations: those of
        planning (the pair ids, the sequence bounds, the token ids with shared prompts) and the optimizer step's
        one read."""
        cfg = self.config
        pairs, data, plan = self._plan(batch)
        n = len(pairs)
        margins = self._margins(data, pairs.chosen)
        self.model.train()

        def pair_loss(idx: list[int], _rows: list[int], layout: TokenLayout) -> PairLoss:
            k = len(idx)
            # it calls the decoder and the head apart: run as the sharded root's forward, which gathers the root's
            # own weights (embeddings, final norm, head)
            scores = through_root(self.model, lambda: self.model.layout_scores(layout, cfg.autocast))
            mb_margin = cfg.margin if margins is None else margins[torch.tensor(idx, device=self.device)] + cfg.margin
            return bradley_terry_loss(scores[:k], scores[k:], mb_margin, total_pairs=float(n))

        totals = run_pair_plan(plan, pair_loss, self.device, backward=True, share=self.share(len(plan)))
        grad_norm, loss_value, lr, (accuracy, margin_sum, chosen_sum, rejected_sum) = self.optimizer_step(
            totals.values[0], None, totals.values[1:]
        )
        self.model.eval()
        self.version += 1
        return self.sync_policy(
            {
                "loss/rm": loss_value,
                "rm/accuracy": accuracy,
                "rm/margin": margin_sum / n,
                "rm/chosen_reward": chosen_sum / n,
                "rm/rejected_reward": rejected_sum / n,
                "rm/pairs": float(n),
                "grad_norm": grad_norm,
                "rm/lr": lr,
                "perf/padding_fraction": totals.padding_fraction,
            }
        )

    @torch.no_grad()
    def evaluate(self, batch: Batch) -> float:
        """Pairwise accuracy on ``batch``'s pairs: the fraction whose chosen response scores strictly above the
        rejected one (eval mode, no gradient; the reads of planning and one of the result). One process computes it
        all with the whole weights (``policy``; no collective: data-parallel and sharded runs evaluate on rank 0
        alone)."""
        cfg = self.config
        pairs, _data, plan = self._plan(batch)
        self.policy.eval()
        correct = torch.zeros((), device=self.device)
        for idx, _rows, layout in plan:
            k = len(idx)
            scores = self.policy.layout_scores(layout, cfg.autocast)
            correct = correct + (scores[:k] > scores[k:]).sum()
        return float(correct) / max(len(pairs), 1)

    @staticmethod
    def _margins(data: Batch, chosen_rows: list[int]) -> torch.Tensor | None:
        """Per-pair ``margin`` from the batch (read on the chosen rows), or None without that key."""
        if "margin" not in data:
            return None
        return data["margin"].float()[torch.tensor(chosen_rows, device=data.device)]
