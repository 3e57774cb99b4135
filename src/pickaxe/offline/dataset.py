"""Offline datasets in Minari's format, read and written locally (nothing is ever downloaded).

A dataset folder ``DIR`` is what Minari keeps under its datasets path for one dataset id: ``DIR/data/metadata.json``
(spaces, counts, references, provenance) and ``DIR/data/main_data.hdf5`` (one group per episode: ``observations``
``[T + 1, ...]``, ``actions``, ``rewards``, ``terminations``, ``truncations`` ``[T]``), so ``minari.MinariDataset(DIR
+ "/data")`` opens a pickaxe dataset and pickaxe opens one a user made with Minari. pickaxe adds
``DIR/data/MANIFEST.json`` (size and sha256 of both files, written last): a dataset with one is verified before it is
read, one without (made elsewhere) is checked for consistency (counts, episode shapes) as it is read.

Everything that can be wrong with a dataset (missing, damaged, truncated, spaces that do not fit the env) is a
one-line ``DatasetError`` naming the file and the fix, raised before any training. Torch-free; minari and h5py
(the ``offline`` extra) are imported when a dataset is read or written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pickaxe.digests import file_problem, read_manifest, write_manifest
from pickaxe.errors import PickaxeError

DATA = "data"
METADATA = "metadata.json"
MAIN = "main_data.hdf5"
MANIFEST_FORMAT = "pickaxe-dataset-1"
KEYS = ("obs", "action", "reward", "terminated", "truncated", "next_obs")
"""The transition keys a dataset yields: the Collector's, so any algorithm's ``update(batch)`` takes them."""


class DatasetError(PickaxeError):
    """A dataset that cannot be used (missing, damaged, truncated, or not fitting the env); the message is one line."""


@dataclass
class Episode:
    """One episode as Minari stores it: ``obs`` holds ``T + 1`` observations (the last is the final one)."""

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray

    def __len__(self) -> int:
        return len(self.reward)


@dataclass
class Transitions:
    """A dataset's transitions, flat over episodes (episode order, then time), as numpy arrays under :data:`KEYS`,
    with the spaces, the metadata and every episode's return."""

    arrays: dict[str, np.ndarray]
    observation_space: Any
    action_space: Any
    metadata: dict[str, Any] = field(default_factory=dict)
    episode_returns: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __len__(self) -> int:
        return len(self.arrays["reward"])


def _need_minari() -> Any:
    try:
        import minari  # noqa: F401
        from minari.dataset.minari_storage import MinariStorage
    except ImportError as e:
        raise DatasetError(f"offline datasets need minari and h5py: pip install 'pickaxe[offline]' ({e})") from None
    return MinariStorage


def data_folder(path: str | Path) -> Path:
    """The folder holding ``metadata.json``: ``DIR/data`` for a dataset folder ``DIR``, or ``DIR`` itself."""
    path = Path(path)
    return path / DATA if (path / DATA / METADATA).is_file() or not (path / METADATA).is_file() else path


def read_metadata(path: str | Path) -> dict[str, Any]:
    """A dataset's ``metadata.json`` (no data read); one-line ``DatasetError`` if it is missing or unreadable."""
    folder = data_folder(path)
    file = folder / METADATA
    if not Path(path).exists():
        raise DatasetError(f"dataset {path} does not exist; make one with `pickaxe collect RUN --out {path}`")
    if not file.is_file():
        raise DatasetError(f"{path} is not a Minari dataset (no {DATA}/{METADATA}); pass the dataset's folder")
    try:
        meta = json.loads(file.read_bytes())
    except (OSError, ValueError) as e:
        why = " ".join(str(e).split())
        raise DatasetError(f"{file} is unreadable ({why}); restore the dataset or make it again") from None
    if not isinstance(meta, dict):
        raise DatasetError(f"{file} is not a JSON object; restore the dataset or make it again")
    return meta


def dataset_spaces(path: str | Path) -> tuple[Any, Any]:
    """``(observation_space, action_space)`` recorded in a dataset's metadata."""
    _need_minari()
    from minari.serialization import deserialize_space

    meta = read_metadata(path)
    try:
        return deserialize_space(meta["observation_space"]), deserialize_space(meta["action_space"])
    except Exception as e:
        raise DatasetError(
            f"{data_folder(path) / METADATA} has no readable observation/action spaces ({type(e).__name__}: "
            f"{' '.join(str(e).split())[:120]}); make the dataset again"
        ) from None


def verify(path: str | Path) -> None:
    """Check a pickaxe dataset's files against its ``MANIFEST.json`` (a dataset without one, made with Minari, is
    checked as it is read); one-line ``DatasetError`` naming the damaged file."""
    folder = data_folder(path)
    try:
        files = read_manifest(folder, MANIFEST_FORMAT)
    except ValueError as e:
        raise DatasetError(str(e)) from None
    if files is None:
        return
    for name, recorded in files.items():
        problem = file_problem(folder / name, recorded, "MANIFEST.json")
        if problem is not None:
            raise DatasetError(
                f"dataset file {folder / name} {problem}: it is damaged or truncated; make the dataset again "
                "with `pickaxe collect`"
            )


def check_fits(path: str | Path, observation_space: Any, action_space: Any, env_id: str) -> None:
    """The dataset's spaces equal the env's (as pickaxe makes it): one-line ``DatasetError`` otherwise."""
    obs, act = dataset_spaces(path)
    for what, theirs, ours in (("observations", obs, observation_space), ("actions", act, action_space)):
        if theirs != ours:
            raise DatasetError(
                f"dataset {path}: its {what} {theirs} do not fit env {env_id}'s {ours}; train on the env the dataset "
                "was made from (--env.id) or use another dataset"
            )


