"""Value models (critics) for PPO on language models: a ``transformers`` decoder (a causal LM's backbone, without
its output layer) and a scalar linear head giving one value per token.

Values line up with log-probs: the value of the state BEFORE response token ``t`` is the head applied to the hidden
state at position ``t - 1`` (the one that predicts token ``t``), so ``values[b, t]`` sits in the same ``[B, L]``
column as ``logprob[b, t]``. Learners compute them for a ``TokenLayout`` through :meth:`ValueModel.layout_values`
(padded and packed micro-batches, gradient checkpointing and bf16 autocast, as for the policy);
:func:`completion_values` does the same for a whole collector batch.

Start one from a trained :class:`~pickaxe.models.reward.RewardModel` (:meth:`ValueModel.from_reward_model`: the
backbone and head are copied, InstructGPT's "value function initialised from the reward model") or from a causal
LM (:meth:`ValueModel.from_lm`: its decoder is copied, the head starts at zero).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from pickaxe.data.layout import LayoutMode, TokenLayout, over_layouts
from pickaxe.models.lm import ModelError, enable_checkpointing, load_lm, scalar_head, split_lm


class ValueModel(nn.Module):
    """A decoder ``backbone`` (e.g. ``Qwen2Model``: returns ``last_hidden_state``) and ``head``, a ``Linear(hidden,
    1)`` with a bias, applied at every scored position: float32 values, one per response token.

    The head starts at zero (every value 0) unless copied from a reward model. Unlike a reward model's head it has
    a bias: the value loss sees absolute values, so a bias lets the critic learn the mean return directly."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config  # read by attention_inputs (attention kernel)
        hidden = int(self.config.hidden_size)
        self.head = nn.Linear(hidden, 1, bias=True)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.head.to(next(backbone.parameters()))

    @classmethod
    def from_reward_model(cls, reward_model: nn.Module) -> ValueModel:
        """A value model whose backbone and head weights are COPIES of ``reward_model``'s (a
        :class:`~pickaxe.models.reward.RewardModel`; its bias-free head gets a zero bias), so the initial value of
        each state is the reward model's score of the text so far."""
        backbone, head = getattr(reward_model, "backbone", None), getattr(reward_model, "head", None)
        if backbone is None or not isinstance(head, nn.Linear) or head.out_features != 1:
            raise ModelError(
                f"{type(reward_model).__name__} is not a reward model (backbone + 1-output linear head); build the "
                "critic with ValueModel.from_lm(lm) instead"
            )
        model = cls(copy.deepcopy(backbone))
        with torch.no_grad():
            model.head.weight.copy_(head.weight)
            if head.bias is not None:
                model.head.bias.copy_(head.bias)
        return model.train(reward_model.training)

    @classmethod
    def from_lm(cls, lm: str | Path | nn.Module, device: str | torch.device = "auto") -> ValueModel:
        """A value model whose backbone is a COPY of causal LM ``lm``'s decoder (a module, or a local folder loaded
        with ``load_lm`` on ``device``), e.g. the SFT policy; the head starts at zero."""
        lm = load_lm(lm, device) if isinstance(lm, str | Path) else copy.deepcopy(lm)
        parts = split_lm(lm)
        if parts is None:
            raise ModelError(
                f"{type(lm).__name__} cannot be split into a decoder and an output layer; start the value model "
                "from a transformers causal LM (Llama, Qwen2, Mistral, ...) or ValueModel.from_reward_model"
            )
        return cls(parts[0]).train(lm.training)

    def layout_values(self, layout: TokenLayout, precision: Literal["off", "bf16"] = "off") -> torch.Tensor:
        """``[N]`` float32 values of a layout's scored tokens, in ``layout.targets`` order: for each scored token,
        the head applied to the hidden state that predicts it (``layout.hidden_index``), i.e. the value of the
        state before the token is generated. ``layout.scatter`` puts them in the ``[b, L]`` block."""
        return scalar_head(self.backbone, self.head, layout, layout.hidden_index, precision)

    def forward(self, layout: TokenLayout, precision: Literal["off", "bf16"] = "off") -> torch.Tensor:
        """``[b, L]`` values of a layout's scored tokens in their batch columns, 0 elsewhere."""
        return layout.scatter(self.layout_values(layout, precision))

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict[str, Any] | None = None) -> None:
        """Activation checkpointing of the backbone's decoder layers (what ``LLMPPO`` turns on)."""
        enable_checkpointing(self.backbone, gradient_checkpointing_kwargs)


def completion_values(
    model: ValueModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    precision: Literal["off", "bf16"] = "off",
    rows: int = 0,
    mode: LayoutMode = "padded",
) -> torch.Tensor:
    """Per-token values ``[B, L]`` of the ``loss_mask`` tokens of a collector batch (0 elsewhere), aligned like
    ``pickaxe.models.lm.completion_logprobs``: column ``j`` is the value of the state before token ``j``, read from
    the hidden state at ``j - 1``. Each row's real tokens must be contiguous; ``rows`` > 0 runs ``rows`` sequences
    per forward; ``mode`` ``packed`` puts several sequences in one model row. With or without gradient."""
    return over_layouts(input_ids, attention_mask, loss_mask, lambda layout: model(layout, precision), rows, mode)
