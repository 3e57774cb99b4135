"""Named shapes of real causal LMs, and the arithmetic of their parameters: torch-free.

A :class:`Shape` is what decides a decoder's parameter tensors: the architecture (Qwen2 has biases on the query, key
and value projections, Llama none), the hidden size, the layers, the query and key/value heads, the MLP's width, the
vocabulary rows and whether the output layer shares the input embedding. ``--model.shape NAME`` builds the tiny
random-weight model at one of :data:`SHAPES` (no download), and the memory planner (``pickaxe plan``) counts bytes
from a shape: :func:`shape_from_config` reads one from a transformers ``config.json``.

The shapes are copied from the models' published ``config.json`` files; each parameter count below is this module's
arithmetic, equal to the count of the model transformers builds at that shape (tests/test_shapes.py builds them on
the meta device) and to the published totals (e.g. Qwen2-0.5B 494,032,768; Llama-3-8B 8,030,261,248).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pickaxe.errors import ConfigError

Arch = Literal["qwen2", "llama"]

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of one decoder layer, by their transformers names (what LoRA's ``all-linear`` adapts)."""


@dataclass(frozen=True)
class Shape:
    """The shape of a Qwen2- or Llama-style decoder: every parameter tensor follows from these fields."""

    arch: Arch
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    """Rows of the input embedding (and of the output layer)."""
    tied: bool = False
    """The output layer is the input embedding (one tensor)."""
    attention_bias: bool | None = None
    """Biases on the query, key and value projections; None: the architecture's (Qwen2 yes, Llama no)."""
    head_dim: int | None = None
    """Size of one attention head; None: ``hidden // heads``."""
    name: str = "custom"

    @property
    def head_size(self) -> int:
        """Size of one attention head."""
        return self.head_dim or self.hidden // self.heads

    @property
    def qkv_bias(self) -> bool:
        """Whether the query, key and value projections have biases."""
        return self.arch == "qwen2" if self.attention_bias is None else self.attention_bias

    def linear_dims(self) -> dict[str, tuple[int, int]]:
        """``(in_features, out_features)`` of each linear layer of one decoder layer (:data:`LINEARS`)."""
        h, q, kv, i = self.hidden, self.heads * self.head_size, self.kv_heads * self.head_size, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}  # fmt: skip

    def layer_parameters(self) -> int:
        """Parameters of one decoder layer: its linear layers (with the query/key/value biases when it has them)
        and its two RMSNorm weights."""
        dims = self.linear_dims()
        weights = sum(a * b for a, b in dims.values())
        biases = sum(dims[k][1] for k in ("q_proj", "k_proj", "v_proj")) if self.qkv_bias else 0
        return weights + biases + 2 * self.hidden

    def layer_tensors(self) -> int:
        """Parameter tensors of one decoder layer (7 weights, 2 norms, 3 biases when it has them)."""
        return len(LINEARS) + 2 + (3 if self.qkv_bias else 0)

    def embedding_parameters(self) -> int:
        """Parameters of the input embedding (one output layer's worth)."""
        return self.vocab * self.hidden

    def parameters(self) -> int:
        """All parameters: embedding, layers, final norm and (untied) output layer, each tensor counted once."""
        head = 0 if self.tied else self.embedding_parameters()
        return self.embedding_parameters() + self.layers * self.layer_parameters() + self.hidden + head

    def tensors(self) -> int:
        """Parameter tensors (what ``model.parameters()`` yields; a tied output layer is not a second one)."""
        return 2 + self.layers * self.layer_tensors() + (0 if self.tied else 1)

    def backbone_tensors(self) -> int:
        """Parameter tensors of the decoder without its output layer."""
        return 2 + self.layers * self.layer_tensors()

    def backbone_parameters(self) -> int:
        """Parameters of the decoder without its output layer (a reward model's or a critic's backbone)."""
        return self.embedding_parameters() + self.layers * self.layer_parameters() + self.hidden

    def lora_parameters(self, r: int, targets: tuple[str, ...] = ("all-linear",)) -> tuple[int, int]:
        """``(parameters, tensors)`` of rank-``r`` LoRA adapters (an A and a B matrix each) on the decoder layers'
        linear layers named in ``targets`` (``all-linear``: every one; the output layer is never adapted)."""
        dims = self.linear_dims()
        names = LINEARS if "all-linear" in targets else [n for n in LINEARS if n in targets]
        per_layer = sum(r * (dims[n][0] + dims[n][1]) for n in names)
        return self.layers * per_layer, self.layers * 2 * len(names)


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("qwen2", 896, 24, 14, 2, 4864, 151936, tied=True, name="qwen2-0.5b"),
        Shape("qwen2", 896, 24, 14, 2, 4864, 151936, tied=True, name="qwen2.5-0.5b"),
        Shape("qwen2", 1536, 28, 12, 2, 8960, 151936, tied=True, name="qwen2.5-1.5b"),
        Shape("qwen2", 2048, 36, 16, 2, 11008, 151936, tied=True, name="qwen2.5-3b"),
        Shape("qwen2", 3584, 28, 28, 4, 18944, 152064, name="qwen2.5-7b"),
        Shape("qwen2", 5120, 48, 40, 8, 13824, 152064, name="qwen2.5-14b"),
        Shape("qwen2", 5120, 64, 40, 8, 27648, 152064, name="qwen2.5-32b"),
        Shape("qwen2", 8192, 80, 64, 8, 29568, 152064, name="qwen2.5-72b"),
        Shape("llama", 576, 30, 9, 3, 1536, 49152, tied=True, name="smollm2-135m"),
        Shape("llama", 2048, 16, 32, 8, 8192, 128256, tied=True, name="llama-3.2-1b"),
        Shape("llama", 3072, 28, 24, 8, 8192, 128256, tied=True, name="llama-3.2-3b"),
        Shape("llama", 4096, 32, 32, 8, 14336, 128256, name="llama-3-8b"),
        Shape("llama", 8192, 80, 64, 8, 28672, 128256, name="llama-3-70b"),
        # not a real model: Qwen2's layout (biases, tied embeddings, a vocabulary larger than the character
        # tokenizer's) at a size a smoke test trains in seconds
        Shape("qwen2", 64, 2, 4, 2, 256, 1024, tied=True, name="tiny-qwen2"),
    )
}
"""Named shapes, ``--model.shape NAME``."""


