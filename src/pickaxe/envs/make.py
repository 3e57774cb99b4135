"""Gymnasium vector environments by id, seeded from the run seed."""

from __future__ import annotations

import difflib
import importlib
import re
from typing import Any, Literal

import gymnasium as gym
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper

from pickaxe.envs.atari import BASE_KWARGS, atari_wrapper, is_atari
from pickaxe.envs.spaces import GOAL_KEYS, GoalBox, SpaceError, adapt_observations, check_action_space
from pickaxe.envs.state import Snapshot
from pickaxe.errors import PickaxeError


class EnvError(PickaxeError, ValueError):
    """A user-facing problem with an environment id or its dependencies."""


class SeededVectorEnv(VectorWrapper):
    """A vector env that remembers its seed.

    The first ``reset()`` without a seed uses ``seed`` (sub-env ``i`` gets ``seed + i``); later resets
    continue each sub-env's own generator. Evaluation re-seeds with ``seed`` so every evaluation starts
    from the same states and is a pure function of the policy's weights.
    """

    def __init__(self, env: VectorEnv, seed: int) -> None:
        super().__init__(env)
        self.seed = seed
        self._seeded = False
        self.step = env.step  # type: ignore[method-assign]  # no wrapper frame on the hot path

    def reset(self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None):  # type: ignore[override]
        """Reset; the very first call defaults to the stored seed (actions spaces are seeded with it too)."""
        if seed is None and not self._seeded:
            seed = self.seed
            self.env.action_space.seed(self.seed)
        if seed is not None and not (options and "reset_mask" in options):
            self._seeded = True
        return self.env.reset(seed=seed, options=options)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """An attribute of every sub-env (gymnasium's ``VectorWrapper`` does not forward this)."""
        return self.env.get_attr(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set an attribute on every sub-env, one value each when ``values`` is a list or tuple."""
        self.env.set_attr(name, values)

    def mark_seeded(self) -> None:
        """Record that the envs are past their first reset (used when state is restored from a checkpoint)."""
        self._seeded = True


def split_env_id(env_id: str) -> tuple[str | None, str]:
    """``"my_pkg.envs:MyEnv-v0"`` -> ``("my_pkg.envs", "MyEnv-v0")``; a plain id -> ``(None, id)``.

    Gymnasium's ``module:EnvId`` form: importing the module registers the env (as ``gymnasium.make`` does).
    """
    module, sep, name = env_id.partition(":")
    return (module, name) if sep and module and "/" not in module else (None, env_id)


def _import_env_module(module: str, env_id: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as e:
        fix = (
            "pip install 'pickaxe[goals]'"
            if module == "gymnasium_robotics"
            else "install it or add its folder to PYTHONPATH"
        )
        raise EnvError(f"environment {env_id!r}: cannot import module {module!r} ({e}); fix: {fix}") from None


def check_env_id(env_id: str) -> None:
    """Raise ``EnvError`` naming the closest registered ids when ``env_id`` is unknown.

    ``module:EnvId`` imports ``module`` first, then looks ``EnvId`` up."""
    module, name = split_env_id(env_id)
    if module is not None:
        _import_env_module(module, env_id)
        if name in gym.registry:
            return
        close = difflib.get_close_matches(name, list(gym.registry), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise EnvError(f"module {module!r} registers no environment {name!r}{hint}")
    if env_id in gym.registry:
        return
    if env_id.startswith("ALE/"):  # Atari ids exist once ale-py registers them
        try:
            import ale_py

            gym.register_envs(ale_py)
        except ImportError:
            raise EnvError(f"environment {env_id!r} needs ale-py; fix: pip install 'pickaxe[atari]'") from None
        if env_id in gym.registry:
            return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else "; see gymnasium.pprint_registry()"
    raise EnvError(f"unknown environment id {env_id!r}{hint}")


def make(
    env_id: str,
    n: int = 1,
    seed: int = 0,
    vectorization: Literal["sync", "async", "vector", "envpool", "auto"] = "sync",
    evaluation: bool = False,
    **env_kwargs: Any,
) -> SeededVectorEnv:
    """Make ``n`` copies of gymnasium env ``env_id`` as one vector env seeded from ``seed``.

    ``sync`` steps the copies in this process (best for cheap envs such as CartPole); ``async`` runs each
    in a subprocess (for expensive envs). Episodes reset in the same step they end (gymnasium's
    ``SAME_STEP`` mode): the final observation is in ``info["final_obs"]`` and no reset step is ever
    returned as a transition. Each sub-env is wrapped in ``Snapshot`` so checkpoints can capture it.
    ``env_id`` may be ``module:EnvId`` (the module is imported first); ``env_kwargs`` go to the env's
    constructor (``gymnasium.make``), e.g. ``max_episode_steps=50``.

    Observations are adapted to what the networks take (``pickaxe.envs.spaces``: Discrete, MultiDiscrete,
    MultiBinary, Dict and Tuple flattened to float32; unsupported spaces raise ``SpaceError``). ALE ids get the
    standard Atari stack (``pickaxe.envs.atari``); ``evaluation=True`` leaves out its training-only parts (episodic
    life, reward clipping) so evaluation plays whole games with the raw score; ``atari_wrappers=False`` in
    ``env_kwargs`` gives the raw ALE env instead.
    """
    check_env_id(env_id)
    env_id = split_env_id(env_id)[1]  # the module is imported: the env is registered under its own id
    if n < 1:
        raise EnvError(f"need at least one environment, got n={n}")
    if vectorization == "auto":  # numpy-vectorised where pickaxe has it (the same numbers as sync), else sync
        from pickaxe.envs.vector import numpy_vector_fits

        vectorization = "vector" if numpy_vector_fits(env_id, env_kwargs) else "sync"
    if vectorization in ("vector", "envpool"):  # numpy-vectorised backends: pickaxe.envs.vector
        from pickaxe.envs.vector import make_envpool, make_numpy_vector

        env_kwargs.pop("atari_wrappers", None)
        if vectorization == "vector":
            return SeededVectorEnv(make_numpy_vector(env_id, n, **env_kwargs), seed)
        return SeededVectorEnv(make_envpool(env_id, n, seed, **env_kwargs), seed)
    if vectorization not in ("sync", "async"):
        raise EnvError(f"unknown vectorization {vectorization!r}; use sync, async, vector, envpool or auto")
    wrappers: list[Any] = [adapt_observations, Snapshot]
    if is_atari(env_id) and env_kwargs.pop("atari_wrappers", True):
        env_kwargs = {**BASE_KWARGS, **env_kwargs}
        wrappers.insert(0, atari_wrapper(evaluation))
    else:
        env_kwargs.pop("atari_wrappers", None)
    try:
        envs = gym.make_vec(
            env_id,
            num_envs=n,
            vectorization_mode=vectorization,
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
            wrappers=wrappers,
            **env_kwargs,
        )
    except gym.error.DependencyNotInstalled as e:
        extra = "mujoco" if "mujoco" in str(e).lower() else "atari" if "ale" in str(e).lower() else None
        fix = f"pip install 'pickaxe[{extra}]'" if extra else "install the package the message names"
        raise EnvError(f"environment {env_id!r} needs a missing dependency ({e}); fix: {fix}") from e
    except AssertionError as e:
        error = fetch_mujoco_error(env_id)
        if error is None:
            raise
        raise error from e
    except TypeError as e:
        if not env_kwargs:
            raise
        raise EnvError(
            f"environment {env_id!r} does not take keyword arguments {env_kwargs} ({e}); fix --env.kwargs"
        ) from None
    return SeededVectorEnv(envs, seed)


FETCH_MUJOCO_LIMIT = (3, 12)
"""The first MuJoCo release under which gymnasium-robotics 1.4.2's Fetch tasks do not build (``set_joint_qpos``
asserts on a joint type that MuJoCo reports differently from 3.12 on: 3.11.0 builds, 3.12.0 and 4.0 do not)."""


def fetch_mujoco_error(env_id: str) -> EnvError | None:
    """The one-line error of a gymnasium-robotics Fetch task under a MuJoCo it does not build with
    (:data:`FETCH_MUJOCO_LIMIT` or later); None otherwise."""
    try:
        import mujoco
    except ImportError:
        return None
    version = str(getattr(mujoco, "__version__", "0"))
    parts = re.match(r"(\d+)\.(\d+)", version)
    if not env_id.startswith("Fetch") or parts is None or (int(parts[1]), int(parts[2])) < FETCH_MUJOCO_LIMIT:
        return None
    return EnvError(
        f"environment {env_id!r} does not build with MuJoCo {version} (gymnasium-robotics' Fetch tasks assert on a "
        "joint type); fix: pip install 'mujoco<3.12' (what pip install 'pickaxe[goals]' installs)"
    )


def spaces_of(env_id: str, env_kwargs: dict[str, Any] | None = None) -> tuple[gym.Space, gym.Space]:
    """``(observation_space, action_space)`` of one env as ``make`` builds it (adapted), made and
    closed here; for checks before a run folder exists."""
    envs = make(env_id, 1, 0, **(env_kwargs or {}))
    try:
        return envs.single_observation_space, envs.single_action_space
    finally:
        envs.close()


def check_env_spaces(env_id: str, env_kwargs: dict[str, Any] | None, algo: str | None, goals: bool = False) -> None:
    """Make one env and check that its spaces fit the networks and ``algo`` (one-line ``SpaceError`` if not);
    ``goals``: that its observations are goal observations (hindsight replay needs them)."""
    obs_space, action_space = spaces_of(env_id, env_kwargs)  # making it checks the observation space
    check_action_space(action_space, algo, env_id)
    if goals and not isinstance(obs_space, GoalBox):
        raise SpaceError(
            f"hindsight replay needs goal observations (a Dict of {', '.join(GOAL_KEYS)}), environment {env_id!r} "
            f"gives {obs_space}; fix: use --algo.her none or a goal env"
        )
