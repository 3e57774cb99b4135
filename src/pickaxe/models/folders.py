"""What a model folder must hold before anything loads it, and which tiny-model shapes the architectures take.

Torch-free, so a run's config checks (``LLMTrainConfig.check``) refuse a wrong ``--model.path`` or
``--data.reward-model`` folder, or a tiny model the architecture cannot build, in one line before any model is
loaded; :func:`~pickaxe.models.lm.load_lm` and :meth:`~pickaxe.models.reward.RewardModel.load` run the same checks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pickaxe.errors import PickaxeError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
REWARD_MODEL_FORMAT = "pickaxe-reward-model"
"""The ``format`` of a reward model's ``config.json`` (``RewardModel.save``)."""
LM_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
"""The weight files ``transformers``' ``from_pretrained`` reads, one of which a causal-LM folder holds."""


class ModelError(PickaxeError):
    """A model path that does not hold a loadable model of the kind asked for."""


def _where(path: Path, flag: str | None) -> str:
    return f"{flag} {str(path)!r}" if flag else str(path)


def _config(path: Path, flag: str | None, fix: str) -> dict[str, Any]:
    """The folder's ``config.json`` as a dict; ``ModelError`` when the folder or the file is missing or unreadable."""
    where = _where(path, flag)
    if not path.exists():
        raise ModelError(f"{where} does not exist; {fix}")
    if not path.is_dir():
        raise ModelError(f"{where} is a file, not a model folder; {fix}")
    file = path / CONFIG_FILE
    if not file.is_file():
        raise ModelError(f"{where} holds no {CONFIG_FILE}, so it is no saved model; {fix}")
    try:
        record = json.loads(file.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise ModelError(f"{file} is not readable JSON ({' '.join(str(e).split())}); {fix}") from None
    if not isinstance(record, dict):
        raise ModelError(f"{file} is not a JSON object; {fix}")
    return record


def check_reward_model_folder(path: str | Path, flag: str | None = "--data.reward-model") -> dict[str, Any]:
    """Check that folder ``path`` holds a reward model as ``RewardModel.save`` writes it (``config.json`` of format
    :data:`REWARD_MODEL_FORMAT` with the backbone's config, and ``model.safetensors``); returns the config record.
    Anything else (no folder, a causal LM's export, a run folder) is a one-line ``ModelError`` naming ``flag``."""
    p = Path(path)
    fix = "pass the export folder of a reward-model run (RUN_DIR/export of e.g. synthetic-rm)"
    record = _config(p, flag, fix)
    where = _where(p, flag)
    if record.get("format") != REWARD_MODEL_FORMAT:
        if "model_type" in record:
            raise ModelError(f"{where} holds a causal LM, not a reward model; {fix}")
        raise ModelError(f"{where}: its {CONFIG_FILE} is no reward model's (format {REWARD_MODEL_FORMAT!r}); {fix}")
    backbone = record.get("backbone")
    if not isinstance(backbone, dict) or not isinstance(backbone.get("model_type"), str):
        raise ModelError(f"{p / CONFIG_FILE} has no backbone config (model_type); save the reward model again")
    if not (p / WEIGHTS_FILE).is_file():
        raise ModelError(f"{where} holds no {WEIGHTS_FILE} (the reward model's weights); {fix}")
    return record


def check_lm_folder(path: str | Path, flag: str | None = "--model.path") -> dict[str, Any]:
    """Check that folder ``path`` holds a saved ``transformers`` causal LM (``config.json`` with a ``model_type`` and
    one of :data:`LM_WEIGHTS`); returns its config. A reward model's folder, a run folder or a missing one is a
    one-line ``ModelError`` naming ``flag``."""
    p = Path(path)
    fix = "pass a saved model folder (model.save_pretrained(DIR), or RUN_DIR/export of an earlier run)"
    record = _config(p, flag, fix)
    where = _where(p, flag)
    if record.get("format") == REWARD_MODEL_FORMAT:
        raise ModelError(
            f"{where} holds a reward model, not a causal LM; pass it as --data.reward-model, and the policy's export "
            "as --model.path"
        )
    if not isinstance(record.get("model_type"), str):
        raise ModelError(f"{where}: its {CONFIG_FILE} names no model_type, so it is no transformers model; {fix}")
    if not any((p / f).is_file() for f in LM_WEIGHTS):
        raise ModelError(f"{where} holds no weights ({' or '.join(LM_WEIGHTS[::2])}); {fix}")
    return record


def check_tiny_shape(hidden: int, heads: int, kv_heads: int, prefix: str = "--model.") -> None:
    """The shape rules of the tiny model's attention (``tiny_lm``, Qwen2 and Llama alike): the hidden size splits
    into ``heads`` heads of an even size (rotary embeddings rotate pairs), and the query heads into groups of
    ``kv_heads``. A shape outside them is a one-line ``ModelError`` naming the flags and values that fit."""
    if hidden % heads:
        fits = [h for h in (hidden - hidden % heads, hidden + heads - hidden % heads) if h > 0]
        raise ModelError(
            f"{prefix}hidden {hidden} does not split into {prefix}heads {heads} heads; use a multiple of {heads} "
            f"(e.g. {' or '.join(map(str, fits))}) or another head count"
        )
    if (hidden // heads) % 2:
        raise ModelError(
            f"{prefix}hidden {hidden} / {prefix}heads {heads} gives heads of size {hidden // heads}, which rotary "
            f"embeddings cannot take (they need an even size); use e.g. {prefix}hidden {2 * hidden}"
        )
    if heads % kv_heads:
        fits = [k for k in range(1, heads + 1) if heads % k == 0]
        raise ModelError(
            f"{prefix}heads {heads} is not a multiple of {prefix}kv-heads {kv_heads} (each key/value head serves a "
            f"group of query heads); use {prefix}kv-heads {', '.join(map(str, fits))}"
        )
