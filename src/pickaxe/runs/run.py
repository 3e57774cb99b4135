"""``Run``: one directory holding a run's config, manifest, metrics and model."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from pickaxe.errors import PickaxeError
from pickaxe.runs.manifest import build_manifest, to_jsonable
from pickaxe.runs.status import write_status
from pickaxe.runs.tracking import TRACKERS, JsonlLogger, PrometheusSink, TensorBoardLogger, check_tracker

NONDETERMINISTIC_PREFIXES = ("time/", "sys/")
"""Metric name prefixes whose values depend on the machine and the moment (wall time, CPU, memory)."""

MODEL_FILE = "model.safetensors"


def default_run_dir(name: str, root: str | Path = "runs") -> Path:
    """``runs/<name>-<timestamp>``, made unique if that folder exists."""
    base = Path(root) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    return path


class Run:
    """A run directory: ``config.json``, ``manifest.json``, ``metrics.jsonl``, ``events.jsonl``, TensorBoard
    events, ``checkpoints/`` and the final ``model.safetensors``.

    Every log record carries ``step`` (env steps so far); wall-clock fields are namespaced ``time/``.
    ``Run.open`` reattaches to an existing directory (for resuming) without rewriting its config.
    """

    def __init__(
        self,
        path: str | Path,
        config: Any = None,
        seed: int | None = None,
        tensorboard: bool = True,
        track: tuple[str, ...] = (),
        prometheus_port: int | None = None,
    ) -> None:
        for name in track:
            check_tracker(name)
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._tensorboard = tensorboard
        self._sinks: list[Any] = []
        if config is not None:
            self._write_json("config.json", to_jsonable(config))
        self._write_json("manifest.json", build_manifest(config, seed))
        self._open_sinks(purge_step=None)
        self._extra_sinks = _extra_sinks(self.path, to_jsonable(config), track, prometheus_port)

    @classmethod
    def open(
        cls, path: str | Path, tensorboard: bool = True, track: tuple[str, ...] = (), prometheus_port: int | None = None
    ) -> Run:
        """Reattach to an existing run directory; call ``rewind(step)`` before logging."""
        run = cls.__new__(cls)
        run.path = Path(path)
        if not (run.path / "config.json").is_file():
            raise PickaxeError(f"{run.path} is not a run directory: config.json is missing")
        run._tensorboard = tensorboard
        run._sinks = []
        run._extra_sinks = _extra_sinks(run.path, None, track, prometheus_port) if track or prometheus_port else []
        return run

    def config(self) -> dict[str, Any]:
        """The run's ``config.json``."""
        try:
            return json.loads((self.path / "config.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise PickaxeError(f"cannot read {self.path / 'config.json'}: {e}") from None

    def _open_sinks(self, purge_step: int | None) -> None:
        self._sinks = [JsonlLogger(self.path / "metrics.jsonl")]
        if self._tensorboard:
            self._sinks.append(TensorBoardLogger(self.path / "tensorboard", purge_step=purge_step))

    def rewind(self, step: int) -> None:
        """Drop every metric logged after ``step`` (and a torn last line), then reopen the sinks.

        A resumed run calls this with its checkpoint's step, so ``metrics.jsonl`` ends up with each
        step exactly once. The file is rewritten atomically.
        """
        self._close_sinks()
        path = self.path / "metrics.jsonl"
        kept: list[str] = []
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a write torn by a kill
                if record.get("step", 0) <= step:
                    kept.append(line)
        tmp = path.with_name(".metrics.jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        tmp.replace(path)
        self._open_sinks(purge_step=step + 1)

    def event(self, message: str, **fields: Any) -> None:
        """Append a lifecycle event (resume, restart, rollback) to ``events.jsonl`` and echo it on stderr."""
        record = {"time": time.time(), "message": message, **fields}
        with open(self.path / "events.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        print(f"pickaxe: {message}", file=sys.stderr)

    def set_status(self, state: str, **fields: Any) -> None:
        """Record the run's state in ``status.json`` (see :mod:`pickaxe.runs.status`), e.g.
        ``run.set_status("running", step=1000, total_steps=50000)``; states: running, finished, interrupted,
        crashed, stopped."""
        write_status(self.path, state, **fields)

    def _write_json(self, name: str, obj: Any) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(self.path / name)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Record ``metrics`` at env step ``step`` in every sink."""
        record = {"step": int(step), **metrics}
        for sink in (*self._sinks, *self._extra_sinks):
            sink.log(record)

    def save_model(self, networks: dict[str, nn.Module]) -> Path:
        """Write the networks' weights to ``model.safetensors`` (keys ``<network>.<param>``).

        Tensors that share memory (tied input/output embeddings) are written once per name, as copies:
        safetensors refuses shared tensors, and loading gives each name the same values again.
        """
        tensors: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for name, net in networks.items():
            for key, t in net.state_dict().items():
                ptr = t.untyped_storage().data_ptr()
                t = t.detach().cpu().contiguous()
                tensors[f"{name}.{key}"] = t.clone() if ptr in seen else t
                seen.add(ptr)
        path = self.path / MODEL_FILE
        tmp = path.with_suffix(".tmp")
        save_file(tensors, str(tmp))
        tmp.replace(path)
        return path

    def flush(self) -> None:
        """Push buffered metrics (TensorBoard events) to disk."""
        for sink in (*self._sinks, *self._extra_sinks):
            sink.flush()

    def _close_sinks(self) -> None:
        for sink in self._sinks:
            sink.close()
        self._sinks = []

    def close(self) -> None:
        """Flush and close every sink."""
        self._close_sinks()
        for sink in self._extra_sinks:
            sink.close()
        self._extra_sinks = []

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(run_dir: str | Path, deterministic: bool = False) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl`` (a line torn by a kill is skipped).

    ``deterministic=True`` drops the machine- and moment-dependent fields (``time/``, ``sys/``): what is
    left must be identical between two runs of the same config and seed.
    """
    records = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if deterministic:
            record = {k: v for k, v in record.items() if not k.startswith(NONDETERMINISTIC_PREFIXES)}
        records.append(record)
    return records


def _extra_sinks(path: Path, config: Any, track: tuple[str, ...], prometheus_port: int | None) -> list[Any]:
    """Optional sinks: W&B / MLflow trackers and a Prometheus endpoint."""
    sinks: list[Any] = []
    for name in track:
        check_tracker(name)
        sinks.append(TRACKERS[name](path, config))
    if prometheus_port is not None:
        sinks.append(PrometheusSink(prometheus_port, path.name))
    return sinks


def load_model(run_dir: str | Path, networks: dict[str, nn.Module], device: str | torch.device = "cpu") -> None:
    """Load ``model.safetensors`` of a run into ``networks`` (the names it was saved with)."""
    path = Path(run_dir) / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no model in {run_dir}: {path} is missing (did the run finish?)")
    tensors = load_file(str(path), device=str(device))
    for name, net in networks.items():
        prefix = f"{name}."
        net.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
