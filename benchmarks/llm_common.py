"""Shared pieces of the LLM benchmarks (``llm.py``, ``llm_trl.py``, ``llm_floor.py``, ``trl_pairs.py``): process
memory and CPU readings, fresh-process measurement runs, spreads, and the ``arith-grpo`` model folder and prompt
stream both sides of a TRL comparison read."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from pickaxe.recipes.llm import LLM_RECIPES
from pickaxe.train.llm import build_env, build_model

GIB = 1 << 30


def rss_bytes() -> int:
    """Resident set size of this process now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_bytes() -> int:
    """Peak resident set size of this process (since start or the last ``reset_peak``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak() -> int:
    """Reset the kernel's peak-RSS mark to the current RSS (Linux ``clear_refs`` 5); returns the peak before."""
    before = peak_bytes()
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return before


def run_child(spec: dict[str, Any], cap_bytes: int | None = None, timeout: float = 1800) -> dict[str, Any]:
    """Run one measurement (``spec``) in a fresh Python process, under an address-space cap when given; returns
    its JSON result, or ``{"failed": ...}`` with the reason (``at_cap`` when it ran out of the capped memory)."""

    def limit() -> None:
        if cap_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, str(Path(__file__).resolve().with_name("llm.py")), "_child", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=limit, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"failed": f"timed out after {timeout:.0f} s", "at_cap": False}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    err = proc.stderr.strip().splitlines()
    last = err[-1] if err else f"exit status {proc.returncode}"
    oom = any(s in proc.stderr for s in ("can't allocate memory", "MemoryError", "std::bad_alloc", "out of memory"))
    return {"failed": last[:300], "at_cap": bool(cap_bytes) and (oom or proc.returncode == -9)}


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of ``values``."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt_spread(s: dict[str, float], unit: str = "", digits: int = 2) -> str:
    """``median [min-max]`` text."""
    return f"{s['median']:.{digits}f}{unit} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def rounded(d: dict[str, float], digits: int = 4) -> dict[str, float]:
    """``d`` with each value rounded to ``digits`` decimals (for the JSON line)."""
    return {k: round(v, digits) for k, v in d.items()}


def cpu_usage() -> tuple[float, int]:
    """CPU seconds (user + system) and minor page faults of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def save_model_folder(folder: Path, seed: int = 0, shape: str | None = None) -> None:
    """The ``arith-grpo`` recipe's tiny model (at a named real ``shape``, random weights, if given) and character
    tokenizer, saved as a transformers model folder."""
    from pickaxe.models.lm import no_progress_bars

    cfg = LLM_RECIPES["arith-grpo"].make()
    cfg.model.shape = shape
    model, tok = build_model(cfg, torch.device("cpu"), seed)
    with no_progress_bars():  # off while saving, as they were afterwards (a test calls this in its own process)
        model.save_pretrained(folder)
        tok.save_pretrained(folder)


def save_prompt_stream(path: Path, n: int, seed: int = 0) -> None:
    """``n`` training prompts of the ``arith-grpo`` task, in the order both learners consume them."""
    cfg = LLM_RECIPES["arith-grpo"].make()
    env = build_env(cfg, seed, seed)
    rows = [{"prompt": ex.prompt, "answer": ex.answer, "metadata": ex.metadata} for ex in env.sample(n)]
    path.write_text(json.dumps(rows))
