"""A dataset as the Trainer's source of Batches: ``DatasetSampler.collect()`` returns the next ``steps`` transitions
of a shuffled pass over the dataset (each transition once per epoch), with the Collector's keys (``obs, action,
reward, terminated, truncated, next_obs``), so any algorithm's ``update(batch)`` takes them.

Its state (the epoch, the position in it and the RNG state the epoch's permutation was drawn from) is in every
checkpoint, so a killed offline run resumes to the same batches: the permutation is drawn again from that state.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np
import torch

from pickaxe.data.batch import Batch
from pickaxe.offline.dataset import KEYS, Transitions


class DatasetSampler:
    """Shuffled minibatch stream over ``transitions`` (``steps`` per ``collect``), seeded by ``seed``.

    It stands where the Collector stands in the loop: ``collect``, ``metrics``, ``state_dict`` /
    ``load_state_dict``, ``state_support``; ``single_observation_space`` / ``single_action_space`` size the
    networks as an env's would."""

    def __init__(self, transitions: Transitions, steps: int, seed: int, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.steps = steps
        self.size = len(transitions)
        # observation_space/action_space too: networks are sized from it as from one env (models.mlp.single_spaces)
        self.single_observation_space = self.observation_space = transitions.observation_space
        self.single_action_space = self.action_space = transitions.action_space
        self.episode_returns = transitions.episode_returns
        arrays = dict(transitions.arrays)
        action = arrays["action"]
        arrays["action"] = action.astype(np.float32 if np.issubdtype(action.dtype, np.floating) else np.int64)
        digest = hashlib.sha256()
        for k in KEYS:
            digest.update(np.ascontiguousarray(arrays[k]).tobytes())
        self.fingerprint = digest.hexdigest()
        """sha256 of the transitions: a checkpoint of a run on other data is refused on resume."""
        self.data = {k: torch.as_tensor(np.ascontiguousarray(arrays[k])).to(self.device) for k in KEYS}
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.epoch = 0
        self.pos = 0
        self._new_epoch()
        self.steps_per_s = 0.0

    def _new_epoch(self) -> None:
        """Draw the next epoch's permutation, remembering the RNG state it came from (what a checkpoint keeps)."""
        self._epoch_rng = self.rng.bit_generator.state
        self.perm = torch.as_tensor(self.rng.permutation(self.size)).to(self.device)

    def collect(self, steps: int | None = None) -> Batch:
        """The next ``steps`` transitions of the stream, a 1-D Batch."""
        start = time.perf_counter()
        n = self.steps if steps is None else steps
        chunks, left = [], n
        while left > 0:
            if self.pos >= self.size:
                self.epoch += 1
                self.pos = 0
                self._new_epoch()
            take = min(left, self.size - self.pos)
            chunks.append(self.perm[self.pos : self.pos + take])
            self.pos += take
            left -= take
        idx = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
        batch = Batch({k: v[idx] for k, v in self.data.items()}, batch_size=[n], device=self.device)
        self.steps_per_s = n / max(time.perf_counter() - start, 1e-9)
        return batch

    def metrics(self) -> dict[str, float]:
        """Where the stream is: epochs over the dataset so far."""
        return {"offline/epoch": self.epoch + self.pos / self.size, "time/collect_steps_per_s": self.steps_per_s}

    def state_dict(self) -> dict[str, Any]:
        """The epoch, the position in it and the RNG state its permutation was drawn from."""
        return {
            "epoch": self.epoch,
            "pos": self.pos,
            "epoch_rng": self._epoch_rng,
            "size": self.size,
            "fingerprint": self.fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any], reseed: int | None = None) -> None:
        """Restore ``state_dict()`` (``reseed`` is unused: the stream is exact). The state of a run on other data
        (another size or sha256 of the transitions: the dataset changed since) is refused with ``ValueError``."""
        if int(state["size"]) != self.size or state.get("fingerprint") != self.fingerprint:
            raise ValueError(
                f"the checkpoint's dataset ({state['size']} transitions, sha256 {str(state.get('fingerprint'))[:12]}) "
                f"is not the one given now ({self.size}, {self.fingerprint[:12]}): the dataset changed since"
            )
        self.rng.bit_generator.state = state["epoch_rng"]
        self._new_epoch()
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])

    def state_support(self) -> str:
        """Always ``exact``: the stream's position and RNG are the whole state."""
        return "exact"
