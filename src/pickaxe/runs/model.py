"""The final model of a run: ``model.safetensors`` with its size, sha256 and env step in ``model.json``, verified
before every load; and loading a network's weights from the final model or from any kept checkpoint."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pickaxe.errors import PickaxeError
from pickaxe.runs.checkpoint import CheckpointInfo, CheckpointManager
from pickaxe.runs.policies import list_policies, load_policy
from pickaxe.runs.weights import (
    MODEL_DIGEST_FILE,
    MODEL_FILE,
    load_flat_weights,
    load_into,
    verify_weights,
    write_json_synced,
    write_weights,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

SELECTION_FILE = "selection.json"
"""The run's best step by its selection rule (written by the Trainer after every evaluation); ``"best"`` loads it."""


def save_model(run_dir: Path, networks: dict[str, nn.Module], step: int | None = None) -> Path:
    """Write the networks' weights to ``model.safetensors`` (keys ``<network>.<param>``), then its size and
    sha256 to ``model.json``; ``load_model`` verifies them. Both files are fsynced and renamed into place.

    Tensors that share memory (tied input/output embeddings) are written once per name; loading gives each name
    the same values again.
    """
    path = run_dir / MODEL_FILE
    tmp = path.with_suffix(".tmp")
    digest = write_weights(tmp, networks)  # streamed, hashed as written, fsynced
    # a kill between the two renames leaves a model without a digest (loaded with a warning), never a
    # model beside the digest of an older one (which would read as corrupted)
    (run_dir / MODEL_DIGEST_FILE).unlink(missing_ok=True)
    tmp.replace(path)
    record = {"file": MODEL_FILE, **digest, "step": step, "time": time.time()}
    write_json_synced(run_dir / MODEL_DIGEST_FILE, record)
    return path


class MissingModelError(PickaxeError, FileNotFoundError):
    """The run has no ``model.safetensors`` (it has not finished)."""


def load_model(
    run_dir: str | Path,
    networks: dict[str, nn.Module],
    device: str | torch.device = "cpu",
    checkpoint: str | int = "final",
) -> None:
    """Load a run's weights into ``networks`` (the names they were saved with), verified first.

    ``checkpoint``: ``"final"`` (``model.safetensors``, checked against the size and sha256 in ``model.json``;
    a model without ``model.json``, from an older pickaxe, loads with a warning), ``"latest"`` (the newest good
    checkpoint), ``"best"`` (the step ``selection.json`` names, as ``pickaxe eval --checkpoints best`` picks it; a run
    without one: the checkpoint with the highest recorded eval metric, ties the newest) or an env
    step (the checkpoint of that step, else the policy kept at that step's evaluation, ``RUN/policies``). Checkpoints
    are verified by their manifests, kept policies by their ``model.json``. Problems raise a
    ``PickaxeError`` whose one line names the file and the fix.
    """
    run_dir = Path(run_dir)
    which = selected_step(run_dir, checkpoint_choice(checkpoint))
    if which == "final":
        load_flat_weights(networks, _load_final(run_dir, device), run_dir / MODEL_FILE)
        return
    if isinstance(which, int) and not any(i.step == which for i in CheckpointManager(run_dir).list()):
        kept = list_policies(run_dir)
        if any(p.step == which for p in kept):
            load_policy(run_dir, networks, which, device)
            return
        if kept:
            checkpoints = ", ".join(str(i.step) for i in CheckpointManager(run_dir).list()) or "none"
            raise PickaxeError(
                f"{run_dir} has no checkpoint at env step {which}; kept checkpoints: {checkpoints}; kept policies: "
                f"{', '.join(str(p.step) for p in kept)}"
            )
    state, info = _load_checkpoint_state(run_dir, which, device)
    algo = state.get("algo") if isinstance(state, dict) else None
    for name, net in networks.items():
        if not isinstance(algo, dict) or not isinstance(algo.get(name), dict):
            raise PickaxeError(f"checkpoint {info.path} holds no weights for network {name!r}; evaluate another")
        load_into(net, algo[name], info.path)


def load_collector_state(
    run_dir: str | Path, device: str | torch.device = "cpu", checkpoint: str | int = "latest"
) -> dict[str, Any] | None:
    """The collector's state in a run's checkpoint (verified; ``checkpoint`` as for :func:`load_model`, ``final``
    meaning the newest), or None when the run kept no checkpoint. What a collector holds that the final model does
    not, e.g. an LLM run's frozen reference model (which a run with a sharded reference kept in the algorithm's state:
    given here all the same)."""
    run_dir = Path(run_dir)
    which = checkpoint_choice(checkpoint)
    if not CheckpointManager(run_dir).list():
        return None
    state, _ = _load_checkpoint_state(run_dir, "latest" if which == "final" else which, device)
    collector = state.get("collector") if isinstance(state, dict) else None
    if not isinstance(collector, dict):
        return None
    algo = state.get("algo")
    if "reference" not in collector and isinstance(algo, dict) and "reference" in algo:
        collector = {**collector, "reference": algo["reference"]}  # a sharded run's learners kept it in the algorithm
    return collector


def selected_step(run_dir: Path, which: str | int) -> str | int:
    """``which``, with ``"best"`` replaced by the env step the run's ``selection.json`` names when it has one."""
    if which != "best":
        return which
    step = _read_json(run_dir / SELECTION_FILE).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else which


