"""Reward models: a ``transformers`` decoder (a causal LM's backbone, without its output layer) and a scalar linear
head read at each sequence's last real token.

``RewardModel.score(input_ids, attention_mask)`` scores a batch of ``[B, L]`` rows whose real tokens are one
contiguous run (prompt left-padded, response right-padded, as the collector lays them out); learners score a
``TokenLayout`` through :meth:`RewardModel.layout_scores`, so padded and packed micro-batches, gradient checkpointing
and bf16 autocast apply as for the policy. ``save(dir)``/``RewardModel.load(dir)`` write and read a folder
(``config.json`` + ``model.safetensors``); :meth:`RewardModel.from_lm` starts from a (fine-tuned) causal LM.
``pickaxe.rollout.pairs.RewardModelScorer`` turns a reward model into a ``PromptEnv`` reward with batched scoring.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from pickaxe.data.layout import TokenLayout
from pickaxe.models.folders import (
    CONFIG_FILE,
    REWARD_MODEL_FORMAT,
    WEIGHTS_FILE,
    ModelError,
    check_reward_model_folder,
)
from pickaxe.models.last_layer import hidden_at
from pickaxe.models.lm import enable_checkpointing, load_lm, position_ids, scalar_head, split_lm, tiny_lm
from pickaxe.utils import resolve_device


class RewardModel(nn.Module):
    """A decoder ``backbone`` (e.g. ``Qwen2Model``: returns ``last_hidden_state``) and ``head``, a ``Linear(hidden,
    1)`` without bias read at the last real token of each sequence: ``[B]`` float32 scores, higher is better.

    No bias, as in ``transformers``' sequence-classification heads: pairwise losses see only score differences,
    so a bias would get a zero gradient (and Adam would turn its rounding noise into full-size steps)."""

    def __init__(self, backbone: nn.Module, seed: int = 0) -> None:
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config  # read by attention_inputs (attention kernel) and save
        hidden = int(self.config.hidden_size)
        self.head = nn.Linear(hidden, 1, bias=False)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            nn.init.normal_(self.head.weight, std=1.0 / (hidden + 1) ** 0.5)
        self.head.to(next(backbone.parameters()))

    @classmethod
    def from_lm(cls, lm: str | Path | nn.Module, seed: int = 0, device: str | torch.device = "auto") -> RewardModel:
        """A reward model whose backbone is a COPY of causal LM ``lm``'s decoder (a module, or a local folder loaded
        with ``load_lm`` on ``device``), e.g. the SFT model; the head is new (seeded by ``seed``)."""
        lm = load_lm(lm, device) if isinstance(lm, str | Path) else copy.deepcopy(lm)
        parts = split_lm(lm)
        if parts is None:
            raise ModelError(
                f"{type(lm).__name__} cannot be split into a decoder and an output layer; start the reward model "
                "from a transformers causal LM (Llama, Qwen2, Mistral, ...)"
            )
        return cls(parts[0], seed).train(lm.training)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[B]`` scores of ``[B, L]`` rows (real tokens contiguous), read at each row's last real token."""
        mask = attention_mask.long()
        pos = position_ids(mask) if positions is None else positions
        inputs = {"input_ids": input_ids, "attention_mask": mask, "position_ids": pos, "use_cache": False}
        width = mask.shape[1]
        last = (mask * torch.arange(width, device=mask.device)).argmax(-1)
        index = torch.arange(mask.shape[0], device=mask.device) * width + last
        return self.head(hidden_at(self.backbone, inputs, index)).squeeze(-1).float()

    def layout_scores(self, layout: TokenLayout, precision: Literal["off", "bf16"] = "off") -> torch.Tensor:
        """``[b]`` scores of a layout's sequences, in the order of its output block (the ``rows`` it was planned
        for). The layout must score exactly each sequence's LAST real token (see
        ``pickaxe.algos.reward_model.last_token_bounds``): the head reads the hidden state AT that token
        (``layout.token_index()``), not the one that predicts it."""
        values = scalar_head(self.backbone, self.head, layout, layout.token_index(), precision)
        return layout.scatter(values).sum(-1)

    @torch.no_grad()
    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: int = 64) -> torch.Tensor:
        """``[B]`` scores without gradient, ``rows`` sequences per forward, in the model's current mode."""
        out = [self(input_ids[s : s + rows], attention_mask[s : s + rows]) for s in range(0, input_ids.shape[0], rows)]
        return torch.cat(out) if out else torch.zeros(0, device=input_ids.device)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict[str, Any] | None = None) -> None:
        """Activation checkpointing of the backbone's decoder layers (what ``LMAlgorithm`` turns on)."""
        enable_checkpointing(self.backbone, gradient_checkpointing_kwargs)

    def save(self, path: str | Path) -> Path:
        """Write ``config.json`` (the backbone's ``transformers`` config) and ``model.safetensors`` to folder
        ``path`` (created); :meth:`load` reads them back."""
        from safetensors.torch import save_file

        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        record = {"format": REWARD_MODEL_FORMAT, "version": 1, "backbone": self.config.to_dict()}
        (folder / CONFIG_FILE).write_text(json.dumps(record, indent=2, sort_keys=True))
        tensors = {k: t.detach().cpu().contiguous() for k, t in self.state_dict().items()}
        save_file(tensors, str(folder / WEIGHTS_FILE))
        return folder

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "auto") -> RewardModel:
        """The reward model saved by :meth:`save` in folder ``path``, on ``device``, in eval mode (on ``meta``: its
        shapes, the weights not read). A folder that does not hold one raises ``ModelError`` naming what is
        missing."""
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoModel

        folder = Path(path)
        config_path, weights = folder / CONFIG_FILE, folder / WEIGHTS_FILE
        record = check_reward_model_folder(folder, flag=None)
        backbone_cfg = dict(record["backbone"])
        config = AutoConfig.for_model(backbone_cfg.pop("model_type"), **backbone_cfg)
        if str(device) == "meta":  # shapes only, weights not read (a sharded learner's, filled from rank 0's)
            with torch.device("meta"):
                return cls(AutoModel.from_config(config)).eval()
        model = cls(AutoModel.from_config(config))
        try:
            model.load_state_dict(load_file(str(weights)))
        except RuntimeError as e:
            raise ModelError(f"{weights} does not match {config_path}: {str(e).splitlines()[0]}") from None
        return model.to(resolve_device(device)).eval()


def tiny_reward_model(
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
) -> RewardModel:
    """A small randomly initialised reward model: :func:`~pickaxe.models.lm.tiny_lm`'s decoder and a seeded head
    (float32, eval mode)."""
    lm = tiny_lm(vocab_size, arch, hidden, layers, heads, kv_heads, intermediate, max_positions, pad_token_id,
                 eos_token_id, seed)  # fmt: skip
    parts = split_lm(lm)
    assert parts is not None
    return RewardModel(parts[0], seed).eval()
