"""Micro-batching of preference pairs, shared by the reward model and DPO.

A pair's loss needs both of its responses in one graph, so micro-batches are cut between pairs, never inside one:
``pairs_per_micro_batch`` turns ``micro_batch_size`` (sequences) into whole pairs. Each micro-batch's rows are
``[chosen_1 .. chosen_k, rejected_1 .. rejected_k]``, laid out by ``llm_core.plan_micro_batches`` (padded or
packed) or with the prompt shared (``shared-prefix``: chosen and rejected of a pair, and pairs of one prompt, run
their prompt once, :mod:`pickaxe.data.shared_prefix`), so outputs split at ``k`` into the chosen and rejected
halves. With data-parallel learners each computes its share of a plan's micro-batches (:func:`run_pair_plan`;
sharded learners add padding passes so that each runs as many).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from pickaxe.algos.llm_core import plan_micro_batches
from pickaxe.algos.rlhf_core import PairLoss
from pickaxe.data.batch import Batch
from pickaxe.data.layout import SequenceBounds, TokenLayout
from pickaxe.data.shared_prefix import plan_shared_prefix
from pickaxe.models.lm import shares_prompts

PACK_GROUPS = 3
"""Shared-prefix rows of pairs hold several prompts' groups, in rows up to this many times the widest group's width
(the width with the fewest slots): a group (a prompt and two responses) is short, so one per row would leave the
groups' width differences as padding."""
PAIR_LAYOUTS = ("padded", "length-sorted", "packed", "shared-prefix")
"""Micro-batch layouts of preference pairs (``shared-prefix``: what ``share_prompts`` turns ``padded`` into)."""


@dataclass(frozen=True)
class Pairs:
    """A batch's pairs, read from its ``pair`` and ``chosen`` keys: pair ``i`` has id ``ids[i]`` and its responses
    in rows ``chosen[i]`` and ``rejected[i]`` (pairs in order of first appearance)."""

    ids: list[int]
    chosen: list[int]
    rejected: list[int]

    def __len__(self) -> int:
        return len(self.ids)


def read_pairs(batch: Batch) -> Pairs:
    """The pairs of a ``pack_pairs`` batch (one host read of ``pair`` and ``chosen``; free for a CPU batch). Each
    pair id must appear on exactly one chosen and one rejected row, or ``ValueError`` says which does not."""
    for key in ("pair", "chosen"):
        if key not in batch:
            raise ValueError(f"a preference batch needs a {key!r} key; build it with pickaxe.rollout.pairs.pack_pairs")
    meta = torch.stack([batch["pair"].long(), batch["chosen"].long()]).cpu().tolist()
    rows: dict[int, list[int | None]] = {}
    for row, (pid, is_chosen) in enumerate(zip(meta[0], meta[1], strict=True)):
        slot = rows.setdefault(pid, [None, None])
        k = 0 if is_chosen else 1
        if slot[k] is not None:
            raise ValueError(
                f"pair {pid} has two {'chosen' if k == 0 else 'rejected'} rows; give each pair one of each"
            )
        slot[k] = row
    incomplete = [pid for pid, (c, r) in rows.items() if c is None or r is None]
    if incomplete:
        raise ValueError(f"pair {incomplete[0]} lacks a chosen or a rejected row; give each pair one of each")
    ids = list(rows)
    return Pairs(ids, [int(rows[i][0]) for i in ids], [int(rows[i][1]) for i in ids])  # type: ignore[arg-type]


def pair_layout(config: Any, model: nn.Module) -> str:
    """The micro-batch layout of a pair learner's forward passes: ``shared-prefix`` for the ``padded`` layout when
    ``config.share_prompts`` is on and ``model``'s attention takes a 4-D mask (SDPA), else the config's
    ``micro_batch_layout`` (GRPO's rule)."""
    if config.share_prompts and config.micro_batch_layout == "padded" and shares_prompts(model):
        return "shared-prefix"
    return config.micro_batch_layout