def get_shape(name: str, flag: str = "--model.shape") -> Shape:
    """The named shape; an unknown name is a one-line ``ConfigError`` listing the names."""
    if name not in SHAPES:
        raise ConfigError(f"{flag} {name!r} is not a known shape; choose one of {', '.join(SHAPES)}")
    return SHAPES[name]


def shape_from_config(record: dict[str, Any], where: str = "config.json") -> Shape:
    """The shape of a transformers ``config.json`` record (a Qwen2- or Llama-style causal LM; other model types
    with the same fields are read as Llama). A record without the fields is a one-line ``ConfigError``."""
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in keys if not isinstance(record.get(k), int)]
    if missing:
        raise ConfigError(f"{where} has no {', '.join(missing)}: the planner reads Qwen2- and Llama-style configs")
    arch: Arch = "qwen2" if str(record.get("model_type", "")).startswith("qwen2") else "llama"
    return Shape(
        arch,
        record["hidden_size"],
        record["num_hidden_layers"],
        record["num_attention_heads"],
        int(record.get("num_key_value_heads") or record["num_attention_heads"]),
        record["intermediate_size"],
        record["vocab_size"],
        tied=bool(record.get("tie_word_embeddings", False)),
        attention_bias=record.get("attention_bias") if arch == "llama" else None,
        head_dim=record.get("head_dim"),
        name=str(record.get("_name_or_path") or record.get("model_type") or "config.json"),
    )
