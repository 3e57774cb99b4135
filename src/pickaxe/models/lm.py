"""Causal language models: loading from a local path, the tiny-model factory, and the log-prob helpers shared by
rollout engines and learners (both must process logits the same way, or the on-policy ratio is not 1)."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from pickaxe.data.layout import LayoutMode, SequenceBounds, TokenLayout, over_layouts
from pickaxe.data.shared_prefix import SharedPrefixLayout, plan_shared_prefix
from pickaxe.models.folders import ModelError, check_lm_folder, check_tiny_shape
from pickaxe.models.last_layer import hidden_at
from pickaxe.utils import resolve_device

DType = Literal["auto", "float32", "bfloat16", "float16"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


_quiet_lock = threading.Lock()
_quiet_depth = 0
_bars_were_on = True


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' (and the Hugging Face hub's) progress bars off for the block, as they were after it: loading
    or saving a model otherwise prints ``Loading weights`` / ``Writing model shards`` bars into pickaxe's output.
    Nested and concurrent blocks (the web app loads in threads) keep them off until the last one ends."""
    global _quiet_depth, _bars_were_on
    from transformers.utils import logging as hf_logging

    with _quiet_lock:
        if _quiet_depth == 0:
            _bars_were_on = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()
        _quiet_depth += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_depth -= 1
            if _quiet_depth == 0 and _bars_were_on:
                hf_logging.enable_progress_bar()


def load_lm(path: str | Path, device: str | torch.device = "auto", dtype: DType = "float32") -> nn.Module:
    """A ``transformers`` causal LM from local directory ``path`` (``config.json`` + weights), on ``device``.

    Nothing is downloaded. ``dtype`` ``auto`` keeps the checkpoint's dtype. A missing folder or one without a
    causal-LM config raises ``ModelError`` naming the path and what is missing. On the ``meta`` device the model is
    built from the folder's config without reading its weights (a sharded learner's, filled with rank 0's later).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    p = Path(path)
    check_lm_folder(p, flag=None)
    try:
        with no_progress_bars():
            config = AutoConfig.from_pretrained(str(p), local_files_only=True)
            if str(device) == "meta":
                wanted = (getattr(config, "dtype", None) or torch.float32) if dtype == "auto" else _DTYPES[dtype]
                with torch.device("meta"):
                    return AutoModelForCausalLM.from_config(config, dtype=wanted).eval()
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
    tied: bool = False,
) -> nn.Module:
    """A small randomly initialised Qwen2- or Llama-style causal LM (float32, eval mode, no dropout).

    Input and output embeddings are untied unless ``tied`` (a real model's shape: ``--model.shape``; the weight
    files store a tied tensor once per name, see ``pickaxe.runs.weights``). Initialisation is seeded
    by ``seed`` without touching the global RNG. A shape the attention cannot take is a one-line ``ModelError``
    (:func:`~pickaxe.models.folders.check_tiny_shape`).
    """
    check_tiny_shape(hidden, heads, kv_heads, prefix="")
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
        tie_word_embeddings=tied,
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


LOGITS_BUDGET_BYTES = 64 << 20
"""Default size of one chunk of float32 logits in :func:`head_logprobs` (about 110 tokens at a 152k vocabulary)."""

Autocast = Literal["off", "bf16"]


def autocast(device: torch.device | str, mode: Autocast = "off") -> torch.autocast:
    """``torch.autocast`` in bfloat16 on ``device``'s type (CPU or CUDA) when ``mode`` is ``bf16``, else a no-op.
    Log-softmax and everything after it stay in float32 (``process_logits`` casts)."""
    kind = torch.device(device).type
    return torch.autocast(device_type=kind, dtype=torch.bfloat16, enabled=mode == "bf16")


def split_lm(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """``(backbone, head)`` of a ``transformers`` causal LM whose logits are exactly ``head(backbone(...)[0])``, or
    None (then log-probs go through the full forward). Models that rescale or soft-cap logits after the head
    (Gemma 2, Cohere, Granite) are not split."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(model, "get_decoder") or not hasattr(model, "get_output_embeddings"):
        return None
    for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(cfg, attr, None) not in (None, 1, 1.0):
            return None
    try:
        backbone, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError, ValueError):
        return None
    if backbone is None or head is None or backbone is model:
        return None
    return backbone, head


