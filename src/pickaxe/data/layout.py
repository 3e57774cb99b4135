"""Token layouts: where a micro-batch's sequences sit in the rows a language model is fed, and which hidden states
score which tokens.

A batch from the text collector is a ``[B, L]`` block in which each row holds one sequence as a contiguous run of
real tokens (prompt left-padded, completion right-padded). The learner only needs log-probs of the scored tokens
(``score_mask``, the completion), so a layout records, for each scored token, the flat index of the hidden state
that predicts it (the one just before it) and the flat index where its log-prob goes back in the ``[B, L]`` block.

Two layouts:

* ``padded``: one sequence per row, moved to the left edge, rows as wide as the longest sequence (padding that
  every row shares is gone; a 2-D attention mask hides the rest);
* ``packed``: several sequences per row (first-fit by decreasing length into rows as wide as the longest
  sequence), position ids restarting at 0 for each sequence and a block-diagonal causal mask (each sequence
  attends only to itself).

Positions always count real tokens from 0, as ``position_ids(attention_mask)`` does for left-padded rows, so every
layout computes the same numbers up to float rounding. Layouts are planned from Python integers (one host read
of the sequence bounds per batch, see :func:`sequence_bounds`); building one copies index tensors to the device and
gathers the token ids there, without a device-to-host synchronisation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

LayoutMode = Literal["padded", "packed"]


@dataclass
class TokenLayout:
    """Model input rows for some sequences of a ``[b, L]`` block, and where their scored tokens are.

    ``input_ids``/``position_ids``/``segments`` are ``[R, W]``; ``segments`` numbers the sequences within each row
    (0, 1, ...) and is -1 on padding: a token may attend to earlier tokens of its own segment only (see
    :meth:`attention_mask`). ``packed`` says whether rows may hold several sequences. ``hidden_index`` (``[N]``)
    indexes the flattened ``[R * W]`` hidden states
    that predict the scored tokens ``targets`` (``[N]``); ``out_index`` (``[N]``) is where each log-prob goes in
    the flattened ``[b * L]`` block ``shape``. ``real_tokens`` / ``slots`` count real tokens and ``R * W``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segments: torch.Tensor
    packed: bool
    hidden_index: torch.Tensor
    targets: torch.Tensor
    out_index: torch.Tensor
    shape: tuple[int, int]
    real_tokens: int
    slots: int

    def padding_mask(self) -> torch.Tensor:
        """``[R, W]`` 1 on real tokens, 0 on padding (the 2-D mask of one-sequence-per-row layouts)."""
        return (self.segments >= 0).long()

    def attention_mask(self) -> torch.Tensor:
        """``[R, 1, W, W]`` boolean mask, True where query ``i`` may attend to key ``j``: ``j <= i`` in the same
        segment (padding attends to padding, so no query row is fully masked). Built on the device without a host
        read, unlike a 2-D mask that ``transformers`` inspects."""
        W = self.segments.shape[1]
        causal = torch.ones(W, W, dtype=torch.bool, device=self.segments.device).tril()
        same = self.segments[:, :, None] == self.segments[:, None, :]
        return (same & causal).unsqueeze(1)

    def token_index(self) -> torch.Tensor:
        """``[N]`` flat index of each scored token itself in the ``[R * W]`` rows: the position after the hidden
        state that predicts it (what a head read at the token, e.g. a reward model's, takes)."""
        return self.hidden_index + 1

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """``[b, L]`` float32 block holding ``values`` (``[N]``, one per scored token) at the scored tokens, 0
        elsewhere."""
        out = values.new_zeros(self.shape[0] * self.shape[1], dtype=torch.float32)
        return out.index_put((self.out_index,), values.float()).view(self.shape)


@dataclass(frozen=True)
class SequenceBounds:
    """Per sequence of a ``[B, L]`` block (Python ints): first real column, number of real tokens, and the columns
    of its scored tokens relative to ``start``."""

    start: list[int]
    length: list[int]
    scored: list[list[int]]


def sequence_bounds(attention_mask: torch.Tensor, score_mask: torch.Tensor) -> SequenceBounds:
    """Read each row's real-token run and scored columns from the masks: one host read for the whole batch.

    Each row's real tokens must be contiguous (left-padded prompt, right-padded completion) and scored tokens
    must be real tokens after the first one (a first token has no context to be predicted from).
    """
    masks = torch.stack([attention_mask.detach().bool(), score_mask.detach().bool()]).cpu().numpy()  # the one read
    attn, score = masks[0], masks[1]
    length = attn.sum(-1)
    start = np.where(length > 0, attn.argmax(-1), 0)
    cols = np.arange(attn.shape[1])
    run = (cols >= start[:, None]) & (cols < (start + length)[:, None])
    if not (run == attn).all():
        raise ValueError("each row's real tokens (attention_mask) must be one contiguous run")
    if (score & ~attn).any() or (score & (cols <= start[:, None])).any():
        raise ValueError("scored tokens (loss_mask) must be real tokens after each row's first token")
    starts, lengths = start.tolist(), length.tolist()
    rows, rel = score.nonzero()
    scored: list[list[int]] = [[] for _ in starts]
    for r, c in zip(rows.tolist(), rel.tolist(), strict=True):
        scored[r].append(c - starts[r])
    return SequenceBounds(starts, lengths, scored)


