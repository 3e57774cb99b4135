"""The shared-prefix token layout: sequences that start with the same unscored tokens (the ``G`` completions of
one prompt in a GRPO batch) share one copy of them in a model row.

A row holds the prefix once (segment 0) followed by each sequence's remaining tokens (segments 1, 2, ...), with
positions continuing from the prefix's end in every branch, and a tree-shaped causal mask: a branch's tokens attend
to the prefix and to their own branch, the prefix only to itself. Every token therefore sees exactly the tokens it
sees in its own padded row (the prefix's hidden states do not depend on what follows them), so the log-probs are
those of the ``padded`` layout up to float rounding, while the decoder runs each prompt once instead of ``G`` times.
The prefix of a sequence is everything before its first scored token; the hidden state at the prefix's last
position predicts every branch's first token.

Rows are capped at ``max(2 x the longest sequence, min_width)`` tokens: a group that does not fit continues in
another row with its own copy of the prefix, so attention, quadratic in the row width, stays bounded. With
``pack_groups`` a row may hold several groups (each its prefix and branches; first-fit by decreasing width into
rows of the width, up to ``pack_groups`` times the widest group's, that takes the fewest slots), so short groups
leave little padding: preference pairs, whose group is a prompt and two responses, are packed so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pickaxe.data.layout import SequenceBounds, TokenLayout, row_tensors

MIN_WIDTH = 512
"""Rows may always grow to this many tokens, however short the sequences."""
SEARCH_GROUPS = 256
"""With ``pack_groups``, up to this many groups per layout try every row width (a few milliseconds); more use
``pack_groups`` x the widest group's width."""


