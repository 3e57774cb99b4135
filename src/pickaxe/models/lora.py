"""LoRA adapters through ``peft`` (the ``lora`` extra): :func:`apply_lora` wraps a causal LM so that only the
adapters train, :func:`shared_reference` is the frozen reference model for a KL penalty without a second copy of
the weights (the policy with its adapters switched off), and :func:`merge_lora` folds the adapters into plain
weights for export.

The reference is exact, not approximate: with the adapters disabled every LoRA layer runs only its base layer,
whose weights never change while the base is frozen, so reference log-probs are those of the starting model.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from pickaxe.errors import PickaxeError

ALL_LINEAR = "all-linear"
"""``peft``'s name for every linear layer of the decoder (the output layer excluded)."""


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise PickaxeError("LoRA needs the peft package: pip install 'pickaxe[lora]'") from None
    return peft


def is_lora(model: nn.Module) -> bool:
    """Whether ``model`` is a ``peft`` model (carries LoRA adapters). Does not import ``peft``."""
    return hasattr(model, "disable_adapter") and hasattr(model, "merge_and_unload")


def apply_lora(
    model: nn.Module,
    r: int = 8,
    alpha: float = 16.0,
    dropout: float = 0.0,
    target_modules: str | tuple[str, ...] | list[str] = ALL_LINEAR,
    seed: int = 0,
) -> nn.Module:
    """``model`` (a ``transformers`` causal LM) with LoRA adapters of rank ``r`` on ``target_modules``: a
    ``peft`` model whose base weights are frozen, so only the adapters train.

    The adapters start as a no-op (B = 0), so the wrapped model computes exactly what ``model`` did. Their random
    A matrices are seeded by ``seed`` without touching the global RNG. ``model`` is modified in place (its linear
    layers are wrapped); use the returned model from then on.
    """
    peft = _peft()
    if r < 1:
        raise PickaxeError(f"LoRA rank r must be at least 1, got {r}; pass r >= 1 or leave LoRA off")
    if is_lora(model):
        raise PickaxeError("the model already has LoRA adapters; apply_lora once, to the plain model")
    targets: str | list[str] = target_modules
    if not isinstance(target_modules, str):
        targets = ALL_LINEAR if list(target_modules) == [ALL_LINEAR] else list(target_modules)
    config = peft.LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none", task_type="CAUSAL_LM"
    )
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        torch.manual_seed(seed)
        try:
            wrapped = peft.get_peft_model(model, config)
        except ValueError as e:  # e.g. target modules not found in the model
            first = str(e).strip().splitlines()[0]
            raise PickaxeError(f"cannot add LoRA adapters ({first}); check lora.target_modules") from None
    return wrapped.train(model.training)


def apply_lora_config(model: nn.Module, config: Any, seed: int = 0) -> nn.Module:
    """:func:`apply_lora` with the fields of ``config`` (a ``pickaxe.train.llm_config.LoRAConfig``); ``model``
    unchanged when ``config.r`` is 0."""
    if config.r == 0:
        return model
    return apply_lora(model, config.r, config.alpha, config.dropout, config.target_modules, seed)


def merge_lora(model: nn.Module, copy_model: bool = True) -> nn.Module:
    """The plain ``transformers`` model with ``model``'s adapters folded into its weights (``W + alpha/r * B A``),
    or ``model`` itself when it has none. With ``copy_model`` (default) ``model`` is left as it was (the merge
    happens on a copy, which needs memory for one more model); without, ``model`` is merged in place and must not
    be used afterwards."""
    if not is_lora(model):
        return model
    target = copy.deepcopy(model) if copy_model else model
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return target.merge_and_unload()


@contextlib.contextmanager
def _adapters_off(policy: nn.Module) -> Iterator[None]:
    """No gradient, eval mode (no dropout) and the adapters disabled, restored afterwards."""
    was_training = policy.training
    policy.eval()
    try:
        with torch.no_grad(), policy.disable_adapter():
            yield
    finally:
        policy.train(was_training)


class _AdaptersOff(nn.Module):
    """``module`` (a part of ``policy``) run with ``policy``'s adapters disabled; holds no parameters."""

    def __init__(self, policy: nn.Module, module: nn.Module) -> None:
        super().__init__()
        # plain attributes, not submodules: the wrapper must not own (move, save, freeze) the policy's weights
        object.__setattr__(self, "_policy", policy)
        object.__setattr__(self, "_module", module)

    @property
    def config(self) -> Any:
        """The wrapped module's ``transformers`` config (read by ``attention_inputs``)."""
        return getattr(self._module, "config", None)

    @property
    def weight(self) -> torch.Tensor:
        """The wrapped module's weight (``head_logprobs`` reads the vocabulary size from it)."""
        return self._module.weight

    @property
    def out_features(self) -> int:
        """The wrapped layer's output size (the vocabulary, for the output layer)."""
        return int(getattr(self._module, "out_features", 0) or self._module.weight.shape[0])

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's forward with the adapters off, without gradient."""
        with _adapters_off(self._policy):
            return self._module(*args, **kwargs)


class SharedReference(nn.Module):
    """A frozen reference model that is ``policy`` (a ``peft`` model) with its adapters disabled, sharing every
    base weight: no second copy. Called like a causal LM, and split like one by ``pickaxe.models.lm.split_lm``
    (its decoder and output layer also run with the adapters off), so chunked log-probs work as for a copy.

    It owns no parameters: ``state_dict()`` is empty, ``.to()`` and ``requires_grad_`` leave the policy alone
    (so ``offload_reference`` has nothing to move), and it always runs in eval mode without gradient.
    """

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "_policy", policy)

    @property
    def policy(self) -> nn.Module:
        """The shared policy."""
        return self._policy

    @property
    def config(self) -> Any:
        """The policy's ``transformers`` config."""
        return self._policy.config

    def get_decoder(self) -> nn.Module:
        """The policy's decoder, run with the adapters off."""
        return _AdaptersOff(self._policy, self._policy.get_decoder())

    def get_output_embeddings(self) -> nn.Module:
        """The policy's output layer, run with the adapters off."""
        return _AdaptersOff(self._policy, self._policy.get_output_embeddings())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The policy's forward (a causal LM's output: ``.logits``) with the adapters off, without gradient."""
        with _adapters_off(self._policy):
            return self._policy(*args, **kwargs)


def shared_reference(policy: nn.Module) -> SharedReference:
    """The reference model for a KL penalty on a LoRA ``policy``: the policy with its adapters disabled (see
    :class:`SharedReference`). A policy without adapters has no frozen weights to share: keep a frozen copy."""
    if not is_lora(policy):
        raise PickaxeError(
            "shared_reference needs a policy with LoRA adapters (apply_lora); for full fine-tuning keep a frozen "
            "copy of the starting model as the reference"
        )
    return SharedReference(policy)
