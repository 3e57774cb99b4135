"""Metric sinks: ``metrics.jsonl`` (always) and TensorBoard."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import re
import socket
import tempfile
from pathlib import Path
from typing import Any

from pickaxe.errors import PickaxeError

NONDETERMINISTIC_PREFIXES = ("time/", "sys/")
"""Metric name prefixes whose values depend on the machine and the moment (wall time, CPU, memory)."""


def read_metrics(run_dir: str | Path, deterministic: bool = False) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl``; a line torn by a kill (or otherwise not a JSON object) is skipped.

    ``deterministic=True`` drops the machine- and moment-dependent fields (``time/``, ``sys/``): what is
    left must be identical between two runs of the same config and seed. Torch-free.
    """
    records = []
    with open(Path(run_dir) / "metrics.jsonl", "rb") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict):
                continue
            if deterministic:
                record = {k: v for k, v in record.items() if not k.startswith(NONDETERMINISTIC_PREFIXES)}
            records.append(record)
    return records


class JsonlLogger:
    """Appends one JSON object per log point; non-finite floats are written as ``null`` (valid JSON)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def log(self, record: dict[str, Any]) -> None:
        """Write one record and flush it so a killed run keeps everything logged so far."""
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        try:
            self._file.write(json.dumps(clean) + "\n")
            self._file.flush()
        except OSError as e:  # name the file: a full disk should say where it was writing
            raise OSError(e.errno, e.strerror, str(self.path)) from e

    def flush(self) -> None:
        """Already flushed on every record."""

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class TensorBoardLogger:
    """Scalars to TensorBoard event files under the run directory (``tensorboard --logdir RUN_DIR``)."""

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imported lazily: it is slow to import

        # the writer's own thread would meet a read-only folder first, with a traceback and the path as bytes
        _check_writable(log_dir)
        # purge_step hides events a killed run wrote past its last checkpoint
        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def log(self, record: dict[str, Any]) -> None:
        """Write every numeric value of ``record`` at ``record['step']``, as one event.

        ``SummaryWriter.add_scalar`` makes one event per scalar (~0.12 ms each here: ~3 ms for a PPO record of 23
        metrics, 4% of a CartPole run); one summary holding every value of the record is the same scalars, tags and
        step to TensorBoard at a fifth of the cost."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [
            Summary.Value(tag=key, simple_value=float(value))
            for key, value in record.items()
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
        ]
        if values:
            self._writer._get_file_writer().add_summary(Summary(value=values), int(record["step"]))

    def flush(self) -> None:
        """Write pending events to disk."""
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the writer."""
        self._writer.close()


def _check_writable(folder: Path) -> None:
    """Create ``folder`` if needed and a file in it; an ``OSError`` naming ``folder`` (as text) when either fails."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".pickaxe-write-test-", dir=folder)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(folder)) from None
    os.close(fd)
    os.unlink(name)


class PrometheusSink:
    """Serves the latest value of every numeric metric on ``http://127.0.0.1:PORT/metrics`` for Prometheus.

    Metric ``eval/return_mean`` becomes gauge ``pickaxe_eval_return_mean{run="<run dir name>"}``.
    """

    def __init__(self, port: int, run_name: str) -> None:
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self._registry = CollectorRegistry()
        self._gauge_type = Gauge
        self._gauges: dict[str, Any] = {}
        self._run = run_name
        try:
            self._server, self._thread = start_http_server(port, addr="127.0.0.1", registry=self._registry)
        except OSError as e:
            raise PickaxeError(
                f"cannot serve Prometheus metrics on 127.0.0.1:{port} ({e}); pick another port"
            ) from None

    def log(self, record: dict[str, Any]) -> None:
        """Update one gauge per numeric value."""
        for key, value in record.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            name = "pickaxe_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)
            gauge = self._gauges.get(name)
            if gauge is None:
                gauge = self._gauges[name] = self._gauge_type(name, key, ["run"], registry=self._registry)
            gauge.labels(run=self._run).set(value)

    def flush(self) -> None:
        """Nothing buffered."""

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()


class WandbSink:
    """Weights & Biases tracking (``--track wandb``; needs ``pip install 'pickaxe[wandb]'``)."""

    def __init__(self, run_dir: Path, config: dict[str, Any] | None) -> None:
        wandb = _optional("wandb", "wandb")
        self._run = wandb.init(dir=str(run_dir), name=run_dir.name, config=config, resume="allow", id=run_dir.name)

    def log(self, record: dict[str, Any]) -> None:
        """Log numeric values at ``record['step']``."""
        data = {k: v for k, v in record.items() if k != "step" and isinstance(v, int | float)}
        self._run.log(data, step=int(record["step"]))

    def flush(self) -> None:
        """W&B flushes in its own process."""

    def close(self) -> None:
        """Finish the W&B run."""
        self._run.finish()


class MlflowSink:
    """MLflow tracking (``--track mlflow``; needs ``pip install 'pickaxe[mlflow]'``); uses MLflow's own
    tracking URI settings (``MLFLOW_TRACKING_URI``)."""

    def __init__(self, run_dir: Path, config: dict[str, Any] | None) -> None:
        self._mlflow = _optional("mlflow", "mlflow")
        self._active = self._mlflow.start_run(run_name=run_dir.name)
        if config:
            flat = _flatten(config)
            self._mlflow.log_params({k: v for k, v in flat.items() if v is not None})

    def log(self, record: dict[str, Any]) -> None:
        """Log numeric values at ``record['step']`` (MLflow keys cannot hold ``/``: it becomes ``.``)."""
        data = {
            k.replace("/", "."): float(v)
            for k, v in record.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }
        self._mlflow.log_metrics(data, step=int(record["step"]))

    def flush(self) -> None:
        """MLflow logs synchronously."""

    def close(self) -> None:
        """End the MLflow run."""
        self._mlflow.end_run()


TRACKERS = {"wandb": WandbSink, "mlflow": MlflowSink}


def check_port(port: int) -> None:
    """Fail early (before a run directory exists) when ``--prometheus-port`` is out of range or cannot be bound."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise PickaxeError(f"--prometheus-port must be an integer in 1..65535, got {port!r}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server that will bind it does
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise PickaxeError(
                f"cannot serve Prometheus metrics on 127.0.0.1:{port} ({e.strerror or e}); pick another "
                "--prometheus-port or stop what uses it"
            ) from None


def check_tracker(name: str) -> None:
    """Fail early (before a run directory exists) on an unknown or uninstalled tracker."""
    if name not in TRACKERS:
        raise PickaxeError(f"unknown tracker {name!r}; choose from {', '.join(sorted(TRACKERS))}")
    if importlib.util.find_spec(name) is None:
        raise PickaxeError(f"--track {name} needs the {name} package: pip install 'pickaxe[{name}]'")


def _optional(module: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise PickaxeError(f"--track {module} needs the {module} package: pip install 'pickaxe[{extra}]'") from None


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out
