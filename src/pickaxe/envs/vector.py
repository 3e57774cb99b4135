"""Numpy-vectorised env backends: one array operation steps every copy (``vectorization="vector"``), and EnvPool
(``vectorization="envpool"``) where ``pip install envpool`` works; ``vectorization="auto"`` picks ``vector``
where it has the env and ``sync`` otherwise.

Both present gymnasium's ``VectorEnv`` interface with ``SAME_STEP`` autoreset (the final observation in
``info["final_obs"]``), as ``pickaxe.envs.make`` promises for ``sync``, and answer ``get_attr("pickaxe_state")`` /
``set_attr("pickaxe_state", ...)`` as the collector's checkpoints expect.

``vector`` is pickaxe's own numpy implementation, not gymnasium's ``vector_entry_point`` envs: gymnasium's
``CartPoleVectorEnv`` autoresets one step late (``NEXT_STEP``, a zero-reward reset step), ignores
``reset_mask`` and draws every copy from one generator. Here each copy keeps its own generator seeded
``seed + i`` and the dynamics are gymnasium's float64 arithmetic in the same order, so a ``vector`` env gives
bit-identical observations, rewards and episode ends to ``sync`` (tests/test_vector_envs.py checks it), and its
state (dynamics arrays, step counters, every generator) is captured exactly for resume.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from pickaxe.errors import PickaxeError


class VectorBackendError(PickaxeError, ValueError):
    """A user-facing problem choosing a vector backend (no numpy implementation, EnvPool missing)."""


class NumpyCartPole(VectorEnv):
    """``n`` copies of gymnasium's CartPole stepped with numpy arrays; same numbers as ``gym.make("CartPole-v1")``.

    Sub-env ``i`` draws its start states from its own generator (``reset(seed=s)`` seeds it with ``s + i``),
    episodes end at the pole/cart thresholds (terminated) or after ``max_episode_steps`` (truncated), and a
    finished copy is reset in the same step (``SAME_STEP``).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": [], "autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int, max_episode_steps: int = 500) -> None:
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps
        self.render_mode = None
        self.gravity, self.masscart, self.masspole = 9.8, 1.0, 0.1
        self.total_mass = self.masspole + self.masscart
        self.length = 0.5
        self.polemass_length = self.masspole * self.length
        self.force_mag, self.tau = 10.0, 0.02
        self._forces = np.array([-self.force_mag, self.force_mag])
        self.theta_threshold_radians = 12 * 2 * math.pi / 360
        self.x_threshold = 2.4
        high = np.array([self.x_threshold * 2, np.inf, self.theta_threshold_radians * 2, np.inf], dtype=np.float32)
        self.single_observation_space = gym.spaces.Box(-high, high, dtype=np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.state = np.zeros((4, num_envs))
        self.elapsed = np.zeros(num_envs, dtype=np.int64)
        self.rngs: list[np.random.Generator | None] = [None] * num_envs

    def _draw(self, i: int) -> None:
        rng = self.rngs[i]
        if rng is None:  # gymnasium seeds an unseeded env from OS entropy on its first reset
            rng = self.rngs[i] = seeding.np_random()[0]
        self.state[:, i] = rng.uniform(low=-0.05, high=0.05, size=(4,))
        self.elapsed[i] = 0

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every copy (or those in ``options["reset_mask"]``); an int ``seed`` seeds copy ``i`` with
        ``seed + i``, a list one seed each, None continues each copy's generator."""
        if isinstance(seed, int):
            seed = [seed + i for i in range(self.num_envs)]
        seeds = seed if seed is not None else [None] * self.num_envs
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset needs one seed per sub-env ({self.num_envs}), got {len(seeds)}")
        mask = (options or {}).get("reset_mask")
        for i in range(self.num_envs):
            if mask is not None and not mask[i]:
                continue
            if seeds[i] is not None:
                self.rngs[i] = seeding.np_random(seeds[i])[0]
            self._draw(i)
        return self.state.T.astype(np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One step of every copy; finished copies are reset and their last observation is in ``info``."""
        x, x_dot, theta, theta_dot = self.state  # row views: the updates below write into the state in place
        force = self._forces[(np.asarray(action) == 1).view(np.uint8)]  # -force_mag, or force_mag where 1
        costheta = np.cos(theta)
        sintheta = np.sin(theta)
        # the operation order of gymnasium's CartPoleEnv.step, so every float64 result is the same
        temp = (force + self.polemass_length * np.square(theta_dot) * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * np.square(costheta) / self.total_mass)
        )
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        dx, dtheta = self.tau * x_dot, self.tau * theta_dot  # from the old velocities, as gymnasium's Euler step
        x_dot += self.tau * xacc
        theta_dot += self.tau * thetaacc
        x += dx
        theta += dtheta
        # |v| > t is v < -t or v > t, in two fewer array operations
        terminated = (np.abs(x) > self.x_threshold) | (np.abs(theta) > self.theta_threshold_radians)
        self.elapsed += 1
        truncated = self.elapsed >= self.max_episode_steps
        obs = self.state.T.astype(np.float32)
        reward = np.ones(self.num_envs)
        done = terminated | truncated
        info: dict[str, Any] = {}
        if np.count_nonzero(done):  # ndarray.any() costs several times more on a few envs
            final = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):
                final[i] = obs[i].copy()
                self._draw(int(i))
                obs[i] = self.state[:, i].astype(np.float32)
            info = {"final_obs": final, "_final_obs": done.copy(), "final_info": {}, "_final_info": done.copy()}
        return obs, reward, terminated, truncated, info

    @property
    def pickaxe_state(self) -> list[dict[str, Any]]:
        """One state per copy: its dynamics column, step counter and generator."""
        return [
            {
                "state": self.state[:, i].copy(),
                "elapsed": int(self.elapsed[i]),
                "rng": None if rng is None else rng.bit_generator.state,
            }
            for i, rng in enumerate(self.rngs)
        ]

    @pickaxe_state.setter
    def pickaxe_state(self, states: list[dict[str, Any]]) -> None:
        if len(states) != self.num_envs:
            raise ValueError(f"need one env state per sub-env ({self.num_envs}), got {len(states)}")
        for i, s in enumerate(states):
            self.state[:, i] = s["state"]
            self.elapsed[i] = s["elapsed"]
            if s["rng"] is None:
                self.rngs[i] = None
            else:
                rng = self.rngs[i] = np.random.Generator(np.random.PCG64())
                rng.bit_generator.state = s["rng"]

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """One value per copy, as ``SyncVectorEnv.get_attr`` (``pickaxe_state``: each copy's own state)."""
        if name == "pickaxe_state":
            return tuple(self.pickaxe_state)
        if name == "pickaxe_state_support":
            return ("exact",) * self.num_envs
        return (getattr(self, name),) * self.num_envs

    def set_attr(self, name: str, values: Any) -> None:
        """``pickaxe_state`` takes one state per copy; other names set one shared attribute."""
        if name == "pickaxe_state":
            self.pickaxe_state = list(values)
        else:
            setattr(self, name, values)


class EnvPoolVectorEnv(VectorEnv):
    """An EnvPool pool behind gymnasium's ``VectorEnv`` interface with ``SAME_STEP`` autoreset.

    EnvPool resets a finished copy on the step after it ends (a step whose action is ignored); here the
    finished copies are reset at once through ``reset(env_ids)``, so every returned step is a real transition.
    EnvPool cannot capture or re-seed a running pool: ``reset(seed=s)`` builds a new pool seeded ``s``, and
    resume is ``deterministic`` (episodes restart from a seed derived from the checkpoint), not exact.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": [], "autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, env_id: str, num_envs: int, seed: int, **env_kwargs: Any) -> None:
        import envpool

        self._envpool, self._env_id, self._kwargs = envpool, env_id, env_kwargs
        self.num_envs = num_envs
        self.render_mode = None
        self._pool_seed = seed
        self._pool = envpool.make_gymnasium(env_id, num_envs=num_envs, seed=_int32(seed), **env_kwargs)
        self._fresh = True  # built with _pool_seed and not reset yet: reset(seed=_pool_seed) needs no rebuild
        self.single_observation_space = self._pool.observation_space
        self.single_action_space = self._pool.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every copy or those in ``options["reset_mask"]``; an int seed starts a new pool from that seed."""
        if isinstance(seed, list):
            raise VectorBackendError("envpool takes one int seed for the whole pool; fix: pass reset(seed=int)")
        if seed is not None and not (self._fresh and seed == self._pool_seed):
            self._pool.close()
            self._pool = self._envpool.make_gymnasium(
                self._env_id, num_envs=self.num_envs, seed=_int32(seed), **self._kwargs
            )
            self._pool_seed = seed
        self._fresh = False
        mask = (options or {}).get("reset_mask")
        if mask is None:
            obs, _ = self._pool.reset()
            self._obs = np.asarray(obs)
        else:
            ids = np.flatnonzero(mask).astype(np.int32)
            if len(ids):
                self._obs[ids] = self._pool.reset(ids)[0]
        return self._obs.copy(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One step of every copy; finished copies are reset at once and their last observation is in ``info``."""
        obs, reward, terminated, truncated, _ = self._pool.step(np.asarray(action))
        obs = np.array(obs)
        done = np.logical_or(terminated, truncated)
        info: dict[str, Any] = {}
        if done.any():
            ids = np.flatnonzero(done)
            final = np.full(self.num_envs, None, dtype=object)
            for i in ids:
                final[i] = obs[i].copy()
            obs[ids] = self._pool.reset(ids.astype(np.int32))[0]
            info = {"final_obs": final, "_final_obs": done.copy(), "final_info": {}, "_final_info": done.copy()}
        self._obs = obs
        return obs.copy(), np.asarray(reward), np.asarray(terminated), np.asarray(truncated), info

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """One value per copy; ``pickaxe_state_support`` is ``deterministic`` (EnvPool has no state capture)."""
        if name == "pickaxe_state_support":
            return ("deterministic",) * self.num_envs
        if name == "pickaxe_state":
            return (None,) * self.num_envs
        return (getattr(self, name),) * self.num_envs

    def set_attr(self, name: str, values: Any) -> None:
        """Set a shared attribute (env states cannot be restored into EnvPool)."""
        if name == "pickaxe_state":
            raise VectorBackendError("envpool envs cannot restore a captured state; resume is deterministic")
        setattr(self, name, values)

    def close_extras(self, **kwargs: Any) -> None:
        """Close the pool."""
        self._pool.close()


NUMPY_ENVS: dict[str, tuple[type[NumpyCartPole], dict[str, Any]]] = {
    "CartPole-v0": (NumpyCartPole, {"max_episode_steps": 200}),
    "CartPole-v1": (NumpyCartPole, {"max_episode_steps": 500}),
}
"""Env id -> (numpy implementation, its constructor defaults); the ids ``vectorization="vector"`` serves."""


def numpy_vector_fits(env_id: str, env_kwargs: dict[str, Any]) -> bool:
    """Whether ``vectorization="vector"`` can make ``env_id`` with these constructor arguments."""
    return env_id in NUMPY_ENVS and set(env_kwargs) <= set(NUMPY_ENVS[env_id][1])


def make_numpy_vector(env_id: str, n: int, **env_kwargs: Any) -> VectorEnv:
    """The numpy-vectorised ``env_id`` (``NUMPY_ENVS``) with ``n`` copies; only ``max_episode_steps`` is taken."""
    if env_id not in NUMPY_ENVS:
        raise VectorBackendError(
            f"no numpy-vectorised implementation of {env_id!r} (have: {', '.join(NUMPY_ENVS)}); "
            "fix: --env.vectorization sync"
        )
    cls, defaults = NUMPY_ENVS[env_id]
    unknown = set(env_kwargs) - set(defaults)
    if unknown:
        raise VectorBackendError(
            f"the numpy-vectorised {env_id!r} takes only {sorted(defaults)}, not {sorted(unknown)}; "
            "fix: --env.vectorization sync"
        )
    env = cls(n, **{**defaults, **env_kwargs})
    env.spec = gym.spec(env_id)
    return env


def _int32(seed: int) -> int:
    """EnvPool takes int32 seeds; pickaxe's derived seeds are any non-negative int (folded, not refused)."""
    return seed % 2**31


def make_envpool(env_id: str, n: int, seed: int, **env_kwargs: Any) -> VectorEnv:
    """``n`` copies of ``env_id`` in an EnvPool pool; a clear error when EnvPool or the id is missing."""
    try:
        import envpool
    except ImportError:
        raise VectorBackendError(
            "vectorization 'envpool' needs EnvPool; fix: pip install envpool (or --env.vectorization sync)"
        ) from None
    if env_id not in envpool.list_all_envs():
        raise VectorBackendError(
            f"EnvPool has no environment {env_id!r}; fix: --env.vectorization sync (see envpool.list_all_envs())"
        )
    return EnvPoolVectorEnv(env_id, n, seed, **env_kwargs)
