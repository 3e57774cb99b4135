"""A decoder's final hidden states at chosen positions only, with its last layer run only where they are read.

A reward model reads one position per sequence (its last token), a value model the completion's positions; yet a
plain forward runs every layer at every position. Every layer but the last must run everywhere (later positions
attend to earlier ones), but the last layer's output at a position nobody reads is wasted: :func:`hidden_at` runs
the decoder's own forward up to its last layer, then that layer's keys and values at every position (what the
picked positions attend to) and its queries, attention output, MLP and the final norm at the picked positions only.
With a reward model of 4 layers reading 128 of 1,280 positions that skips about a fifth of the decoder's work.

It applies to the decoder layers whose forward is Llama's (pre-norm attention then MLP, rotary positions: Llama,
Mistral, Qwen2, Qwen3) under the SDPA attention kernel (with the 4-D mask ``transformers`` builds, or none
for plain causal rows), on an unsharded decoder.
Anything else, and a pick that would not save work, runs the real last layer on every position, so the result is
the same either way up to floating-point rounding (the picked rows are multiplied as a smaller matrix).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

LLAMA_STYLE_LAYERS = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer")
"""Decoder layer classes whose forward is ``h + attn(norm(h))`` then ``h + mlp(norm(h))`` with rotary positions."""
KERNELS = ("sdpa",)
"""Attention kernels whose masks are boolean (the partial layer builds and slices them so)."""
MAX_SHARE = 0.75
"""Above this share of the rows' positions picked, the real last layer runs (the partial one would save little)."""


