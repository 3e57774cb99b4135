"""``pickaxe eval RUN --checkpoints ... --fqe``: each kept checkpoint scored by fitted Q evaluation
(``offline/fqe.py``) on the run's dataset, without running the env.

:class:`FQEScorer` is one more evaluator of ``exp/checkpoint_eval.py``: ``samples(ref)`` loads the checkpoint's
acting weights, computes its policy's actions at every ``next_obs`` and episode start of the dataset, fits a fresh Q
network and returns ``Q(s_0, pi(s_0))`` per episode start; ``estimates`` reports their mean with a 95% bootstrap CI
over the episodes as ``eval/fqe_value``. The values are cached like the online evaluation's, keyed by the weights'
digest, the FQE settings and the dataset's manifest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pickaxe.errors import PickaxeError
from pickaxe.offline.fqe_config import FQEConfig

if TYPE_CHECKING:
    from pickaxe.train.evaluate import Estimate

FQE_METRIC = "eval/fqe_value"
"""The metric of an FQE estimate in ``checkpoints.json`` (mean, 95% CI over the dataset's episodes)."""
SAMPLES_KEY = "fqe_start_value"
"""The cached per-episode values: ``Q(s_0, pi(s_0))`` of each episode start."""

Loader = Callable[[Any, dict[str, Any], Any], None]
"""``load(ref, networks, device)``: a kept checkpoint's weights into ``networks``."""


def fqe_datasets(cfg: Any, fqe: FQEConfig, run_dir: Path) -> list[str]:
    """The datasets FQE fits on: ``--fqe.dataset``, else the run's ``--data.dataset`` and ``--data.mix``; a one-line
    ``PickaxeError`` when there is none, or when a dataset is missing or not a Minari dataset (no data read)."""
    from pickaxe.offline.dataset import DatasetError, read_metadata

    data = getattr(cfg, "data", None)
    if fqe.dataset is not None:
        paths = [fqe.dataset]
    elif getattr(data, "dataset", None):
        paths = [data.dataset, *data.mix]
    else:
        raise PickaxeError(
            f"{run_dir} records no dataset (--data.dataset) for FQE to fit on; pass one with --fqe.dataset DIR"
        )
    for p in paths:
        try:
            read_metadata(p)
        except DatasetError as e:
            raise PickaxeError(str(e)) from None
    return [str(Path(p).resolve()) for p in paths]


def dataset_digest(paths: list[str]) -> str:
    """What identifies the datasets' content without reading them: each one's ``MANIFEST.json`` (sha256 of its
    files), else its ``metadata.json`` and the size of its data file."""
    from pickaxe.offline.dataset import MAIN, METADATA, data_folder

    h = hashlib.sha256()
    for p in paths:
        folder = data_folder(p)
        manifest = folder / "MANIFEST.json"
        if manifest.is_file():
            h.update(manifest.read_bytes())
        else:
            h.update((folder / METADATA).read_bytes() if (folder / METADATA).is_file() else b"")
            h.update(str((folder / MAIN).stat().st_size if (folder / MAIN).is_file() else -1).encode())
    return h.hexdigest()


def env_problem(cfg: Any) -> str | None:
    """Why the run's env cannot be built here (one line), or None when it can (built once and closed)."""
    from pickaxe.envs.make import make

    try:
        envs = make(cfg.env.id, 1, 0, evaluation=True, **cfg.env.kwargs)
    except Exception as e:  # any failure means: no online return here
        return f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"
    envs.close()
    return None


class _Spaces:
    """What a builder sizes networks from, without an env: the dataset's spaces."""

    num_envs = 1

    def __init__(self, observation_space: Any, action_space: Any) -> None:
        self.single_observation_space = self.observation_space = observation_space
        self.single_action_space = self.action_space = action_space


class FQEScorer:
    """Scores kept checkpoints of a classic run by FQE on ``paths`` (built on the first cache miss)."""

    kind = "classic"

    def __init__(self, run_dir: Path, cfg: Any, fqe: FQEConfig, paths: list[str], load: Loader) -> None:
        self.run_dir, self.cfg, self.fqe, self.paths, self.load = run_dir, cfg, fqe, paths, load
        self.settings: dict[str, Any] = {
            "fqe": {k: v for k, v in asdict(fqe).items() if k != "dataset"},
            "datasets": paths,
            "data_digest": dataset_digest(paths)[:16],
        }
        self._built: tuple[Any, Any, Any, Any] | None = None

    def _build(self) -> tuple[Any, Any, Any, Any]:
        """The transitions, the algorithm (networks sized from the dataset's spaces), the episode starts and the
        device."""
        if self._built is None:
            import gymnasium as gym

            from pickaxe.offline.dataset import DatasetError, read_mixed
            from pickaxe.offline.fqe import episode_starts
            from pickaxe.train.build import build_algorithm
            from pickaxe.utils import resolve_device, set_torch_threads

            set_torch_threads(self.cfg.torch_threads)
            try:
                data = read_mixed(self.paths)
            except DatasetError as e:
                raise PickaxeError(str(e)) from None
            if not isinstance(data.action_space, gym.spaces.Discrete | gym.spaces.Box):
                raise PickaxeError(
                    f"FQE scores policies of Discrete or Box actions; the dataset's are {data.action_space}"
                )
            algo = build_algorithm(self.cfg, _Spaces(data.observation_space, data.action_space))
            starts = episode_starts(data.arrays["terminated"], data.arrays["truncated"])
            self._built = (data, algo, starts, resolve_device(self.cfg.device))
        return self._built

    def samples(self, ref: Any) -> dict[str, np.ndarray]:
        """``Q(s_0, pi(s_0))`` of every episode start of the dataset, for the policy of checkpoint ``ref``."""
        import gymnasium as gym

        from pickaxe.offline.fqe import fit_fqe, policy_actions
        from pickaxe.runs.policies import acting_networks

        data, algo, starts, device = self._build()
        try:
            self.load(ref, acting_networks(algo.networks()), device)
        except (RuntimeError, KeyError) as e:  # weights of other shapes: the dataset's spaces are not the run's
            raise PickaxeError(
                f"the weights of step {ref.step} do not fit networks sized from {self.paths[0]}'s spaces "
                f"({' '.join(str(e).split())[:120]}); pass a dataset of the run's env with --fqe.dataset"
            ) from None
        arrays = data.arrays
        next_policy = policy_actions(algo.policy, arrays["next_obs"], self.fqe, device)
        start_policy = policy_actions(algo.policy, arrays["obs"][starts], self.fqe, device)
        space = data.action_space
        n = int(space.n) if isinstance(space, gym.spaces.Discrete) else None
        if n is None:
            next_policy = next_policy.reshape(len(next_policy), next_policy.shape[1], -1)
            start_policy = start_policy.reshape(len(start_policy), start_policy.shape[1], -1)
        fit = fit_fqe(arrays, next_policy, start_policy, n, self.fqe, device)
        return {SAMPLES_KEY: fit.start_values.astype(np.float64)}

    def estimates(self, values: dict[str, np.ndarray]) -> dict[str, Estimate]:
        """``eval/fqe_value``: the mean over episode starts with its 95% bootstrap CI over episodes."""
        from pickaxe.train.evaluate import Estimate, mean_ci

        v = values[SAMPLES_KEY]
        return {FQE_METRIC: Estimate(float(v.mean()), *mean_ci(v), len(v))}

    def units(self, values: dict[str, np.ndarray], metric: str) -> np.ndarray | None:
        """One value per episode start (the same starts for every checkpoint: paired)."""
        return values.get(SAMPLES_KEY) if metric == FQE_METRIC else None

    def close(self) -> None:
        """Nothing to close: no env is built."""
        return None


def rank_agreement(rows: list[dict[str, Any]], online: str, offline: str = FQE_METRIC) -> dict[str, Any] | None:
    """Spearman's rank correlation between ``online`` and ``offline`` over the rows that have both (None when fewer
    than two do)."""
    from pickaxe.eval.stats import spearman

    pairs = [
        (r["metrics"][online]["mean"], r["metrics"][offline]["mean"])
        for r in rows
        if (r["metrics"].get(online) or {}).get("mean") is not None
        and (r["metrics"].get(offline) or {}).get("mean") is not None
    ]
    if len(pairs) < 2:
        return None
    rho = spearman([a for a, _ in pairs], [b for _, b in pairs])
    return {"metrics": [online, offline], "spearman": rho, "n": len(pairs)}


__all__ = ["FQE_METRIC", "FQEScorer", "dataset_digest", "env_problem", "fqe_datasets", "rank_agreement"]