def checkpoint_choice(checkpoint: str | int) -> str | int:
    """``checkpoint`` as :func:`load_model` takes it: ``"final"``, ``"latest"``, ``"best"`` or an env step (an int,
    or digits with an optional ``step-`` prefix); anything else is a one-line ``PickaxeError``."""
    if isinstance(checkpoint, bool):
        raise PickaxeError(f"checkpoint must be final, latest, best or an env step, got {checkpoint!r}")
    if isinstance(checkpoint, int):
        return checkpoint
    text = str(checkpoint).strip()
    if text in ("final", "latest", "best"):
        return text
    digits = text.removeprefix("step-")
    if digits.isdigit():
        return int(digits)
    raise PickaxeError(f"--checkpoint must be final, latest, best or an env step (e.g. 10000), got {checkpoint!r}")


def _load_final(run_dir: Path, device: str | torch.device) -> dict[str, torch.Tensor]:
    path = run_dir / MODEL_FILE
    fix = f"`pickaxe eval {run_dir} --checkpoint latest` evaluates its newest checkpoint instead"
    if not path.is_file():
        raise MissingModelError(f"no model in {run_dir}: {path} is missing (did the run finish?); {fix}")
    recorded = _read_model_digest(run_dir)
    if recorded is None:
        warnings.warn(
            f"{path} has no recorded size and sha256 ({MODEL_DIGEST_FILE} is missing, e.g. a run from an older "
            "pickaxe); loading it unverified",
            stacklevel=3,
        )
    else:
        verify_weights(path, recorded, f"restore it from a backup, or {fix}")
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device=str(device))
    except Exception as e:  # safetensors raises its own error types for malformed files
        raise PickaxeError(
            f"{path} is not a valid safetensors file ({e}); restore it from a backup, or {fix}"
        ) from None


def _read_model_digest(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / MODEL_DIGEST_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_bytes())
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict) or type(record.get("size")) is not int or not isinstance(record.get("sha256"), str):
        raise PickaxeError(f"{path} is unreadable or malformed; delete it to load {MODEL_FILE} unverified")
    return record


def _load_checkpoint_state(run_dir: Path, which: str | int, device: str | torch.device) -> tuple[Any, CheckpointInfo]:
    manager = CheckpointManager(run_dir)
    infos = manager.list()
    if not infos:
        raise PickaxeError(f"{run_dir} has no checkpoints (no {manager.dir}); evaluate the final model instead")
    if which == "latest":
        with warnings.catch_warnings():  # damaged newer checkpoints are skipped with a warning: show it
            warnings.simplefilter("default")
            return manager.load(map_location=device)
    if which == "best":
        scored = [i for i in infos if i.metric is not None]
        if not scored:
            raise PickaxeError(
                f"no checkpoint in {manager.dir} has a recorded eval metric, so none is best; "
                "use --checkpoint latest or an env step"
            )
        best = max(scored, key=lambda i: (i.metric, i.step))
        return manager.load(best.path, map_location=device)
    match = [i for i in infos if i.step == which]
    if not match:
        steps = ", ".join(str(i.step) for i in infos)
        raise PickaxeError(f"{run_dir} has no checkpoint at env step {which}; kept checkpoints: {steps}")
    return manager.load(match[0].path, map_location=device)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def final_model_step(run_dir: str | Path) -> int | None:
    """The env step recorded with the run's final model in ``model.json`` (None: no final model or no step)."""
    step = _read_json(Path(run_dir) / MODEL_DIGEST_FILE).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _checkpoint_step(run_dir: Path, which: str | int) -> int | None:
    """The env step of the weights ``load_model`` loaded for ``which`` (same choice rules)."""
    which = selected_step(run_dir, which)
    if which == "final":
        return final_model_step(run_dir)
    if isinstance(which, int):
        return which
    manager = CheckpointManager(run_dir)
    if which == "latest":
        info = manager.latest(on_skip=lambda message: None)  # load_model already reported skipped ones
        return info.step if info is not None else None
    scored = [i for i in manager.list() if i.metric is not None]
    return max(scored, key=lambda i: (i.metric, i.step)).step if scored else None


def weights_source(run_dir: Path, config: dict[str, Any], which: str | int) -> dict[str, Any]:
    """Where a run's weights come from, for an export's ``pickaxe_source.json``: the run folder and name, its kind,
    recipe, algorithm, seed, config hash and git commit, the checkpoint (``which``, as ``checkpoint_choice`` returns
    it) and its env step, and the model the run started from (``model.path``). The digests of the exported files
    themselves are the export's own (``pickaxe.models.export.export_model`` adds them)."""
    manifest = _read_json(run_dir / "manifest.json")
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    return {
        "run_dir": str(run_dir.resolve()),
        "run_name": run_dir.resolve().name,
        "kind": config.get("kind"),
        "recipe": config.get("recipe"),
        "algo_name": config.get("algo_name"),
        "seed": config.get("seed"),
        "config_hash": manifest.get("config_hash"),
        "git": manifest.get("git"),
        "checkpoint": which,
        "step": _checkpoint_step(run_dir, which),
        "started_from": model.get("path"),
    }
