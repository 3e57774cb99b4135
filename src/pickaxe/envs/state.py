"""Capturing and restoring an environment's full state, so a resumed run continues mid-episode exactly.

Supported exactly: gymnasium's classic-control and toy-text envs and ``pickaxe/PointGoal-v0`` (their dynamics state
is a handful of plain attributes), MuJoCo envs (``mj_getState`` with the full integration state) and ALE/Atari envs
(``cloneState(include_rng=True)``, serialized to bytes: emulator, RAM and sticky-action RNG), each through its
wrappers (the Atari stack's max-pool buffers, life counters and frame-stack deque are wrapper attributes and are
captured with them; the no-op count comes from the env's RNG, captured too). For every other
env the capture reports ``deterministic``: a resumed run restarts its episodes from a seed derived from
the run seed and the checkpoint step, so resuming the same checkpoint always gives the same numbers,
but not the numbers of an uninterrupted run.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Literal

import gymnasium as gym
import numpy as np

Support = Literal["exact", "deterministic"]
_PLAIN = (bool, int, float, str, type(None), np.ndarray, np.generic)
_CLASSIC_MODULES = ("gymnasium.envs.classic_control", "gymnasium.envs.toy_text", "pickaxe.envs.goals")
# attributes that are configuration or rendering, never dynamics
_SKIP = {"render_mode", "screen", "clock", "isopen", "spec", "metadata", "_saved_kwargs", "_cached_spec"}
_DEQUE = "deque:"


def _is_mujoco(env: gym.Env) -> bool:
    return hasattr(env, "model") and hasattr(env, "data") and type(env).__module__.startswith("gymnasium.envs.mujoco")


def _is_ale(env: gym.Env) -> bool:
    return hasattr(env, "ale") and type(env).__module__.startswith("ale_py")


def state_support(env: gym.Env) -> Support:
    """Whether ``env``'s state can be captured exactly."""
    u = env.unwrapped
    if type(u).__module__.startswith(_CLASSIC_MODULES) or _is_mujoco(u) or _is_ale(u):
        return "exact"
    return "deterministic"


def _is_plain(v: Any) -> bool:
    if isinstance(v, tuple | list):
        return all(_is_plain(x) for x in v)
    return isinstance(v, _PLAIN)


def _copy(v: Any) -> Any:
    """A copy of plain data deep enough that later in-place writes (a wrapper's frame buffers) cannot reach it."""
    if isinstance(v, np.ndarray):
        return v.copy()
    if isinstance(v, list):
        return [_copy(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_copy(x) for x in v)
    return v


def _plain_attrs(obj: Any) -> dict[str, Any]:
    """Copies of an object's attributes that are plain data (numbers, arrays, lists and tuples of them); a deque of
    plain data (a frame stack's buffer) is kept as a list under ``"deque:" + name``."""
    out: dict[str, Any] = {}
    for k, v in vars(obj).items():
        if k in _SKIP:
            continue
        if isinstance(v, deque) and _is_plain(list(v)):
            out[_DEQUE + k] = _copy(list(v))
        elif _is_plain(v):
            out[k] = _copy(v)
    return out


def _set_plain_attrs(obj: Any, attrs: dict[str, Any]) -> None:
    """Restore what ``_plain_attrs`` returned (copies again, so the snapshot can be restored more than once)."""
    for k, v in attrs.items():
        if k.startswith(_DEQUE):
            name = k[len(_DEQUE) :]
            setattr(obj, name, deque(_copy(list(v)), maxlen=getattr(obj, name).maxlen))
        else:
            setattr(obj, k, _copy(v))


def get_env_state(env: gym.Env) -> dict[str, Any]:
    """Everything that decides the env's next steps: dynamics state, its RNG, wrapper counters."""
    u = env.unwrapped
    state: dict[str, Any] = {"rng": u.np_random.bit_generator.state, "wrappers": []}
    if _is_mujoco(u):
        import mujoco

        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        buf = np.empty(mujoco.mj_stateSize(u.model, spec), dtype=np.float64)
        mujoco.mj_getState(u.model, u.data, buf, spec)
        state["mujoco"] = buf
    if _is_ale(u):
        state["ale"] = bytes(u.ale.cloneState(include_rng=True).serialize())
    state["attrs"] = _plain_attrs(u)
    w = env
    while isinstance(w, gym.Wrapper):
        state["wrappers"].append(_plain_attrs(w))
        w = w.env
    return state


def set_env_state(env: gym.Env, state: dict[str, Any]) -> None:
    """Restore what ``get_env_state`` returned (on an env made the same way)."""
    u = env.unwrapped
    _set_plain_attrs(u, state["attrs"])
    if "mujoco" in state:
        import mujoco

        mujoco.mj_setState(u.model, u.data, np.asarray(state["mujoco"]), mujoco.mjtState.mjSTATE_INTEGRATION)
        mujoco.mj_forward(u.model, u.data)
    if "ale" in state:
        import ale_py

        u.ale.restoreState(ale_py.ALEState(bytes(state["ale"])))
    u.np_random.bit_generator.state = state["rng"]
    w, i = env, 0
    while isinstance(w, gym.Wrapper):
        _set_plain_attrs(w, state["wrappers"][i])
        w, i = w.env, i + 1


class Snapshot(gym.Wrapper):
    """Exposes ``pickaxe_state`` (read/write) so vector envs can capture sub-envs with ``get_attr``/``set_attr``.

    Works the same in-process and across subprocesses (``AsyncVectorEnv`` forwards attribute access).
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        # The hot path skips this layer: stepping calls the wrapped env's bound methods directly.
        self.step = env.step  # type: ignore[method-assign]
        self.reset = env.reset  # type: ignore[method-assign]

    @property
    def pickaxe_state_support(self) -> Support:
        """``exact`` or ``deterministic``."""
        return state_support(self.env)

    @property
    def pickaxe_state(self) -> dict[str, Any] | None:
        """The wrapped env's state, or None when it cannot be captured exactly."""
        return get_env_state(self.env) if state_support(self.env) == "exact" else None

    @pickaxe_state.setter
    def pickaxe_state(self, state: dict[str, Any]) -> None:
        set_env_state(self.env, state)
