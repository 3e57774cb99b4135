"""What a run records about where it came from: config hash, git commit, package versions, command line."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import subprocess
import sys
from importlib import metadata
from typing import Any

_PACKAGES = ("pickaxe", "torch", "gymnasium", "tensordict", "numpy", "tyro", "transformers", "vllm", "ray")


def to_jsonable(config: Any) -> Any:
    """A dataclass (nested), dict or scalar as plain JSON types."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: to_jsonable(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, dict):
        return {str(k): to_jsonable(v) for k, v in config.items()}
    if isinstance(config, list | tuple):
        return [to_jsonable(v) for v in config]
    return config


def config_hash(config: Any) -> str:
    """Stable short sha256 of a config's canonical JSON."""
    text = json.dumps(to_jsonable(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def git_commit() -> dict[str, Any] | None:
    """Commit and dirty flag of the git checkout holding the working directory, or None outside git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if commit.returncode != 0:
            return None
        status = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, timeout=5)
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return None


def package_versions() -> dict[str, str]:
    """Installed versions of the packages that decide a run's numbers."""
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def build_manifest(config: Any, seed: int | None) -> dict[str, Any]:
    """The ``manifest.json`` content of a run."""
    return {
        "git": git_commit(),
        "packages": package_versions(),
        "platform": platform.platform(),
        "command": sys.argv,
        "seed": seed,
        "config_hash": config_hash(config) if config is not None else None,
    }
