"""Hindsight experience replay (Andrychowicz et al. 2017): a replay of whole episodes per env whose samples have their
desired goal replaced, ``k`` times in ``k + 1``, by a goal the same episode achieved, and their reward recomputed by
the env's own ``compute_reward`` for that goal.

Goal observations reach the replay flat (``pickaxe.envs.spaces.GoalObservation``): ``[observation, desired_goal,
achieved_goal]``, whose widths a ``GoalLayout`` records. Strategies, for a transition at step ``t`` of an episode
whose last step is ``e``: ``future``, the goal achieved after a step ``t'`` drawn uniformly from ``t..e`` (never an
earlier step, never another episode); ``final``, the goal achieved after step ``e``; ``episode``, after a step drawn
uniformly from the whole episode (as much of it as the ring still holds). Only transitions of finished episodes are
sampled (their last step must be known). Everything that decides a sample (storage, episode bounds, the episodes in
progress and the generator) is in ``state_dict``, so a resumed run draws the same relabelled batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from tensordict import TensorDict

from pickaxe.data.batch import Batch

Strategy = Literal["future", "final", "episode"]
STRATEGIES: tuple[str, ...] = ("future", "final", "episode")
"""The relabelling strategies (``none`` in a config means no hindsight replay)."""
HINDSIGHT_KEYS = ("obs", "action", "reward", "terminated", "truncated", "next_obs")
"""What the hindsight replay reads of a collected ``[T, N]`` batch (truncation ends an episode too)."""
GoalFunction = Callable[[np.ndarray, np.ndarray, Any], Any]
"""An env's ``compute_reward`` / ``compute_terminated``: ``(achieved_goal [B, G], desired_goal [B, G], info)``."""


@dataclass(frozen=True)
class GoalLayout:
    """Where the parts of a flat goal observation sit: ``observation`` features, then the desired goal, then the
    achieved goal (``goal`` features each)."""

    observation: int
    goal: int

    @property
    def desired(self) -> slice:
        """The desired goal's features."""
        return slice(self.observation, self.observation + self.goal)

    @property
    def achieved(self) -> slice:
        """The achieved goal's features."""
        return slice(self.observation + self.goal, self.observation + 2 * self.goal)

    @property
    def policy_features(self) -> int:
        """What the networks read: the observation and the desired goal (the leading features)."""
        return self.observation + self.goal

    @property
    def size(self) -> int:
        """Features of the whole flat observation."""
        return self.observation + 2 * self.goal


