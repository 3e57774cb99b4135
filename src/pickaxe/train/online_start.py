"""Offline-to-online (``--warm-start.run DIR``): an online run that starts from a finished offline run.

The online algorithm (``train.config.WARM_STARTS``: TD3 from TD3+BC, online IQL from IQL, online CQL from CQL) has
the offline one's networks under the same names, so the offline run's final model (``model.safetensors``, every
network: actor, critics and targets) loads into it whole. IQL and CQL trained online are the offline algorithm
itself (``algos/offline_online.py``), so they continue its whole training state, read from the offline run's final
checkpoint: optimizer moments, CQL's temperature, the update count. Then the replay buffer receives every
transition of the offline run's datasets (``--data.dataset`` and ``--data.mix``, verified and checked against the
env's spaces, as the offline run did), in one shuffled pass. The config was checked before anything was built
(``TrainConfig.check_warm_start``). A resumed run restores its own weights and replay from its checkpoint over these.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from pickaxe.algos.sac import REPLAY_KEYS
from pickaxe.errors import PickaxeError
from pickaxe.offline.dataset import check_fits, read_mixed
from pickaxe.offline.sampler import DatasetSampler
from pickaxe.runs.checkpoint import load_checkpoint
from pickaxe.runs.model import load_model
from pickaxe.train.config import OnlineStartConfig


def load_offline_training_state(algo: Any, run: Path, device: torch.device) -> int:
    """Load the final checkpoint of ``run`` (its step must be the final model's) into ``algo.load_offline_state``;
    returns that step. A checkpoint of another step is a one-line ``PickaxeError``."""
    state, info = load_checkpoint(run, device)
    model_step = json.loads((run / "model.json").read_text()).get("step")
    if info.step != model_step:
        raise PickaxeError(
            f"--warm-start.run {run}: its newest good checkpoint is of env step {info.step}, its final model of step "
            f"{model_step}; `pickaxe resume` it to finish, or give another run"
        )
    algo.load_offline_state(state["algo"])
    return info.step


def start_from_offline(
    algo: Any, warm: OnlineStartConfig, envs: Any, env_id: str, device: torch.device, seed: int
) -> int:
    """Load ``warm.run``'s final weights into ``algo.networks()`` (and, for an algorithm that continues the offline
    one's training, its optimizer state and the rest) and (``warm.seed_replay``) put its datasets' transitions in
    ``algo.buffer``, shuffled with ``seed``; return how many transitions went in."""
    assert warm.run is not None
    run = Path(warm.run)
    load_model(run, algo.networks(), device, checkpoint="final")
    if hasattr(algo, "load_offline_state"):
        load_offline_training_state(algo, run, device)
    if not warm.seed_replay:
        return 0
    data = json.loads((run / "config.json").read_text())["data"]
    paths = [data["dataset"], *data.get("mix", [])]
    for path in paths:
        check_fits(path, envs.single_observation_space, envs.single_action_space, env_id)
    transitions = read_mixed(paths)
    sampler = DatasetSampler(transitions, len(transitions), seed, device)
    algo.buffer.extend(sampler.collect().select(*REPLAY_KEYS))
    return len(transitions)