def plan_layout(
    input_ids: torch.Tensor,
    bounds: SequenceBounds,
    rows: list[int] | None = None,
    mode: LayoutMode = "padded",
) -> TokenLayout:
    """The layout of sequences ``rows`` (indices into ``input_ids``'s ``[B, L]`` block and ``bounds``; default all)
    in ``mode``. The output block (``shape``, ``out_index``) is ``[len(rows), L]`` with the sequences in the order of
    ``rows`` and in their original columns, so log-probs line up with the rows' other per-token tensors."""
    rows = list(range(input_ids.shape[0])) if rows is None else list(rows)
    L = input_ids.shape[1]
    width = max([bounds.length[r] for r in rows] + [1])
    if mode == "packed":
        bins = _first_fit(rows, bounds, width)
    elif mode == "padded":
        bins = [[r] for r in rows]
    else:
        raise ValueError(f"unknown layout {mode!r}; choose padded or packed")
    src_cols: list[list[int]] = []  # per packed slot: the flat source index in input_ids, -1 for padding
    pos: list[list[int]] = []
    seg: list[list[int]] = []
    hidden, out, local = [], [], {r: i for i, r in enumerate(rows)}
    for i, members in enumerate(bins):
        row_src, row_pos, row_seg, offset = [], [], [], 0
        for k, r in enumerate(members):
            s, n = bounds.start[r], bounds.length[r]
            row_src.extend(range(r * L + s, r * L + s + n))
            row_pos.extend(range(n))
            row_seg.extend([k] * n)
            for c in bounds.scored[r]:
                hidden.append(i * width + offset + c - 1)
                out.append(local[r] * L + s + c)
            offset += n
        pad = width - offset
        src_cols.append(row_src + [-1] * pad)
        pos.append(row_pos + [0] * pad)
        seg.append(row_seg + [-1] * pad)
    device = input_ids.device
    ids, position_ids, segments, src = row_tensors(input_ids, src_cols, pos, seg)
    hidden_index = torch.tensor(hidden, dtype=torch.long)
    target_src = src.reshape(-1)[hidden_index + 1]
    flat = input_ids.reshape(-1)
    return TokenLayout(
        input_ids=ids,
        position_ids=position_ids,
        segments=segments,
        packed=mode == "packed",
        hidden_index=hidden_index.to(device),
        targets=flat[target_src.to(device)],
        out_index=torch.tensor(out, dtype=torch.long).to(device),
        shape=(len(rows), L),
        real_tokens=sum(bounds.length[r] for r in rows),
        slots=len(bins) * width,
    )


def row_tensors(
    input_ids: torch.Tensor, src: list[list[int]], pos: list[list[int]], seg: list[list[int]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A planned layout's model rows on ``input_ids``' device: the token ids gathered from ``src`` (each slot's
    flat index into ``input_ids``, -1 for padding, which gets token 0), the position ids ``pos``, the segment ids
    ``seg``, and ``src`` itself as a host tensor."""
    device = input_ids.device
    src_t = torch.tensor(src, dtype=torch.long)
    real = (src_t >= 0).to(device)
    ids = input_ids.reshape(-1)[src_t.clamp(min=0).to(device)].masked_fill(~real, 0)
    position_ids = torch.tensor(pos, dtype=torch.long).to(device)
    return ids, position_ids, torch.tensor(seg, dtype=torch.long).to(device), src_t


def over_layouts(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    score_mask: torch.Tensor,
    block: Callable[[TokenLayout], torch.Tensor],
    rows: int = 0,
    mode: LayoutMode = "padded",
    plan: Callable[[SequenceBounds, list[int]], TokenLayout] | None = None,
) -> torch.Tensor:
    """``[B, L]`` float32 from ``block(layout)`` (a ``[b, L]`` block per layout) over a collector batch: the bounds
    are read once, ``rows`` sequences (0: all) go into each layout of ``mode`` (or of ``plan(bounds, rows)``), and
    the blocks are concatenated in batch order. What per-token log-probs and values of a whole batch are computed
    with."""
    bounds = sequence_bounds(attention_mask, score_mask)
    plan = plan or (lambda b, chunk: plan_layout(input_ids, b, chunk, mode))
    B = input_ids.shape[0]
    step = rows or max(B, 1)
    out = [block(plan(bounds, list(range(s, min(s + step, B))))) for s in range(0, B, step)]
    return torch.cat(out) if out else input_ids.new_zeros(input_ids.shape, dtype=torch.float32)


def _first_fit(rows: list[int], bounds: SequenceBounds, width: int) -> list[list[int]]:
    """First-fit decreasing: sequences (longest first) into bins of ``width`` tokens."""
    bins: list[list[int]] = []
    free: list[int] = []
    for r in sorted(rows, key=lambda r: -bounds.length[r]):
        n = bounds.length[r]
        for i, room in enumerate(free):
            if n <= room:
                bins[i].append(r)
                free[i] -= n
                break
        else:
            bins.append([r])
            free.append(width - n)
    return bins