def goal_steps(strategy: str, t: torch.Tensor, start: torch.Tensor, end: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The step whose achieved goal relabels each transition at step ``t`` of an episode spanning ``start..end``
    (inclusive, absolute steps), from uniform draws ``u`` in [0, 1): ``future`` in ``t..end``, ``final`` ``end``,
    ``episode`` in ``start..end``."""
    if strategy == "future":
        return t + (u * (end - t + 1)).long().clamp_max(end - t)
    if strategy == "final":
        return end.clone()
    if strategy == "episode":
        return start + (u * (end - start + 1)).long().clamp_max(end - start)
    raise ValueError(f"unknown hindsight strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")


def relabel_mask(n: int, k: int) -> torch.Tensor:
    """Which of ``n`` sampled transitions get a hindsight goal: all but every ``(k + 1)``-th, so ``k`` relabelled
    per original in every stretch of ``k + 1`` (the samples are drawn independently, so the positions are
    arbitrary)."""
    return torch.arange(n) % (k + 1) != 0


class HindsightReplay:
    """A ring of ``capacity // num_envs`` steps of ``num_envs`` envs with their episode bounds, sampled uniformly
    over the transitions of finished episodes, ``k`` in ``k + 1`` relabelled by ``strategy`` (module docstring).

    ``compute_reward`` (and ``compute_terminated``, when the env defines one) are the env's own, called vectorised
    on the achieved goal of the transition's next observation and the new goal (``info``: an empty dict per row; the
    replay keeps no infos). Without ``compute_terminated`` a relabelled transition keeps its own ``terminated``.
    Storage lives on the CPU (the reward function is numpy); samples go to ``device``.
    """

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        layout: GoalLayout,
        compute_reward: GoalFunction,
        compute_terminated: GoalFunction | None = None,
        strategy: str = "future",
        k: int = 4,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown hindsight strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
        if k < 0:
            raise ValueError(f"hindsight relabels per transition must be >= 0, got {k}")
        self.rows = max(capacity // num_envs, 1)
        self.num_envs, self.layout, self.strategy, self.k = num_envs, layout, strategy, k
        self.compute_reward, self.compute_terminated = compute_reward, compute_terminated
        self.device = torch.device(device)
        self.generator = torch.Generator().manual_seed(seed)
        self.storage: dict[str, torch.Tensor] | None = None
        self.step_of_row = torch.full((self.rows,), -1, dtype=torch.long)  # absolute step each row holds
        self.ep_start = torch.zeros(self.rows, num_envs, dtype=torch.long)  # absolute step its episode began
        self.ep_end = torch.full((self.rows, num_envs), -1, dtype=torch.long)  # its last step; -1: unfinished
        self.open_start = torch.zeros(num_envs, dtype=torch.long)  # first step of each env's episode in progress
        self.steps = 0  # steps written per env so far

    def __len__(self) -> int:
        """Transitions that can be sampled (those of finished episodes still held)."""
        return int((self.ep_end >= 0).sum())

    def extend(self, batch: Batch) -> None:
        """Append a time-major ``[T, num_envs]`` batch (the collector's), closing the episodes that end in it."""
        if batch.batch_dims != 2 or batch.batch_size[1] != self.num_envs:
            raise ValueError(
                f"hindsight replay takes [T, {self.num_envs}] batches of the collector, got {tuple(batch.batch_size)}"
            )
        data = {k: batch[k].cpu() for k in HINDSIGHT_KEYS if k != "truncated"}
        done = (batch["terminated"] | batch["truncated"]).cpu()
        if self.storage is None:
            self.storage = {k: v.new_zeros((self.rows, *v.shape[1:])) for k, v in data.items()}
        for t in range(batch.batch_size[0]):
            step, row = self.steps, self.steps % self.rows
            for k, v in data.items():
                self.storage[k][row] = v[t]
            self.step_of_row[row] = step
            self.ep_start[row] = self.open_start
            self.ep_end[row] = -1
            for n in torch.nonzero(done[t]).flatten().tolist():
                first = max(int(self.open_start[n]), step - self.rows + 1)  # older steps are overwritten
                rows = torch.arange(first, step + 1) % self.rows
                self.ep_end[rows, n] = step
                self.open_start[n] = step + 1
            self.steps += 1

    def sample(self, n: int) -> Batch:
        """``n`` transitions drawn uniformly with replacement from finished episodes, relabelled as configured."""
        if self.storage is None or len(self) == 0:
            raise RuntimeError("cannot sample from a hindsight replay without a finished episode; extend it first")
        valid = torch.nonzero((self.ep_end >= 0).flatten()).flatten()
        flat = valid[torch.randint(len(valid), (n,), generator=self.generator)]
        row, env = flat // self.num_envs, flat % self.num_envs
        out = {k: v[row, env] for k, v in self.storage.items()}
        relabel = relabel_mask(n, self.k)
        u = torch.rand(n, generator=self.generator, dtype=torch.float64)
        if relabel.any():
            self._relabel(out, row[relabel], env[relabel], u[relabel], relabel)
        return TensorDict(out, batch_size=[n]).to(self.device)

    def _relabel(
        self, out: dict[str, torch.Tensor], row: torch.Tensor, env: torch.Tensor, u: torch.Tensor, mask: torch.Tensor
    ) -> None:
        """Put hindsight goals into the ``mask`` rows of ``out`` (their replay ``row`` and ``env``)."""
        assert self.storage is not None
        lay = self.layout
        t, end = self.step_of_row[row], self.ep_end[row, env]
        start = torch.clamp(self.ep_start[row, env], min=self.steps - self.rows)
        goal_rows = goal_steps(self.strategy, t, start, end, u) % self.rows
        goals = self.storage["next_obs"][goal_rows, env, lay.achieved]
        out["obs"][mask, lay.desired] = goals
        out["next_obs"][mask, lay.desired] = goals
        achieved = out["next_obs"][mask, lay.achieved].numpy()
        desired = goals.numpy()
        infos = np.array([{} for _ in range(len(goals))], dtype=object)
        reward = np.asarray(self.compute_reward(achieved, desired, infos), dtype=np.float64).reshape(-1)
        out["reward"][mask] = torch.as_tensor(reward, dtype=out["reward"].dtype)
        if self.compute_terminated is not None:
            term = self.compute_terminated(achieved, desired, infos)
            if np.shape(term) != (len(goals),):  # a function of one goal pair (PointMaze's): row by row
                term = [self.compute_terminated(a, d, {}) for a, d in zip(achieved, desired, strict=True)]
            out["terminated"][mask] = torch.as_tensor(np.asarray(term, dtype=bool))

    def state_dict(self) -> dict[str, Any]:
        """Storage, episode bounds, the episodes in progress, the write count and the sampling RNG."""
        held = min(self.steps, self.rows)
        storage = None if self.storage is None else {k: v[:held].clone() for k, v in self.storage.items()}
        return {
            "storage": storage,
            "step_of_row": self.step_of_row[:held].clone(),
            "ep_start": self.ep_start[:held].clone(),
            "ep_end": self.ep_end[:held].clone(),
            "open_start": self.open_start.clone(),
            "steps": self.steps,
            "rng": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.steps = int(state["steps"])
        held = min(self.steps, self.rows)
        if state["storage"] is not None:
            self.storage = {}
            for k, v in state["storage"].items():
                v = torch.as_tensor(v)
                self.storage[k] = v.new_zeros((self.rows, *v.shape[1:]))
                self.storage[k][:held] = v
        self.step_of_row.fill_(-1)
        self.ep_end.fill_(-1)
        self.ep_start.zero_()
        self.step_of_row[:held] = torch.as_tensor(state["step_of_row"])
        self.ep_start[:held] = torch.as_tensor(state["ep_start"])
        self.ep_end[:held] = torch.as_tensor(state["ep_end"])
        self.open_start = torch.as_tensor(state["open_start"]).clone()
        self.generator.set_state(torch.as_tensor(state["rng"]))