def read(path: str | Path) -> Transitions:
    """Every transition of a dataset, verified (manifest) and checked for consistency (metadata counts, episode
    shapes); ``next_obs[t]`` is ``observations[t + 1]`` of its episode, the true final observation at an end."""
    MinariStorage = _need_minari()
    verify(path)
    meta = read_metadata(path)
    obs_space, action_space = dataset_spaces(path)
    folder = data_folder(path)
    try:
        storage = MinariStorage.read(folder.resolve())
        episodes = list(storage.get_episodes(range(int(meta.get("total_episodes", 0)))))
    except DatasetError:
        raise
    except Exception as e:  # h5py raises OSError/KeyError for truncated or damaged files
        raise DatasetError(
            f"dataset {path} is damaged or truncated ({type(e).__name__}: {' '.join(str(e).split())[:160]}); "
            "make it again"
        ) from None
    if not episodes:
        raise DatasetError(f"dataset {path} holds no episodes; make it again with --episodes N")
    parts: dict[str, list[np.ndarray]] = {k: [] for k in KEYS}
    returns = []
    for i, ep in enumerate(episodes):
        o, a = np.asarray(ep["observations"]), np.asarray(ep["actions"])
        r = np.asarray(ep["rewards"])
        term, trunc = np.asarray(ep["terminations"]), np.asarray(ep["truncations"])
        t = len(r)
        if t == 0 or len(o) != t + 1 or len(a) != t or len(term) != t or len(trunc) != t:
            raise DatasetError(
                f"dataset {path}: episode {i} is inconsistent ({len(o)} observations, {len(a)} actions, {t} rewards;"
                " Minari stores T + 1, T, T); the dataset is damaged, make it again"
            )
        parts["obs"].append(o[:-1])
        parts["next_obs"].append(o[1:])
        parts["action"].append(a)
        parts["reward"].append(r)
        parts["terminated"].append(term)
        parts["truncated"].append(trunc)
        returns.append(float(r.sum()))
    arrays = {k: np.concatenate(v) for k, v in parts.items()}
    recorded = meta.get("total_steps")
    if isinstance(recorded, int) and recorded != len(arrays["reward"]):
        raise DatasetError(
            f"dataset {path} is truncated: its metadata records {recorded} steps, its data holds "
            f"{len(arrays['reward'])}; make it again"
        )
    arrays["obs"] = arrays["obs"].astype(np.float32)
    arrays["next_obs"] = arrays["next_obs"].astype(np.float32)
    arrays["reward"] = arrays["reward"].astype(np.float32)
    arrays["terminated"] = arrays["terminated"].astype(bool)
    arrays["truncated"] = arrays["truncated"].astype(bool)
    return Transitions(arrays, obs_space, action_space, meta, np.asarray(returns))


def read_mixed(paths: list[str | Path]) -> Transitions:
    """Several datasets as one (``medium-expert``, ``medium-replay`` style): their transitions concatenated in the
    order given. Their spaces must be equal; the first one's metadata (references included) is kept, with the
    sources listed under ``pickaxe_mixed``."""
    parts = [read(p) for p in paths]
    first = parts[0]
    for p, t in zip(paths[1:], parts[1:], strict=True):
        if t.observation_space != first.observation_space or t.action_space != first.action_space:
            raise DatasetError(
                f"dataset {p} cannot be mixed with {paths[0]}: their spaces differ ({t.observation_space}, "
                f"{t.action_space} against {first.observation_space}, {first.action_space})"
            )
    if len(parts) == 1:
        return first
    arrays = {k: np.concatenate([t.arrays[k] for t in parts]) for k in KEYS}
    meta = {**first.metadata, "pickaxe_mixed": [str(p) for p in paths]}
    returns = np.concatenate([t.episode_returns for t in parts])
    return Transitions(arrays, first.observation_space, first.action_space, meta, returns)


def write(
    out: str | Path,
    episodes: list[Episode],
    observation_space: Any,
    action_space: Any,
    dataset_id: str,
    metadata: dict[str, Any],
    env_id: str | None = None,
) -> Path:
    """Write ``episodes`` as a Minari dataset in ``out`` (which must not exist or be empty), with ``metadata``
    (provenance, references) merged into ``metadata.json``, then the ``MANIFEST.json`` of both files. Returns
    ``out``."""
    MinariStorage = _need_minari()
    import gymnasium as gym
    from minari import __version__ as minari_version
    from minari.data_collector import EpisodeBuffer

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise DatasetError(f"{out} already exists and is not empty; choose another --out or remove it")
    folder = (out / DATA).resolve()  # absolute: minari's size accounting doubles a relative path
    folder.mkdir(parents=True, exist_ok=True)
    spec = None
    if env_id is not None and ":" not in env_id:
        try:
            spec = gym.spec(env_id)
        except gym.error.Error:
            spec = None
    storage = MinariStorage.new(
        folder,
        observation_space=observation_space,
        action_space=action_space,
        env_spec=spec,
        data_format="hdf5",
        jpeg_encoding=False,
    )
    buffers = [
        EpisodeBuffer(
            observations=np.asarray(ep.obs),
            actions=np.asarray(ep.action),
            rewards=np.asarray(ep.reward, dtype=np.float64),
            terminations=np.asarray(ep.terminated, dtype=bool),
            truncations=np.asarray(ep.truncated, dtype=bool),
        )
        for ep in episodes
    ]
    storage.update_episodes(buffers)
    storage.update_metadata({"dataset_id": dataset_id, "minari_version": minari_version, **metadata})
    write_manifest(folder, [MAIN, METADATA], MANIFEST_FORMAT)
    return out