def pairs_per_micro_batch(micro_batch_size: int) -> int:
    """Whole pairs in a micro-batch of ``micro_batch_size`` sequences (at least one)."""
    return max(1, micro_batch_size // 2)


def plan_pair_micro_batches(
    input_ids: torch.Tensor,
    bounds: SequenceBounds,
    pairs: Pairs,
    micro_batch_size: int,
    layout: str = "padded",
    subset: list[int] | None = None,
    host_ids: np.ndarray | None = None,
    prefix_lengths: list[int] | None = None,
) -> list[tuple[list[int], list[int], TokenLayout]]:
    """Micro-batches of the pairs ``subset`` (indices into ``pairs``; default all): ``(pair indices, rows,
    layout)`` with rows ``[chosen..., rejected...]``. ``length-sorted`` orders pairs by their longer response
    first; ``packed`` packs each micro-batch's sequences into shared rows; ``shared-prefix`` keeps the order and
    runs each prompt once per micro-batch (``host_ids``: ``input_ids`` on the host, read here when not given;
    ``prefix_lengths``: where each row's shared part ends, default before its first scored token)."""
    if layout not in PAIR_LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(PAIR_LAYOUTS)}")
    order = list(range(len(pairs))) if subset is None else list(subset)
    if layout == "length-sorted":
        order.sort(key=lambda i: max(bounds.length[pairs.chosen[i]], bounds.length[pairs.rejected[i]]))
    mode = "packed" if layout == "packed" else "padded"
    if layout == "shared-prefix" and host_ids is None:
        host_ids = input_ids.detach().cpu().numpy()
    size = pairs_per_micro_batch(micro_batch_size)
    out = []
    for s in range(0, len(order), size):
        chunk = order[s : s + size]
        rows = [pairs.chosen[i] for i in chunk] + [pairs.rejected[i] for i in chunk]
        if layout == "shared-prefix":
            planned = plan_shared_prefix(
                input_ids, bounds, rows, host_ids, prefix_lengths=prefix_lengths, pack_groups=PACK_GROUPS
            )
            out.append((chunk, rows, planned))
            continue
        planned_rows, planned_layout = plan_micro_batches(input_ids, bounds, rows, len(rows), mode)[0]
        out.append((chunk, planned_rows, planned_layout))
    return out


@dataclass
class PairTotals:
    """Sums over a plan's micro-batches: ``values`` is one device tensor ``[loss, accuracy, margin, chosen,
    rejected]`` (the pair losses are already divided by the whole batch's pair count, so ``loss`` and ``accuracy``
    are the batch's; the last three are sums over pairs); ``real``/``slots`` count real tokens and computed slots."""

    values: torch.Tensor
    real: int
    slots: int

    @property
    def padding_fraction(self) -> float:
        """Share of computed slots that were padding."""
        return 1.0 - self.real / max(self.slots, 1)


def run_pair_plan(
    plan: list[tuple[list[int], list[int], TokenLayout]],
    pair_loss: Callable[[list[int], list[int], TokenLayout], PairLoss],
    device: torch.device,
    backward: bool,
    share: list[tuple[int, float]] | None = None,
) -> PairTotals:
    """``pair_loss`` of each micro-batch of ``plan`` (pair indices, rows, layout), summed without a host read; with
    ``backward``, each micro-batch's loss is back-propagated as it is computed (gradient accumulation). ``share``:
    ``(index, weight)`` of the micro-batches this learner runs (``LMAlgorithm.share``: its share of a data-parallel
    step, then a sharded learner's padding passes of weight 0, whose loss is back-propagated times 0 and not
    counted); default every micro-batch. ``values`` are then its partial sums, to be summed over the learners,
    while ``real``/``slots`` count the whole plan (host numbers, alike on every learner)."""
    values = torch.zeros(5, device=device)
    for j, weight in [(j, 1.0) for j in range(len(plan))] if share is None else share:
        idx, rows, layout = plan[j]
        out = pair_loss(idx, rows, layout)
        if not weight:  # a sharded learner's padding pass: the others' collectives, no gradient
            if backward:
                (out.loss * 0.0).backward()
            continue
        if backward:
            out.loss.backward()
        parts = [out.loss.detach(), out.accuracy, out.margin.sum(), out.chosen.sum(), out.rejected.sum()]
        values = values + torch.stack([p.detach().float() for p in parts])
    real = sum(layout.real_tokens for _, _, layout in plan)
    slots = sum(layout.slots for _, _, layout in plan)
    return PairTotals(values, real, slots)
