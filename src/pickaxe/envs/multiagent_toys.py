"""Tiny cooperative PettingZoo parallel envs for tests and examples: ``pickaxe.envs.multiagent_toys:CoopGuess``
(Discrete actions) and ``pickaxe.envs.multiagent_toys:CoopReach`` (Box actions).

Their state is captured exactly (``pickaxe_state``), so a multi-agent run on them resumes bit for bit.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv


class TeamToy(ParallelEnv):
    """What both toys share: ``agents`` agents see a target (drawn every step by ``_draw``) and the fraction of the
    episode left, are rewarded as a team (``_reward``), are truncated after ``length`` steps, and with ``leave_at``
    the last agent terminates after that many steps (it leaves mid-episode). ``state()`` is the observation and who
    is alive; ``pickaxe_state`` captures everything that decides the next numbers."""

    target: Any

    def __init__(self, agents: int, length: int, leave_at: int | None, obs: spaces.Box, act: spaces.Space) -> None:
        self.possible_agents = [f"agent_{i}" for i in range(agents)]
        self.agents: list[str] = []
        self.length, self.leave_at = length, leave_at
        self._obs_space, self._act_space = obs, act
        low, high = float(obs.low.min()), float(obs.high.max())
        self.state_space = spaces.Box(low, high, (obs.shape[0] + agents,), np.float32)
        self.np_random, _ = seeding.np_random(None)
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Space:
        """The target and the fraction of the episode left."""
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        """What each agent names."""
        return self._act_space

    def _obs(self) -> np.ndarray:
        raise NotImplementedError

    def _draw(self) -> None:
        raise NotImplementedError

    def _reward(self, actions: dict[str, Any]) -> float:
        raise NotImplementedError

    def state(self) -> np.ndarray:
        """The observation and who is alive."""
        alive = np.array([a in self.agents for a in self.possible_agents], dtype=np.float32)
        return np.concatenate([self._obs(), alive])

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """A new episode (``seed`` re-seeds the target generator)."""
        if seed is not None:
            self.np_random, _ = seeding.np_random(seed)
        self.agents = self.possible_agents[:]
        self.t = 0
        self._draw()
        return {a: self._obs() for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Reward the alive agents, draw the next target, drop agents that terminate or are truncated."""
        team = self._reward(actions)
        rewards = {a: team for a in self.agents}
        self.t += 1
        self._draw()
        truncated = {a: self.t >= self.length for a in self.agents}
        leaver = self.possible_agents[-1]
        terminated = {a: a == leaver and self.leave_at is not None and self.t >= self.leave_at for a in self.agents}
        obs = {a: self._obs() for a in self.agents}
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not (terminated[a] or truncated[a])]
        return obs, rewards, terminated, truncated, infos

    @property
    def pickaxe_state(self) -> dict[str, Any]:
        """Everything that decides the env's next numbers (for checkpoints)."""
        target = self.target.tolist() if isinstance(self.target, np.ndarray) else self.target
        return {"agents": list(self.agents), "t": self.t, "target": target, "rng": self.np_random.bit_generator.state}

    @pickaxe_state.setter
    def pickaxe_state(self, state: dict[str, Any]) -> None:
        self.agents = [str(a) for a in state["agents"]]
        self.t = int(state["t"])
        self.target = self._target_from(state["target"])
        self.np_random.bit_generator.state = state["rng"]

    def _target_from(self, saved: Any) -> Any:
        raise NotImplementedError


class CoopGuess(TeamToy):
    """Every step a target in ``0..targets-1`` is drawn and shown to every agent (one-hot, with the time left); each
    alive agent is rewarded 1 when every alive agent names the target, else 0. ``length`` steps per episode (every
    agent truncated at the end); with ``leave_at`` the last agent terminates after that many steps (it leaves
    mid-episode). An untrained policy is rewarded ``targets ** -agents`` per step, a trained one 1. ``state()`` is the
    target, the time and who is alive."""

    metadata: ClassVar[dict[str, Any]] = {"name": "coop_guess_v0", "render_modes": []}

    def __init__(self, agents: int = 2, targets: int = 3, length: int = 4, leave_at: int | None = None) -> None:
        obs = spaces.Box(0.0, 1.0, (targets + 1,), np.float32)
        super().__init__(agents, length, leave_at, obs, spaces.Discrete(targets))
        self.targets = targets
        self.target = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.targets + 1, dtype=np.float32)
        obs[self.target] = 1.0
        obs[-1] = 1.0 - self.t / self.length
        return obs

    def _draw(self) -> None:
        self.target = int(self.np_random.integers(self.targets))

    def _reward(self, actions: dict[str, Any]) -> float:
        return float(all(int(actions[a]) == self.target for a in self.agents))

    def _target_from(self, saved: Any) -> Any:
        return int(saved)


class CoopReach(TeamToy):
    """Every step a target point in ``[-1, 1]^dims`` is drawn and shown to every agent (with the time left); each
    alive agent names a point (``Box(-bound, bound, (dims,))``) and every alive agent is rewarded minus the mean, over
    the alive agents, of their squared distance to the target (a team reward). ``length`` steps per episode (every
    agent truncated at the end); with ``leave_at`` the last agent terminates after that many steps. An untrained
    policy (every action about 0) is rewarded about ``-dims / 3`` per agent-step, a trained one 0. ``state()`` is the
    target, the time and who is alive.

    The bounds sit wide of the targets (``bound`` 3) on purpose: with bounds at the targets' own ``[-1, 1]``, clipping
    a wide Gaussian's samples rewards a mean pushed past the target towards the bound (the clipped samples land
    nearer), and a greedy policy that acts with the mean overshoots (measured: eval return back down to -1.5 after
    reaching -0.3)."""

    metadata: ClassVar[dict[str, Any]] = {"name": "coop_reach_v0", "render_modes": []}

    def __init__(
        self, agents: int = 2, dims: int = 2, length: int = 4, leave_at: int | None = None, bound: float = 3.0
    ) -> None:
        obs = spaces.Box(-1.0, 1.0, (dims + 1,), np.float32)
        super().__init__(agents, length, leave_at, obs, spaces.Box(-bound, bound, (dims,), np.float32))
        self.dims = dims
        self.target = np.zeros(dims, dtype=np.float32)

    def _obs(self) -> np.ndarray:
        return np.append(self.target, np.float32(1.0 - self.t / self.length)).astype(np.float32)

    def _draw(self) -> None:
        self.target = self.np_random.uniform(-1.0, 1.0, self.dims).astype(np.float32)

    def _reward(self, actions: dict[str, Any]) -> float:
        miss = [float(np.sum((np.asarray(actions[a], dtype=np.float64) - self.target) ** 2)) for a in self.agents]
        return -float(np.mean(miss))

    def _target_from(self, saved: Any) -> Any:
        return np.asarray(saved, dtype=np.float32)
