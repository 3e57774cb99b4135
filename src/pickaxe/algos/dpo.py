"""Direct Preference Optimization (DPO, and IPO through ``DPOConfig.loss``) on preference pairs.

A batch comes from ``pickaxe.rollout.pairs.pack_pairs``. A sequence's log-prob is the sum of its response tokens'
log-probs (``loss_mask``; per-token mean for IPO, as TRL does). The frozen reference's log-probs do not change, so
each pair's are computed once, the first time its id is seen, and cached under that id: later epochs run only the
policy. Micro-batches hold whole pairs and the loss is normalised by the step's pair count, so any
``micro_batch_size`` or layout gives the same update up to float rounding. By default (``share_prompts``) a pair's
two responses share one pass over their prompt, in the policy's and the reference's forward passes. Data-parallel
learners each compute their share of the micro-batches (and of the reference's, for pairs not cached yet). Sharded
learners (``--dist.shard fsdp``) shard the frozen reference like the policy (each holds 1/N of it): every learner
scores its own share of the pairs not cached yet, running padding passes up to the largest share, and held-out pairs
are scored by all learners together (:meth:`LMAlgorithm.score_reference`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from pickaxe.algos.base import all_reduce, data_parallel, my_share
from pickaxe.algos.configs import DPOConfig
from pickaxe.algos.llm_core import LMAlgorithm, sequence_sum
from pickaxe.algos.pairs_core import Pairs, pair_layout, plan_pair_micro_batches, read_pairs, run_pair_plan
from pickaxe.algos.rlhf_core import PairLoss, dpo_loss
from pickaxe.data.batch import Batch
from pickaxe.data.layout import SequenceBounds, TokenLayout, sequence_bounds
from pickaxe.errors import PickaxeError
from pickaxe.models.lm import layout_logprobs, shares_prompts
from pickaxe.models.lora import SharedReference
from pickaxe.models.sharding import Offload, through_root


class DPO(LMAlgorithm):
    """DPO on a causal LM against a frozen ``reference`` (default: a copy of ``model`` as given).

    ``update(batch)`` takes one optimizer step over all the batch's pairs and logs ``loss/dpo``, ``dpo/accuracy``
    (pairs whose implicit reward ``beta (log pi - log pi_ref)`` is higher for the chosen response), ``dpo/margin``
    (mean chosen minus rejected implicit reward), ``dpo/chosen_reward``, ``dpo/rejected_reward`` and
    ``dpo/ref_cache_hits`` (fraction of the batch's pairs whose reference log-probs came from the cache).
    ``evaluate(batch)`` reports the same on held-out pairs without touching the cache.

    The cache maps a pair id to the reference's summed response log-probs of its two responses (one device tensor
    row per pair) and their token counts; a cached id seen with different lengths raises ``ValueError`` (ids must
    name one pair for the whole run). ``reference_sequences`` counts the sequences the reference has scored (over
    every data-parallel learner: each computes its share of them and the values are summed).
    """

    supports_data_parallel = True
    supports_sharding = True

    def __init__(self, model: nn.Module, config: DPOConfig | None = None, reference: nn.Module | None = None) -> None:
        ref = copy.deepcopy(model) if reference is None else reference
        super().__init__(model, config or DPOConfig(), ref)
        self.reference: nn.Module = ref
        self._slots: dict[int, int] = {}  # pair id -> row of _ref_values
        self._lengths: dict[int, tuple[int, int, int, int]] = {}  # pair id -> (seq len c, seq len r, resp c, resp r)
        self._ref_values = torch.zeros(0, 2, device=self.device)
        self.reference_sequences = 0

    def shard(self, offload: Offload = "none") -> None:
        """``LMAlgorithm.shard``: the policy, and the frozen reference in place on every learner (unless
        ``shard_reference`` is False: then it stays whole on every learner). A LoRA policy's
        shared reference (the policy with its adapters off) would be sharded with it on every learner but rank 0,
        while each learner scores its own share of the pairs with it: refused in one line."""
        if isinstance(self.reference, SharedReference):
            raise PickaxeError(
                "DPO cannot shard a LoRA policy whose reference is itself with the adapters off (every learner "
                "scores its share of the pairs with it); use --dist.shard none"
            )
        super().shard(offload)
        if self._ref_values.is_meta:  # built with a meta policy (a learner other than rank 0): an empty cache
            self._ref_values = torch.zeros(self._ref_values.shape, device=self.device)

    @property
    def layout(self) -> str:
        """The micro-batch layout of the policy's and the reference's forward passes (see
        :func:`~pickaxe.algos.pairs_core.pair_layout`: ``shared-prefix`` by default, when both take a 4-D mask)."""
        layout = pair_layout(self.config, self.policy)
        return "padded" if layout == "shared-prefix" and not shares_prompts(self.reference) else layout

    def update(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on every pair of ``batch`` (with data-parallel learners, each computes its share of the
        micro-batches; gradients and sums are reduced in ``optimizer_step``; sharded, each also runs padding passes up
        to the largest share and rank 0's ``policy`` gets the new weights). Device synchronisations: the pair ids
        (free for a CPU batch), the sequence bounds, the token ids (shared prompts) and the optimizer step's one
        read."""
        cfg = self.config
        pairs = read_pairs(batch)
        data = batch.to(self.device)
        bounds = sequence_bounds(data["attention_mask"], data["loss_mask"])
        n = len(pairs)
        layout = self.layout
        host = data["input_ids"].cpu().numpy() if layout == "shared-prefix" else None  # planned once per update
        hits = self._fill_cache(data, bounds, pairs, host)
        ref = self._ref_values[torch.tensor([self._slots[i] for i in pairs.ids], device=self.device)]
        counts = self._token_counts(bounds, pairs)
        self.model.train()
        plan = plan_pair_micro_batches(data["input_ids"], bounds, pairs, cfg.micro_batch_size, layout, host_ids=host)
        loss_fn = self._pair_loss(data, ref, counts, float(n), self.forward_logprobs)
        totals = run_pair_plan(plan, loss_fn, self.device, backward=True, share=self.share(len(plan)))
        grad_norm, loss_value, lr, (accuracy, margin_sum, chosen_sum, rejected_sum) = self.optimizer_step(
            totals.values[0], None, totals.values[1:]
        )
        self.model.eval()
        self.version += 1
        return self.sync_policy(
            {
                "loss/dpo": loss_value,
                "dpo/accuracy": accuracy,
                "dpo/margin": margin_sum / n,
                "dpo/chosen_reward": chosen_sum / n,
                "dpo/rejected_reward": rejected_sum / n,
                "dpo/ref_cache_hits": hits / n,
                "dpo/pairs": float(n),
                "grad_norm": grad_norm,
                "dpo/lr": lr,
                "perf/padding_fraction": totals.padding_fraction,
            }
        )

    @torch.no_grad()
    def evaluate(self, batch: Batch) -> dict[str, float]:
        """``dpo/eval_accuracy``, ``dpo/eval_margin``, ``dpo/eval_chosen_reward``, ``dpo/eval_rejected_reward`` and
        ``loss/dpo_eval`` on ``batch``'s pairs (eval mode, no gradient); the reference scores them afresh, so
        held-out ids never enter the training cache. One process computes it all with the whole weights
        (``policy``; data-parallel runs evaluate on rank 0 alone). Sharded, the reference's scores are a collective
        (:meth:`score_reference`, which the launcher has the other learners join); a learner other than rank 0 that
        calls ``evaluate`` takes part in it and returns ``{}``."""
        cfg = self.config
        pairs = read_pairs(batch)
        data = batch.to(self.device)
        bounds = sequence_bounds(data["attention_mask"], data["loss_mask"])
        n = len(pairs)
        layout = self.layout
        host = data["input_ids"].cpu().numpy() if layout == "shared-prefix" else None
        if self.reference_sharded:
            tokens = self.score_reference(data["input_ids"], data["attention_mask"], data["loss_mask"])
            sums = sequence_sum(tokens, data["loss_mask"])
            ref = torch.stack([sums[list(pairs.chosen)], sums[list(pairs.rejected)]], dim=1)
            if data_parallel()[0] != 0:
                return {}
        else:
            ref = self._reference_logprobs(data, bounds, pairs, list(range(n)), host, shared=False)
        counts = self._token_counts(bounds, pairs)
        self.policy.eval()
        plan = plan_pair_micro_batches(data["input_ids"], bounds, pairs, cfg.micro_batch_size, layout, host_ids=host)

        def whole(layout: TokenLayout) -> torch.Tensor:
            chunk = cfg.logprob_chunk_tokens
            return layout.scatter(layout_logprobs(self.policy, layout, 1.0, 0, 1.0, chunk, cfg.autocast))

        totals = run_pair_plan(plan, self._pair_loss(data, ref, counts, float(n), whole), self.device, backward=False)
        loss, accuracy, margin, chosen, rejected = totals.values.tolist()
        return {
            "loss/dpo_eval": loss,
            "dpo/eval_accuracy": accuracy,
            "dpo/eval_margin": margin / n,
            "dpo/eval_chosen_reward": chosen / n,
            "dpo/eval_rejected_reward": rejected / n,
        }

    def _pair_loss(
        self,
        data: Batch,
        ref: torch.Tensor,
        counts: torch.Tensor,
        n: float,
        forward: Callable[[TokenLayout], torch.Tensor],
    ) -> Callable[[list[int], list[int], TokenLayout], PairLoss]:
        """The DPO loss of one micro-batch of ``data``'s pairs (for :func:`run_pair_plan`): summed response
        log-probs of its rows under the policy (``forward``: a layout's ``[b, L]`` log-probs) against the
        reference's ``ref`` (``counts``: response tokens)."""

        def pair_loss(idx: list[int], rows: list[int], layout: TokenLayout) -> PairLoss:
            k = len(idx)
            mask = data["loss_mask"][torch.tensor(rows, device=self.device)]
            logp = sequence_sum(forward(layout), mask)
            sel = torch.tensor(idx, device=self.device)
            return self._loss(logp[:k], logp[k:], ref[sel], counts[sel], n)

        return pair_loss

    def _loss(
        self, pi_c: torch.Tensor, pi_r: torch.Tensor, ref: torch.Tensor, counts: torch.Tensor, n: float
    ) -> PairLoss:
        """``dpo_loss`` of a micro-batch's pairs; IPO compares per-token means (``counts``: response tokens)."""
        cfg = self.config
        ref_c, ref_r = ref[:, 0], ref[:, 1]
        if cfg.loss == "ipo":
            pi_c, pi_r = pi_c / counts[:, 0], pi_r / counts[:, 1]
            ref_c, ref_r = ref_c / counts[:, 0], ref_r / counts[:, 1]
        return dpo_loss(pi_c, pi_r, ref_c, ref_r, cfg.beta, cfg.loss, cfg.label_smoothing, total_pairs=n)

    def _token_counts(self, bounds: SequenceBounds, pairs: Pairs) -> torch.Tensor:
        """``[P, 2]`` response token counts (at least 1) of each pair's chosen and rejected rows."""
        counts = [
            [max(1, len(bounds.scored[c])), max(1, len(bounds.scored[r]))]
            for c, r in zip(pairs.chosen, pairs.rejected, strict=True)
        ]
        return torch.tensor(counts, dtype=torch.float32, device=self.device)

    def _fill_cache(self, data: Batch, bounds: SequenceBounds, pairs: Pairs, host: np.ndarray | None) -> int:
        """Compute and store the reference log-probs of ``pairs`` not cached yet (each learner its share, summed);
        returns how many were cached."""
        missing = []
        for i, (pid, c, r) in enumerate(zip(pairs.ids, pairs.chosen, pairs.rejected, strict=True)):
            lengths = (bounds.length[c], bounds.length[r], len(bounds.scored[c]), len(bounds.scored[r]))
            if pid not in self._slots:
                missing.append(i)
            elif self._lengths[pid] != lengths:
                raise ValueError(
                    f"pair id {pid} was cached for responses of other lengths {self._lengths[pid]} than now {lengths}; "
                    "give each distinct pair one id for the whole run (e.g. its index in the dataset)"
                )
        if missing:
            values = self._reference_logprobs(data, bounds, pairs, missing, host, shared=True)
            start = self._ref_values.shape[0]
            self._ref_values = torch.cat([self._ref_values, values])
            for j, i in enumerate(missing):
                pid, c, r = pairs.ids[i], pairs.chosen[i], pairs.rejected[i]
                self._slots[pid] = start + j
                self._lengths[pid] = (bounds.length[c], bounds.length[r], len(bounds.scored[c]), len(bounds.scored[r]))
        return len(pairs) - len(missing)

    @torch.no_grad()
    def _reference_logprobs(
        self,
        data: Batch,
        bounds: SequenceBounds,
        pairs: Pairs,
        subset: list[int],
        host: np.ndarray | None,
        shared: bool,
    ) -> torch.Tensor:
        """``[len(subset), 2]`` summed response log-probs of the pairs ``subset`` under the reference, in the order
        of ``subset``, micro-batched and laid out like the policy's forward (``host``: the token ids on the host for
        the shared-prefix layout). With ``shared``, each data-parallel learner computes its share of the
        micro-batches and the results are summed over the learners (a collective: every learner must call it)."""
        cfg = self.config
        out = torch.zeros(len(subset), 2, device=self.device)
        where = {i: j for j, i in enumerate(subset)}
        plan = plan_pair_micro_batches(
            data["input_ids"], bounds, pairs, cfg.micro_batch_size, self.layout, subset, host_ids=host
        )
        self.reference_sequences += sum(len(rows) for _, rows, _ in plan)
        ref = self.reference
        if not shared:
            passes = [(j, 1.0) for j in range(len(plan))]
        else:  # sharded reference: padding passes up to the largest share
            passes = self.share(len(plan)) if self.reference_sharded else [(j, 1.0) for j in my_share(len(plan))]
        for j, weight in passes:
            idx, rows, layout = plan[j]
            k = len(idx)
            logp = through_root(  # sharded: every learner runs as many passes (padding ones discarded)
                ref,
                lambda layout=layout: layout_logprobs(ref, layout, 1.0, 0, 1.0, cfg.logprob_chunk_tokens, cfg.autocast),
            )
            if not weight:
                continue
            sums = sequence_sum(layout.scatter(logp), data["loss_mask"][torch.tensor(rows, device=self.device)])
            dest = torch.tensor([where[i] for i in idx], device=self.device)
            out[dest] = torch.stack([sums[:k], sums[k:]], dim=1)
        return all_reduce(out) if shared else out  # every pair computed by one learner, 0 on the others

    def state_dict(self) -> dict[str, Any]:
        """The LM learner's state, the reference weights and the reference cache."""
        state = super().state_dict()  # the reference's weights included (sharded: this learner's rows)
        ids = list(self._slots)
        state["ref_cache"] = {
            "ids": torch.tensor(ids, dtype=torch.long),
            "values": self._ref_values[[self._slots[i] for i in ids]].cpu() if ids else torch.zeros(0, 2),
            "lengths": torch.tensor([self._lengths[i] for i in ids], dtype=torch.long).reshape(-1, 4),
        }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        super().load_state_dict(state)
        cache = state["ref_cache"]
        ids = [int(i) for i in cache["ids"].tolist()]
        self._ref_values = cache["values"].float().to(self.device)
        self._slots = {pid: j for j, pid in enumerate(ids)}
        self._lengths = {pid: tuple(v) for pid, v in zip(ids, cache["lengths"].tolist(), strict=True)}
