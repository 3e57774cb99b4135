"""Causal language models: loading from a local path, the tiny-model factory, and the log-prob helpers shared by
rollout engines and learners (both must process logits the same way, or the on-policy ratio is not 1)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from pickaxe.errors import PickaxeError
from pickaxe.utils import resolve_device

DType = Literal["auto", "float32", "bfloat16", "float16"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelError(PickaxeError):
    """A model path that does not hold a loadable causal LM."""


def load_lm(path: str | Path, device: str | torch.device = "auto", dtype: DType = "float32") -> nn.Module:
    """A ``transformers`` causal LM from local directory ``path`` (``config.json`` + weights), on ``device``.

    Nothing is downloaded. ``dtype`` ``auto`` keeps the checkpoint's dtype. A missing folder or one without a
    causal-LM config raises ``ModelError`` naming the path and what is missing.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    p = Path(path)
    if not p.exists():
        raise ModelError(f"model path {str(p)!r} does not exist; pass --model.path DIR with a saved model folder")
    if not (p / "config.json").is_file():
        raise ModelError(f"{p} has no config.json: not a saved transformers model (model.save_pretrained(DIR))")
    try:
        config = AutoConfig.from_pretrained(str(p), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            str(p),
            config=config,
            local_files_only=True,
            dtype="auto" if dtype == "auto" else _DTYPES[dtype],
        )
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"could not load a causal LM from {p}: {e}") from None
    return model.to(resolve_device(device))


def tiny_lm(
    vocab_size: int,
    arch: Literal["qwen2", "llama"] = "qwen2",
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 256,
    max_positions: int = 128,
    pad_token_id: int = 0,
    eos_token_id: int = 1,
    seed: int = 0,
) -> nn.Module:
    """A small randomly initialised Qwen2- or Llama-style causal LM (float32, eval mode, no dropout).

    Input and output embeddings are untied so the weights save as plain safetensors. Initialisation is seeded
    by ``seed`` without touching the global RNG.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        initializer_range=0.02,
    )
    config_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if arch == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    config = config_cls(**kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    return model.eval()


def num_parameters(model: nn.Module) -> int:
    """Number of parameters."""
    return sum(p.numel() for p in model.parameters())


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The logits processing of sampling, in float32: divide by ``temperature`` (<= 0 means greedy and is treated
    as 1 for log-probs), keep the ``top_k`` largest (0: all) and the smallest set of tokens with probability mass
    >= ``top_p``; removed tokens get ``-inf``. Sampler and learner both call this, so their log-probs agree.
    """
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    if top_k and 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        remove_sorted = probs.cumsum(-1) - probs > top_p  # mass before this token already reaches top_p
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        logits = logits.masked_fill(remove, -math.inf)
    return logits


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip padding: ``cumsum(mask) - 1``, clamped at 0 (left padding starts each row at 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def sequence_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:
    """Per-token log-probs ``[B, L]`` of ``input_ids`` under ``model``: column ``j`` is log p(token j | tokens < j)
    after ``process_logits``; column 0 (no context) is 0. Padding columns hold meaningless finite values."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask))
    logits = process_logits(out.logits[:, :-1], temperature, top_k, top_p)
    targets = input_ids[:, 1:]
    logp = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    logp = torch.where(attention_mask[:, 1:].bool(), logp, torch.zeros_like(logp))
    return F.pad(logp, (1, 0))


@torch.no_grad()
def chunked_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    rows: int = 256,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:
    """``sequence_logprobs`` without gradient over chunks of ``rows`` sequences, each trimmed to its real columns
    (reference log-probs, recomputed old log-probs)."""
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    for s in range(0, input_ids.shape[0], rows):
        mask = attention_mask[s : s + rows]
        cols = mask.any(0).nonzero().squeeze(-1)
        lo, hi = int(cols[0]), int(cols[-1]) + 1
        out[s : s + rows, lo:hi] = sequence_logprobs(
            model, input_ids[s : s + rows, lo:hi], mask[:, lo:hi], temperature, top_k, top_p
        )
    return out