def _score(logits: torch.Tensor, targets: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Log-prob of each row's target token under ``process_logits`` (float32)."""
    logp = process_logits(logits, temperature, top_k, top_p).log_softmax(-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def head_logprobs(
    head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    chunk_tokens: int = 0,
) -> torch.Tensor:
    """``[N]`` log-probs of ``targets`` from final hidden states ``hidden`` (``[N, H]``) through the output layer
    ``head``, ``chunk_tokens`` rows at a time (0: as many as fit ``LOGITS_BUDGET_BYTES`` of float32 logits).

    Memory does not grow with the vocabulary beyond one chunk: with gradients, each chunk is checkpointed (its
    ``[chunk, V]`` logits are recomputed in the backward pass instead of being kept). A single chunk runs plainly,
    so small vocabularies pay nothing.
    """
    vocab = int(getattr(head, "out_features", 0) or head.weight.shape[0])
    chunk = chunk_tokens or max(1, LOGITS_BUDGET_BYTES // (4 * vocab))
    n = hidden.shape[0]

    def piece(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return _score(head(h), t, temperature, top_k, top_p)

    if n <= chunk:
        return piece(hidden, targets)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    out = []
    for s in range(0, n, chunk):
        h, t = hidden[s : s + chunk], targets[s : s + chunk]
        if grad:
            out.append(torch.utils.checkpoint.checkpoint(piece, h, t, use_reentrant=False))
        else:
            out.append(piece(h, t))
    return torch.cat(out)


def layout_inputs(model: nn.Module, layout: TokenLayout) -> dict[str, Any]:
    """The keyword arguments of ``model``'s forward pass over a layout's rows: token ids, position ids, the
    attention input :func:`attention_inputs` gives for the model, no KV cache."""
    return {
        "input_ids": layout.input_ids,
        "position_ids": layout.position_ids,
        "attention_mask": attention_inputs(model, layout),
        "use_cache": False,
    }


def attention_inputs(model: nn.Module, layout: TokenLayout) -> torch.Tensor | None:
    """The ``attention_mask`` to pass for ``layout``. For the SDPA kernel: a 4-D boolean mask built on the device,
    which ``transformers`` uses as given (a 2-D mask, or none, makes it inspect the mask or the position ids on the
    host at every forward: a device synchronisation per micro-batch). Otherwise: the 2-D padding mask, or None for
    packed rows, whose boundaries ``transformers`` finds in the position ids."""
    if shares_prompts(model):
        return layout.attention_mask()
    return None if layout.packed and not isinstance(layout, SharedPrefixLayout) else layout.padding_mask()


def shares_prompts(model: nn.Module) -> bool:
    """Whether ``model`` takes a 4-D boolean attention mask as given (the SDPA kernel), which the shared-prefix
    layout (:mod:`pickaxe.data.shared_prefix`) needs."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == "sdpa"


def layout_logprobs(
    model: nn.Module,
    layout: TokenLayout,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    chunk_tokens: int = 0,
    precision: Autocast = "off",
) -> torch.Tensor:
    """``[N]`` log-probs of a layout's scored tokens (``layout.targets``) under ``model``, processed like the
    sampler's logits. Only the hidden states that predict scored tokens reach the output layer (see
    :func:`head_logprobs`); a model that cannot be split (:func:`split_lm`) computes full logits first."""
    parts = split_lm(model)
    kwargs = layout_inputs(model, layout)
    with autocast(layout.input_ids.device, precision):
        if parts is None:
            logits = model(**kwargs).logits
            picked = logits.reshape(-1, logits.shape[-1]).index_select(0, layout.hidden_index)
            return _score(picked, layout.targets, temperature, top_k, top_p)
        backbone, head = parts
        hidden = backbone(**kwargs).last_hidden_state
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, layout.hidden_index)
        return head_logprobs(head, picked, layout.targets, temperature, top_k, top_p, chunk_tokens)


def completion_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    chunk_tokens: int = 0,
    precision: Autocast = "off",
    rows: int = 0,
    mode: LayoutMode | Literal["shared-prefix"] = "padded",
) -> torch.Tensor:
    """Per-token log-probs ``[B, L]`` of the ``loss_mask`` tokens of ``input_ids`` under ``model`` (0 elsewhere),
    with or without gradient. Column ``j`` is log p(token j | tokens < j) after ``process_logits``.

    Each row's real tokens must be contiguous (the collector's layout). ``rows`` > 0 runs ``rows`` sequences per
    forward; ``mode`` ``packed`` puts several sequences in one model row, ``shared-prefix`` runs the prompt that
    several sequences of a block start with once (see :mod:`pickaxe.data.shared_prefix`; the ``padded`` layout on a
    model without the SDPA kernel; one more host read of ``input_ids``). Only scored positions reach the output
    layer, in chunks of ``chunk_tokens`` (see :func:`head_logprobs`), so memory does not grow with the vocabulary.
    """

    def block(layout: TokenLayout) -> torch.Tensor:
        return layout.scatter(layout_logprobs(model, layout, temperature, top_k, top_p, chunk_tokens, precision))

    plan = None
    if mode == "shared-prefix" and shares_prompts(model):
        host = input_ids.detach().cpu().numpy()  # read once for every block's plan

        def plan(bounds: SequenceBounds, chunk: list[int]) -> TokenLayout:
            return plan_shared_prefix(input_ids, bounds, chunk, host)

    flat_mode = "packed" if mode == "packed" else "padded"
    return over_layouts(input_ids, attention_mask, loss_mask, block, rows, flat_mode, plan)


def sequence_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:
    """Per-token log-probs ``[B, L]`` of every real token of ``input_ids`` (full logits of every position: for
    checks and small models; learners use :func:`completion_logprobs`). Column 0 (no context) is 0; padding columns
    hold meaningless finite values."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask))
    logp = _score(out.logits[:, :-1], input_ids[:, 1:], temperature, top_k, top_p)
    logp = torch.where(attention_mask[:, 1:].bool(), logp, torch.zeros_like(logp))
    return F.pad(logp, (1, 0))


def enable_checkpointing(model: nn.Module, kwargs: dict[str, Any] | None = None) -> None:
    """Turn on ``transformers``' activation (gradient) checkpointing of every decoder layer, non-reentrant by default
    (exact: the backward pass recomputes each layer's forward with the same inputs; ``kwargs`` replace the default).
    It acts in training mode only, so generation from the same model is unaffected. A model without it raises
    ``ValueError`` naming the fix. Reward and value models pass their decoder (``backbone``)."""
    kwargs = kwargs or {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError(
            f"gradient_checkpointing needs a transformers model; {type(model).__name__} has no "
            "activation_checkpointing_enable(): set gradient_checkpointing=False"
        )


def scalar_head(
    decoder: nn.Module, head: nn.Module, layout: TokenLayout, index: torch.Tensor, precision: Autocast = "off"
) -> torch.Tensor:
    """``[N]`` float32 outputs of a one-output ``head`` on ``decoder``'s hidden states (a transformers base model:
    reward and value models) at flat positions ``index`` of a layout's rows, under the precision's autocast; the
    decoder's last layer runs at those positions only where it can (:func:`~pickaxe.models.last_layer.hidden_at`)."""
    with autocast(layout.input_ids.device, precision):
        picked = hidden_at(decoder, layout_inputs(decoder, layout), index)
        return head(picked).squeeze(-1).float()