@dataclass
class SharedPrefixLayout(TokenLayout):
    """A :class:`TokenLayout` whose rows hold one shared prefix (segment 0) and several branches after it, or with
    ``stride`` > 0 several groups: group ``g`` of a row has its prefix in segment ``g * stride`` and its branches in
    ``g * stride + 1, 2, ...``. ``token_at`` (``[N]``) is the flat index of each scored token itself in the rows
    (a branch's first token does not follow the hidden state that predicts it, the prefix's last)."""

    token_at: torch.Tensor | None = None
    stride: int = 0

    def attention_mask(self) -> torch.Tensor:
        """``[R, 1, W, W]`` boolean mask: query ``i`` may attend to key ``j <= i`` of its own segment, and a branch
        also to its group's prefix; padding (-1) attends to padding."""
        W = self.segments.shape[1]
        causal = torch.ones(W, W, dtype=torch.bool, device=self.segments.device).tril()
        query, key = self.segments[:, :, None], self.segments[:, None, :]
        if self.stride:
            prefix = (key >= 0) & (key % self.stride == 0)
            allowed = (query == key) | (prefix & (query // self.stride == key // self.stride))
        else:
            allowed = (query == key) | ((key == 0) & (query > 0))
        return (allowed & causal).unsqueeze(1)

    def padding_mask(self) -> torch.Tensor:
        """Not expressible as a 2-D mask: refuse, naming the fix."""
        raise ValueError(
            "a shared-prefix layout needs the 4-D attention mask of the sdpa kernel; load the model with "
            "attn_implementation='sdpa' or set share_prompts=False"
        )

    def token_index(self) -> torch.Tensor:
        """``[N]`` flat index of each scored token itself in the ``[R * W]`` rows."""
        return self.hidden_index + 1 if self.token_at is None else self.token_at


def plan_shared_prefix(
    input_ids: torch.Tensor,
    bounds: SequenceBounds,
    rows: list[int] | None = None,
    host_ids: np.ndarray | None = None,
    min_width: int = MIN_WIDTH,
    prefix_lengths: list[int] | None = None,
    pack_groups: int = 0,
) -> SharedPrefixLayout:
    """The shared-prefix layout of sequences ``rows`` (indices into ``input_ids``'s ``[B, L]`` block and
    ``bounds``; default all). Sequences whose prefixes (the tokens before the first scored one) are equal share a
    row; the output block is ``[len(rows), L]`` in the order of ``rows``, as in
    :func:`~pickaxe.data.layout.plan_layout`.

    ``host_ids`` is ``input_ids`` as a host array (read from the device when not given: pass it to plan several
    layouts of one batch with one read). ``prefix_lengths`` (per row of the block, like ``bounds``) overrides where
    each sequence's prefix ends: any cut gives the padded layout's numbers, it only decides what is shared.
    ``pack_groups`` > 0 packs several groups into a row of up to ``pack_groups`` x the widest group's width, the
    width with the fewest slots (0: one group per row)."""
    rows = list(range(input_ids.shape[0])) if rows is None else list(rows)
    L = input_ids.shape[1]
    host = input_ids.detach().cpu().numpy() if host_ids is None else host_ids
    if prefix_lengths is None:
        prefix = {r: bounds.scored[r][0] if bounds.scored[r] else bounds.length[r] for r in rows}
    else:
        prefix = {r: min(max(prefix_lengths[r], 0), bounds.length[r]) for r in rows}
    groups: dict[bytes, list[int]] = {}
    for r in rows:
        s = bounds.start[r]
        groups.setdefault(host[r, s : s + prefix[r]].tobytes(), []).append(r)
    cap = max(2 * max([bounds.length[r] for r in rows] + [1]), min_width)
    bins: list[list[int]] = []  # members of each group's copy of its prefix; the first member's prefix is its
    for members in groups.values():
        p, current, width = prefix[members[0]], [], prefix[members[0]]
        for r in members:
            extra = bounds.length[r] - p
            if current and width + extra > cap:
                bins.append(current)
                current, width = [], p
            current.append(r)
            width += extra
        bins.append(current)
    widths = [prefix[b[0]] + sum(bounds.length[r] - prefix[r] for r in b) for b in bins]
    W = max([*widths, 1])
    stride = 0
    if pack_groups > 0 and bins:
        stride = max(len(b) for b in bins) + 1
        # the row width with the fewest slots (rows x width of the fullest row), narrowest on a tie; the search is
        # skipped for many groups, where it would cost more than it saves
        widths_tried = range(W, pack_groups * W + 1) if len(bins) <= SEARCH_GROUPS else [pack_groups * W]
        best: tuple[int, list[list[int]], int] | None = None
        for width in widths_tried:
            packed, used = _first_fit(widths, width)
            if best is None or len(packed) * used < best[0]:
                best = (len(packed) * used, packed, used)
        assert best is not None
        _, packed, W = best
        row_bins = [[bins[b] for b in row] for row in packed]
    else:
        row_bins = [[b] for b in bins]
    src: list[list[int]] = []
    pos: list[list[int]] = []
    seg: list[list[int]] = []
    hidden, token_at, targets, out, local = [], [], [], [], {r: i for i, r in enumerate(rows)}
    real = 0
    for i, groups_of_row in enumerate(row_bins):
        row_src: list[int] = []
        row_pos: list[int] = []
        row_seg: list[int] = []
        for g, members in enumerate(groups_of_row):
            first = members[0]
            p, s0, base = prefix[first], bounds.start[first], len(row_src)
            row_src.extend(range(first * L + s0, first * L + s0 + p))
            row_pos.extend(range(p))
            row_seg.extend([g * stride] * p)
            for k, r in enumerate(members, start=1):
                s, n = bounds.start[r], bounds.length[r]
                offset = len(row_src)  # where this branch's column p sits in the row
                row_src.extend(range(r * L + s + p, r * L + s + n))
                row_pos.extend(range(p, n))
                row_seg.extend([g * stride + k] * (n - p))
                for c in bounds.scored[r]:
                    hidden.append(i * W + (base + c - 1 if c - 1 < p else offset + c - 1 - p))
                    token_at.append(i * W + (base + c if c < p else offset + c - p))
                    targets.append(r * L + s + c)
                    out.append(local[r] * L + s + c)
        real += len(row_src)
        pad = W - len(row_src)
        src.append(row_src + [-1] * pad)
        pos.append(row_pos + [0] * pad)
        seg.append(row_seg + [-1] * pad)
    device = input_ids.device
    ids, position_ids, segments, _ = row_tensors(input_ids, src, pos, seg)
    flat = input_ids.reshape(-1)
    return SharedPrefixLayout(
        input_ids=ids,
        position_ids=position_ids,
        segments=segments,
        packed=True,
        hidden_index=torch.tensor(hidden, dtype=torch.long).to(device),
        targets=flat[torch.tensor(targets, dtype=torch.long).to(device)],
        out_index=torch.tensor(out, dtype=torch.long).to(device),
        shape=(len(rows), L),
        real_tokens=real,
        slots=len(row_bins) * W,
        token_at=torch.tensor(token_at, dtype=torch.long).to(device),
        stride=stride,
    )


def _first_fit(widths: list[int], width: int) -> tuple[list[list[int]], int]:
    """First-fit decreasing of items of ``widths`` into rows of ``width``: the items (indices) of each row and the
    width of the fullest row."""
    rows: list[list[int]] = []
    free: list[int] = []
    for b in sorted(range(len(widths)), key=lambda b: -widths[b]):
        for i, room in enumerate(free):
            if widths[b] <= room:
                rows[i].append(b)
                free[i] -= widths[b]
                break
        else:
            rows.append([b])
            free.append(width - widths[b])
    return rows, width - min(free)
