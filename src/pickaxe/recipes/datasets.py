"""Datasets an offline recipe makes when it is given none (``--data.make KIND``, the offline recipes' default).

``pickaxe train cartpole-iql`` on a fresh machine: without ``--data.dataset``, the run's ``--data.make`` kind
(expert, medium or random) of its env's dataset is made from pickaxe's own source run, as ``benchmarks/offline.py``
makes the datasets of docs/offline.md: the source recipe (``DATASET_SOURCES``) trained at seed 0, then
``pickaxe collect`` of its final policy with the kind's flags. Both are cached under :func:`dataset_cache`
(``$PICKAXE_DATASETS``, default ``~/.cache/pickaxe/datasets``): the source run in ``sources/<recipe>-<hash>`` and the
dataset in ``<env>-<kind>-<hash>``, the hash covering the source's whole config, the collect flags and the versions
of pickaxe, torch and gymnasium, so a later run (any algorithm, any seed) reuses them and other settings never do. A
lock file makes concurrent runs (a sweep's) wait for the one making it. The dataset's metadata records its provenance
(source run, its config hash and the acting weights' sha256, the collect flags), the run's ``config.json`` the
dataset's path and its ``events.jsonl`` that provenance.

Torch-free until a dataset has to be made.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pickaxe.algos.offline_configs import is_offline
from pickaxe.errors import ConfigError


@dataclass(frozen=True)
class DatasetSource:
    """Where an env's datasets come from: the source recipe and, per kind, ``pickaxe collect``'s options."""

    recipe: str
    kinds: dict[str, dict[str, Any]] = field(default_factory=dict)


_BOX_KINDS = {
    "expert": {"episodes": 20},
    "medium": {"episodes": 20, "noise": 0.5},
    "random": {"episodes": 20, "epsilon": 1.0},
}
DATASET_SOURCES: dict[str, DatasetSource] = {
    "CartPole-v1": DatasetSource(
        "cartpole-ppo",
        {
            "expert": {"episodes": 10},
            "medium": {"episodes": 20, "epsilon": 0.5},
            "random": {"episodes": 100, "epsilon": 1.0},
        },
    ),
    "Pendulum-v1": DatasetSource("pendulum-sac", _BOX_KINDS),
    "Hopper-v5": DatasetSource("hopper-ppo", _BOX_KINDS),
    "HalfCheetah-v5": DatasetSource("halfcheetah-sac", _BOX_KINDS),
}
"""Env id -> its datasets' source (the CartPole and Pendulum datasets are benchmarks/offline.py's)."""


def dataset_cache() -> Path:
    """``$PICKAXE_DATASETS``, else ``$XDG_CACHE_HOME/pickaxe/datasets``, else ``~/.cache/pickaxe/datasets``."""
    if os.environ.get("PICKAXE_DATASETS"):
        return Path(os.environ["PICKAXE_DATASETS"]).absolute()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pickaxe" / "datasets"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def source_config(cfg: Any) -> Any:
    """The source run's config for ``cfg``'s env (seed 0; ``data.source_steps`` env steps when set); a ``ConfigError``
    line for an env without a dataset source."""
    from pickaxe.recipes import get_recipe

    source = DATASET_SOURCES.get(cfg.env.id)
    if source is None or cfg.env.kwargs:
        envs = ", ".join(DATASET_SOURCES)
        raise ConfigError(
            f"--data.make: pickaxe makes datasets of {envs} (without --env.kwargs), not of {cfg.env.id}: give "
            "--data.dataset DIR (`pickaxe collect RUN --out DIR` makes one from any run)"
        )
    src = get_recipe(source.recipe)
    src.seed = 0
    if cfg.data.source_steps is not None:
        src.trainer.total_steps = cfg.data.source_steps
    return src


def made_dataset_paths(cfg: Any) -> tuple[Path, Path, dict[str, Any]]:
    """``(source run folder, dataset folder, collect options)`` of ``cfg``'s ``--data.make`` dataset."""
    from importlib import metadata

    src = source_config(cfg)
    flags = DATASET_SOURCES[cfg.env.id].kinds[cfg.data.make]
    versions = {name: metadata.version(name) for name in ("pickaxe", "torch", "gymnasium")}
    source_key = _digest({"source": src.to_dict(), "versions": versions})
    data_key = _digest({"source": source_key, "collect": flags})
    root = dataset_cache()
    env = cfg.env.id.split("/")[-1].split("-v")[0].lower()
    return root / "sources" / f"{src.recipe}-{source_key}", root / f"{env}-{cfg.data.make}-{data_key}", flags


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Hold ``root/.lock`` (an exclusive ``flock``) while making a dataset."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_dataset(cfg: Any, quiet: bool = False) -> Path | None:
    """An offline ``cfg`` without ``--data.dataset`` but with ``--data.make``: make (or find) its dataset, point
    ``cfg.data.dataset`` at it and check it as ``--data.dataset`` is checked; return its folder (None when there was
    nothing to make). A message on stderr says which dataset, and whether it was made or found."""
    if not is_offline(cfg.algo) or cfg.data.dataset is not None or cfg.data.make is None:
        return None
    source_dir, out, flags = made_dataset_paths(cfg)
    src = source_config(cfg)
    how = ", ".join(f"{k} {v}" for k, v in flags.items())
    if not (out / "data" / "MANIFEST.json").is_file():
        with _locked(dataset_cache()):
            if not (out / "data" / "MANIFEST.json").is_file():
                if not quiet:
                    print(
                        f"pickaxe: no --data.dataset: making the {cfg.env.id} {cfg.data.make} dataset in {out} "
                        f"({src.recipe} at seed 0, then {how}); later runs reuse it",
                        file=sys.stderr,
                    )
                _make(src, source_dir, out, flags)
    elif not quiet:
        print(
            f"pickaxe: no --data.dataset: the {cfg.env.id} {cfg.data.make} dataset made before, {out}", file=sys.stderr
        )
    cfg.data.dataset = str(out)
    cfg.check_data()
    return out


def _make(src: Any, source_dir: Path, out: Path, flags: dict[str, Any]) -> None:
    """Train ``src`` into ``source_dir`` (unless it finished there before), then collect into ``out`` through a
    temporary folder renamed into place."""
    from pickaxe.train.build import train
    from pickaxe.train.collect import collect

    if not (source_dir / "model.safetensors").is_file() or not (source_dir / "model.json").is_file():
        src.check()
        train(src, run_dir=source_dir, overwrite=source_dir.exists(), checked=True)
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    collect(source_dir, tmp, **flags)
    tmp.rename(out)
