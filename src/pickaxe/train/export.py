"""``export_run``: an LLM run's policy as a standard ``transformers`` folder for the next stage (what
``pickaxe export RUN_DIR`` does). The model is rebuilt from the run's ``config.json`` as training built it, its
weights are loaded (verified) from the final model or a checkpoint, LoRA adapters are merged, and
:func:`pickaxe.models.export.export_model` writes the folder with a ``pickaxe_source.json`` naming the run."""

from __future__ import annotations

from pathlib import Path

import torch

from pickaxe.errors import PickaxeError
from pickaxe.models.export import export_model
from pickaxe.models.lora import is_lora, merge_lora
from pickaxe.runs.folder import disk_error
from pickaxe.runs.model import MODEL_FILE, checkpoint_choice, weights_source
from pickaxe.runs.run import Run
from pickaxe.train.build import config_from_dict
from pickaxe.train.llm_config import LLMTrainConfig

DEFAULT_EXPORT_DIR = "export"
"""Where ``export_run`` writes by default: ``RUN_DIR/export``."""


def export_run(
    run_dir: str | Path,
    out_dir: str | Path | None = None,
    checkpoint: str | int = "final",
    overwrite: bool = False,
    device: str | torch.device = "cpu",
) -> Path:
    """Export LLM run ``run_dir``'s policy to ``out_dir``; return the folder. The default, ``RUN_DIR/export``, is
    the run's own export (the trainer writes it when the run finishes) and is replaced; another folder that
    already holds an export is replaced only with ``overwrite``.

    ``checkpoint``: ``"final"`` (``model.safetensors``), ``"latest"``, ``"best"`` or an env step, as for
    ``pickaxe eval``. The folder loads with ``load_lm``/``load_tokenizer`` and gives the run's log-probs;
    ``pickaxe_source.json`` records the run folder, recipe, algorithm, seed, config hash, git commit, the
    checkpoint and its env step, and the model the run started from. Weights are loaded on ``device``. A full
    disk or an unwritable destination raises a one-line ``PickaxeError`` (nothing is left under ``out_dir``).
    """
    from pickaxe.train.llm import load_run_lm

    run_path = Path(run_dir)
    data = Run.open(run_path).config()
    cfg = config_from_dict(data)
    if not isinstance(cfg, LLMTrainConfig):
        raise PickaxeError(
            f"{run_path} is a classic RL run; export writes transformers folders of LLM runs only (its weights are "
            f"in {MODEL_FILE})"
        )
    which = checkpoint_choice(checkpoint)
    if which == "final" and not (run_path / MODEL_FILE).is_file():
        raise PickaxeError(
            f"{run_path} has no final model ({MODEL_FILE}; did the run finish?); export a checkpoint with "
            "--checkpoint latest"
        )
    model, tokenizer = load_run_lm(cfg, run_path, device, which)
    lora = is_lora(model)
    model = merge_lora(model, copy_model=False)  # ours alone: merge in place, no second copy
    source = weights_source(run_path, data, which)
    source["lora_merged"] = lora
    if out_dir is None:  # the run's own export (the trainer writes one too): always regenerable, so replaced
        out_dir, overwrite = run_path / DEFAULT_EXPORT_DIR, True
    try:
        return export_model(model.eval(), tokenizer, out_dir, source, overwrite=overwrite)
    except Exception as e:  # a full disk or an unwritable folder: one line (the export is written whole or not at all)
        out = Path(out_dir)
        error = disk_error(e, out.absolute().parent, resumable=False, target=out, undone="nothing was exported")
        if error is None:
            raise
        raise error from e
