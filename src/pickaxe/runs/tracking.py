"""Metric sinks: ``metrics.jsonl`` (always) and TensorBoard."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class JsonlLogger:
    """Appends one JSON object per log point; non-finite floats are written as ``null`` (valid JSON)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def log(self, record: dict[str, Any]) -> None:
        """Write one record and flush it so a killed run keeps everything logged so far."""
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()

    def flush(self) -> None:
        """Already flushed on every record."""

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class TensorBoardLogger:
    """Scalars to TensorBoard event files under the run directory (``tensorboard --logdir RUN_DIR``)."""

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imported lazily: it is slow to import

        # purge_step hides events a killed run wrote past its last checkpoint
        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def log(self, record: dict[str, Any]) -> None:
        """Write every numeric value of ``record`` at ``record['step']``."""
        step = int(record["step"])
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                self._writer.add_scalar(key, value, step)

    def flush(self) -> None:
        """Write pending events to disk."""
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the writer."""
        self._writer.close()
