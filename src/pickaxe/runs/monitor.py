"""Process and GPU resource readings for the log: CPU, memory, GPU utilisation and memory."""

from __future__ import annotations

from typing import Any

import psutil
import torch


class SystemMonitor:
    """Reads ``sys/*`` metrics: process CPU % (since the last reading), resident memory, and per-GPU
    utilisation and memory through NVML (nvidia-ml-py) when an NVIDIA GPU is present.

    These values vary from run to run; like ``time/*`` they are excluded when runs are compared for
    determinism.
    """

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first reading only sets the baseline
        self._nvml: Any = None
        self._gpus: list[Any] = []
        if torch.cuda.is_available():
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
                self._gpus = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            except Exception:
                self._nvml = None

    def read(self) -> dict[str, float]:
        """Current readings."""
        mem = self._process.memory_info()
        out = {"sys/cpu_percent": self._process.cpu_percent(None), "sys/rss_mb": mem.rss / 2**20}
        if self._nvml is not None:
            for i, handle in enumerate(self._gpus):
                util = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                out[f"sys/gpu{i}_util_percent"] = float(util.gpu)
                out[f"sys/gpu{i}_mem_mb"] = info.used / 2**20
        if torch.cuda.is_available():
            out["sys/torch_cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
        return out