class _Stop(nn.Module):
    """Stands in for the last decoder layer for one forward: records what the layer would be called with and
    passes its input through (the decoder's final norm then runs on it, a small cost, and is discarded)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: tuple[torch.Tensor, dict[str, Any]] | None = None

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.seen = (hidden_states, {"args": args, **kwargs})
        return hidden_states


def _last_layer(decoder: nn.Module) -> nn.Module | None:
    """The decoder's last layer when :func:`hidden_at` can run it partially, else None."""
    layers = getattr(decoder, "layers", None)
    cfg = getattr(decoder, "config", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0 or cfg is None:
        return None
    if len(layers) != getattr(cfg, "num_hidden_layers", -1):
        return None
    if getattr(cfg, "_attn_implementation", None) not in KERNELS:
        return None
    last = layers[-1]
    if type(last).__name__ not in LLAMA_STYLE_LAYERS or not hasattr(decoder, "norm"):
        return None
    if any(type(p).__name__ == "DTensor" for p in last.parameters()):  # sharded: FSDP's hooks own the layer's weights
        return None
    return last


def _rows_and_slots(index: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """For flat positions ``index`` (sorted) of rows of ``width``: the rows holding any (``[R]``), each pick's row
    among those and its slot within the row (``[N]`` each), and ``[R, S]`` column positions to query (S the most
    picks of a row; a row's spare slots repeat its first pick, so every query attends to something)."""
    row, col = index // width, index % width
    used, local = torch.unique_consecutive(row, return_inverse=True)
    counts = torch.bincount(local, minlength=used.numel())
    first = torch.cumsum(counts, 0) - counts
    slot = torch.arange(index.numel(), device=index.device) - first[local]
    cols = col[first].unsqueeze(1).repeat(1, int(counts.max()))
    cols[local, slot] = col
    return used, local, slot, cols


def _partial(
    layer: nn.Module, norm: nn.Module, hidden: torch.Tensor, kwargs: dict[str, Any], index: torch.Tensor
) -> torch.Tensor | None:
    """``[N, D]`` output of ``norm(layer(hidden))`` at flat positions ``index``, computed at those positions only;
    None when the layer's inputs do not allow it (a mask that is not 4-D, positions not rotary) or it would save
    little."""
    mask, rope = kwargs.get("attention_mask"), kwargs.get("position_embeddings")
    if kwargs["args"] or not isinstance(rope, tuple) or (mask is not None and mask.dim() != 4):
        return None
    batch, width = hidden.shape[:2]
    order = torch.argsort(index)
    used, local, slot, cols = _rows_and_slots(index[order], width)
    if cols.numel() > MAX_SHARE * used.numel() * width:
        return None
    attn = layer.self_attn
    module = sys.modules[type(attn).__module__]
    head_dim = attn.head_dim
    rows = hidden.index_select(0, used)  # [R, T, D]
    x = layer.input_layernorm(rows)
    x_q = _take_rows(x, cols)
    q = attn.q_proj(x_q).view(*cols.shape, -1, head_dim)
    k = attn.k_proj(x).view(used.numel(), width, -1, head_dim)
    if hasattr(attn, "q_norm"):  # Qwen3: RMS norm of each head's queries and keys before the rotation
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = attn.v_proj(x).view(used.numel(), width, -1, head_dim).transpose(1, 2)
    cos, sin = (t.expand(batch, -1, -1).index_select(0, used) for t in rope)  # [R, T, head_dim]
    q, _ = module.apply_rotary_pos_emb(q, q, _take_rows(cos, cols), _take_rows(sin, cols))
    k, _ = module.apply_rotary_pos_emb(k, k, cos, sin)
    if mask is None:  # transformers passes none for plain causal rows (no padding, no packing)
        m = cols[:, None, :, None] >= torch.arange(width, device=cols.device)  # [R, 1, S, T]
    else:
        m = mask.expand(batch, -1, width, -1).index_select(0, used)  # [R, 1 or H, T, T]
        m = m.gather(2, cols[:, None, :, None].expand(-1, m.shape[1], -1, m.shape[-1]))
    kernels = module.ALL_ATTENTION_FUNCTIONS
    kernel = kernels.get_interface(attn.config._attn_implementation, module.eager_attention_forward)
    out, _ = kernel(
        attn, q, k, v, m,
        dropout=attn.attention_dropout if attn.training else 0.0,
        scaling=attn.scaling,
        sliding_window=getattr(attn, "sliding_window", None),
    )  # fmt: skip
    y = _take_rows(rows, cols) + attn.o_proj(out.reshape(*cols.shape, -1))
    y = y + layer.mlp(layer.post_attention_layernorm(y))
    picked = norm(y)[local, slot]
    return picked[torch.argsort(order)]


def _take_rows(t: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``t[r, cols[r, s]]`` for a ``[R, T, ...]`` tensor and ``[R, S]`` positions: ``[R, S, ...]``."""
    shape = (*cols.shape, *t.shape[2:])
    return t.gather(1, cols.reshape(*cols.shape, *([1] * (t.dim() - 2))).expand(shape))


def hidden_at(decoder: nn.Module, inputs: dict[str, Any], index: torch.Tensor) -> torch.Tensor:
    """``[N, D]`` final hidden states (after the decoder's final norm) of ``decoder`` (a ``transformers`` base
    model) called with ``inputs``, at flat positions ``index`` of its ``[B, T]`` rows, the last layer run only
    where it is read when it can be (see the module's docstring); otherwise the plain forward, then the pick."""
    last = _last_layer(decoder)
    if last is None:
        hidden = decoder(**inputs).last_hidden_state
        return hidden.reshape(-1, hidden.shape[-1]).index_select(0, index)
    stop = _Stop()
    decoder.layers[-1] = stop
    try:
        decoder(**inputs)
    finally:
        decoder.layers[-1] = last
    assert stop.seen is not None
    hidden, kwargs = stop.seen
    picked = _partial(last, decoder.norm, hidden, kwargs, index) if index.numel() else None
    if picked is not None:
        return picked
    args = kwargs.pop("args")
    out = decoder.norm(last(hidden, *args, **kwargs))
    return out.reshape(-1, out.shape[-1]).index_select(0, index)
