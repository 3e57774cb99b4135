"""Multi-agent environments: PettingZoo parallel envs (AEC envs through PettingZoo's own ``aec_to_parallel``) as one
vectorised env whose arrays carry the agents as a dimension.

An id is ``module:name`` as for gymnasium envs (``mpe2:simple_spread_v3``): ``name`` is an attribute of ``module``
or its submodule. A submodule (PettingZoo's and MPE2's layout) is made with its ``parallel_env`` (else its AEC
``env``, converted); a class or function attribute is called and must return a ``ParallelEnv`` or ``AECEnv``. An
id that names a registered gymnasium env stays a gymnasium env.

``MultiAgentVectorEnv`` steps ``n`` copies in this process. Every array is ``[N, A, ...]`` over the env's
``possible_agents`` in their order: observations flattened to float32 (``gymnasium.spaces.flatten``: Discrete ones
one-hot) and zero-padded to the longest agent's, actions (every agent's action space ``Discrete`` of one size: ints
``[N, A]``; or ``Box`` of one shape: floats ``[N, A, d]``, ``d`` the Box's size, clipped to each agent's bounds when
sent), per-agent rewards and ``terminated`` / ``truncated`` flags, and ``alive`` (the agent is in ``env.agents``: it
acts this step). An agent that leaves mid-episode is ``alive=False`` from then on; its action is not sent and its
rows are masked by the learner. An episode ends when no agent is left; the env is reset in the same step (the final
observations and global state are returned, as with gymnasium's ``SAME_STEP``). ``state()`` (``[N, S]``) is the
env's global state for a centralised critic, where the env has one.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from pickaxe.envs.make import EnvError, split_env_id


def parallel_factory(env_id: str) -> Callable[..., Any] | None:
    """The function that makes one PettingZoo parallel env of ``env_id`` (``module:name``; see the module), or None
    when ``env_id`` is not a multi-agent id (a gymnasium id, or a module that cannot be imported: the gymnasium
    check reports that)."""
    module, name = split_env_id(env_id)
    if module is None:
        return None
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    if name in gym.registry:
        return None
    target = getattr(mod, name, None)
    if target is None:
        try:
            target = importlib.import_module(f"{module}.{name}")
        except ImportError:
            return None
    if isinstance(target, types.ModuleType):
        if callable(getattr(target, "parallel_env", None)):
            return target.parallel_env
        aec = getattr(target, "env", None)
        return _converted(aec) if callable(aec) else None
    return _converted(target) if callable(target) else None


def _converted(make_env: Callable[..., Any]) -> Callable[..., Any]:
    """``make_env``'s env as a parallel env: an AEC env goes through ``aec_to_parallel``."""

    def make_parallel(**kwargs: Any) -> Any:
        from pettingzoo import AECEnv
        from pettingzoo.utils.conversions import aec_to_parallel

        env = make_env(**kwargs)
        return aec_to_parallel(env) if isinstance(env, AECEnv) else env

    return make_parallel


def is_multiagent_id(env_id: str) -> bool:
    """Whether ``env_id`` names a PettingZoo env (see :func:`parallel_factory`)."""
    return parallel_factory(env_id) is not None


def make_parallel_env(env_id: str, **kwargs: Any) -> Any:
    """One PettingZoo parallel env of ``env_id``; ``EnvError`` (one line) when it cannot be made or is not one."""
    factory = parallel_factory(env_id)
    if factory is None:
        raise EnvError(f"environment {env_id!r} is not a PettingZoo env (module:name of a parallel or AEC env)")
    try:
        env = factory(**kwargs)
    except ImportError as e:
        raise EnvError(
            f"environment {env_id!r} needs a missing package ({e}); fix: pip install 'pickaxe[marl]'"
        ) from None
    except TypeError as e:
        raise EnvError(
            f"environment {env_id!r} does not take keyword arguments {kwargs} ({e}); fix --env.kwargs"
        ) from None
    from pettingzoo import ParallelEnv

    if not isinstance(env, ParallelEnv) and not all(hasattr(env, k) for k in ("possible_agents", "step", "reset")):
        raise EnvError(f"environment {env_id!r} made a {type(env).__name__}, not a PettingZoo parallel or AEC env")
    return env


def has_state(env: Any) -> bool:
    """Whether a parallel env gives a global state (``state()`` implemented, as MAPPO's critic needs)."""
    try:
        return np.asarray(env.state(), dtype=np.float32).size > 0
    except Exception:  # NotImplementedError, or whatever a wrapper without a state raises on the way
        return False


@dataclass
class AgentSpaces:
    """What a learner sizes its networks from: agent names, padded observation size, actions, global state size."""

    agents: tuple[str, ...]
    obs_dim: int
    n_actions: int
    """Discrete actions: how many; Box actions: the size of one action (its dimensions, flattened)."""
    state_dim: int | None
    """None when the env has no ``state()``."""
    action_low: np.ndarray | None = None
    """Box actions: each agent's lower bounds, ``[A, n_actions]`` (None: Discrete actions)."""
    action_high: np.ndarray | None = None
    """Box actions: each agent's upper bounds, ``[A, n_actions]``."""

    @property
    def num_agents(self) -> int:
        """How many agents (``len(agents)``)."""
        return len(self.agents)

    @property
    def continuous(self) -> bool:
        """Whether the actions are Box (float vectors) rather than Discrete."""
        return self.action_low is not None


def agent_spaces(env: Any, env_id: str) -> AgentSpaces:
    """The spaces of a (reset) parallel env, checked: observations gymnasium can flatten (Box, Discrete one-hot,
    Dict, Tuple); actions ``Discrete`` of one size for every agent, or ``Box`` of one shape for every agent (its
    bounds may differ between agents); one-line ``EnvError`` otherwise, naming the first agent that differs."""
    agents = tuple(env.possible_agents)
    dims: list[int] = []
    first: Any = None
    first_kind: tuple[str, Any] = ("", None)
    lows, highs = [], []
    for agent in agents:
        obs_space, act_space = env.observation_space(agent), env.action_space(agent)
        try:
            dims.append(int(gym.spaces.flatdim(obs_space)))
        except (NotImplementedError, ValueError):
            raise EnvError(
                f"environment {env_id!r}: agent {agent}'s observations {obs_space} cannot be flattened"
            ) from None
        box = isinstance(act_space, gym.spaces.Box) and np.issubdtype(act_space.dtype, np.floating)
        if not (box or isinstance(act_space, gym.spaces.Discrete)):
            raise EnvError(
                f"environment {env_id!r}: agent {agent}'s actions are {act_space}; the multi-agent algorithms take "
                "Discrete actions or float Box actions"
            )
        kind = ("Box", tuple(act_space.shape)) if box else ("Discrete", int(act_space.n))
        if first is None:
            first, first_kind = act_space, kind
        elif kind != first_kind:
            raise EnvError(
                f"environment {env_id!r}: agent {agent}'s actions are {act_space} and {agents[0]}'s {first}; the "
                "multi-agent algorithms need one action space (Discrete of one size, or Box of one shape) for every "
                "agent"
            )
        if box:
            lows.append(np.asarray(act_space.low, dtype=np.float32).reshape(-1))
            highs.append(np.asarray(act_space.high, dtype=np.float32).reshape(-1))
    state_dim = int(np.asarray(env.state()).size) if has_state(env) else None
    if lows:
        return AgentSpaces(agents, max(dims), lows[0].size, state_dim, np.stack(lows), np.stack(highs))
    return AgentSpaces(agents, max(dims), int(first.n), state_dim)


class AgentRows:
    """One parallel env's per-agent dicts as pickaxe's ``[A, ...]`` rows and back: each agent's observation
    flattened into its row, zero-padded to ``obs_dim`` (an absent agent's row all zeros), and a row of actions as
    the agent's own action (an int, or a Box action clipped to the agent's bounds, in its shape and dtype)."""

    def __init__(self, env: Any, spaces: AgentSpaces) -> None:
        self.spaces, self.agents = spaces, spaces.agents
        self.obs_spaces = [env.observation_space(a) for a in self.agents]
        self.act_spaces = [env.action_space(a) for a in self.agents]

    def obs_row(self, obs: dict[str, Any]) -> np.ndarray:
        """One env's observation dict as ``[A, D]`` float32 (absent agents zero)."""
        row = np.zeros((len(self.agents), self.spaces.obs_dim), dtype=np.float32)
        for j, agent in enumerate(self.agents):
            if agent in obs:
                flat = np.asarray(gym.spaces.flatten(self.obs_spaces[j], obs[agent]), dtype=np.float32)
                row[j, : flat.size] = flat
        return row

    def env_action(self, j: int, action: np.ndarray) -> Any:
        """What agent ``j``'s env receives of its row of the actions."""
        if not self.spaces.continuous:
            return int(action)
        space = self.act_spaces[j]
        clipped = np.clip(action, self.spaces.action_low[j], self.spaces.action_high[j])  # type: ignore[index]
        return clipped.reshape(space.shape).astype(space.dtype)


@dataclass
class MultiAgentStep:
    """What one step of ``MultiAgentVectorEnv`` returns (``[N, A]`` per agent, ``[N, S]`` for the state)."""

    next_obs: np.ndarray
    """The observation each agent's action led to (its final one where it left or the episode ended; zeros for
    agents that were not alive)."""
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    next_state: np.ndarray | None
    """The global state the step led to (the final one where the episode ended)."""
    ended: np.ndarray
    """``[N]``: the episode of that env ended this step and the env was reset."""
    obs: np.ndarray
    """The observations to act on next (the new episode's first where ``ended``)."""
    alive: np.ndarray
    """Who acts next."""
    state: np.ndarray | None
    """The global state to act on next."""


class MultiAgentVectorEnv:
    """``n`` copies of a PettingZoo parallel env stepped in this process, agents as the second array dimension.

    Env ``i`` is first reset with ``seed + i``; later episodes continue each env's own generator. ``evaluation``
    envs are re-seeded by the evaluator at every evaluation. Env state is captured for checkpoints (``get_states``)
    when every env has a ``pickaxe_state`` attribute (the toy envs of ``pickaxe.envs.multiagent_toys``) or is an MPE2
    env (``capture_mpe``); other envs resume deterministically (episodes restart from a seed fixed by the step).
    """

    def __init__(self, env_id: str, n: int, seed: int, **kwargs: Any) -> None:
        if n < 1:
            raise EnvError(f"need at least one environment, got n={n}")
        self.env_id, self.num_envs, self.seed = env_id, n, seed
        self.envs = [make_parallel_env(env_id, **kwargs) for _ in range(n)]
        self.envs[0].reset(seed=seed)
        self.spaces = agent_spaces(self.envs[0], env_id)
        self.agents = self.spaces.agents
        self.num_agents = len(self.agents)
        self.rows = AgentRows(self.envs[0], self.spaces)
        self._seeded = False

    def _alive_row(self, env: Any) -> np.ndarray:
        live = set(env.agents)
        return np.array([a in live for a in self.agents], dtype=bool)

    def _state_row(self, env: Any) -> np.ndarray | None:
        if self.spaces.state_dim is None:
            return None
        return np.asarray(env.state(), dtype=np.float32).reshape(-1)

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Reset every env (the first call, and any with a ``seed``: env ``i`` with ``seed + i``); returns
        ``(obs [N, A, D], alive [N, A], state [N, S] or None)``."""
        if seed is None and not self._seeded:
            seed = self.seed
        self._seeded = True
        rows = []
        for i, env in enumerate(self.envs):
            obs, _ = env.reset(seed=None if seed is None else seed + i)
            rows.append(self.rows.obs_row(obs))
        return np.stack(rows), self.alive(), self.state()

    def alive(self) -> np.ndarray:
        """``[N, A]``: which agents are in each env now."""
        return np.stack([self._alive_row(env) for env in self.envs])

    def state(self) -> np.ndarray | None:
        """``[N, S]``: each env's global state now (None: the env has none)."""
        if self.spaces.state_dim is None:
            return None
        return np.stack([self._state_row(env) for env in self.envs])

    def step(self, actions: np.ndarray, alive: np.ndarray) -> MultiAgentStep:
        """Send each alive agent its action (``[N, A]`` ints, or ``[N, A, d]`` floats clipped to the Box bounds),
        reset the envs whose episode ended."""
        N, A, D = self.num_envs, self.num_agents, self.spaces.obs_dim
        next_obs = np.zeros((N, A, D), dtype=np.float32)
        reward = np.zeros((N, A), dtype=np.float32)
        term = np.zeros((N, A), dtype=bool)
        trunc = np.zeros((N, A), dtype=bool)
        ended = np.zeros(N, dtype=bool)
        obs_next = np.empty((N, A, D), dtype=np.float32)
        alive_next = np.empty((N, A), dtype=bool)
        with_state = self.spaces.state_dim is not None
        next_state = np.empty((N, self.spaces.state_dim), dtype=np.float32) if with_state else None
        state = np.empty_like(next_state) if with_state else None
        for i, env in enumerate(self.envs):
            sent = {a: self.rows.env_action(j, actions[i, j]) for j, a in enumerate(self.agents) if alive[i, j]}
            obs, rew, te, tr, _ = env.step(sent)
            next_obs[i] = self.rows.obs_row(obs)
            for j, agent in enumerate(self.agents):
                if alive[i, j]:
                    reward[i, j] = rew.get(agent, 0.0)
                    term[i, j] = bool(te.get(agent, False))
                    trunc[i, j] = bool(tr.get(agent, False))
            now = self._alive_row(env)
            left = alive[i] & ~now & ~term[i] & ~trunc[i]
            term[i] |= left  # an agent the env dropped without a flag has ended its part
            if with_state:
                next_state[i] = self._state_row(env)
            if not env.agents:
                ended[i] = True
                obs, _ = env.reset()
                obs_next[i], now = self.rows.obs_row(obs), self._alive_row(env)
            else:
                obs_next[i] = next_obs[i]
            alive_next[i] = now
            if with_state:
                state[i] = self._state_row(env) if ended[i] else next_state[i]
        return MultiAgentStep(next_obs, reward, term, trunc, next_state, ended, obs_next, alive_next, state)

    def state_support(self) -> str:
        """``exact`` when every env's state can be captured (a ``pickaxe_state`` attribute, or an MPE2 env), else
        ``deterministic``."""
        exact = all(hasattr(env, "pickaxe_state") or is_mpe(env) for env in self.envs)
        return "exact" if exact else "deterministic"

    def get_states(self) -> list[Any]:
        """Each env's captured state (only when ``state_support()`` is exact)."""
        return [env.pickaxe_state if hasattr(env, "pickaxe_state") else capture_mpe(env) for env in self.envs]

    def set_states(self, states: list[Any]) -> None:
        """Restore ``get_states()``; the envs count as seeded."""
        for env, state in zip(self.envs, states, strict=True):
            if hasattr(env, "pickaxe_state"):
                env.pickaxe_state = state
            else:
                restore_mpe(env, state)
        self._seeded = True

    def mark_seeded(self) -> None:
        """Record that the envs are past their first reset (a restored or re-seeded collector)."""
        self._seeded = True

    def close(self) -> None:
        """Close every env."""
        for env in self.envs:
            env.close()


def is_mpe(env: Any) -> bool:
    """Whether ``env`` is an MPE2 env (its ``unwrapped`` a ``SimpleEnv`` with a ``world`` and a ``scenario``)."""
    raw = getattr(env, "unwrapped", None)
    return all(hasattr(raw, k) for k in ("world", "scenario", "np_random", "_agent_selector"))


def _arrays(obj: Any) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in vars(obj).items() if isinstance(v, np.ndarray)}


def capture_mpe(env: Any) -> dict[str, Any]:
    """Everything that decides an MPE2 parallel env's next numbers, between two parallel steps: every entity's state,
    action and array attributes and its references to other entities (a good agent's goal landmark), the step count,
    the env's generator, and the AEC bookkeeping (agents, rewards, flags, whose turn)."""
    raw = env.unwrapped
    entities = list(raw.world.entities)
    index = {id(e): i for i, e in enumerate(entities)}
    rows = []
    for e in entities:
        refs = {k: index[id(v)] for k, v in vars(e).items() if id(v) in index and v is not e}
        action = getattr(e, "action", None)
        rows.append({"state": _arrays(e.state), "action": {} if action is None else _arrays(action),
                     "arrays": _arrays(e), "refs": refs})  # fmt: skip
    flags = {k: {a: bool(v) for a, v in getattr(raw, k).items()} for k in ("terminations", "truncations")}
    sums = {k: {a: float(v) for a, v in getattr(raw, k).items()} for k in ("rewards", "_cumulative_rewards")}
    selector = raw._agent_selector
    return {
        "entities": rows, "steps": int(raw.steps), "rng": raw.np_random.bit_generator.state,
        "agents": list(raw.agents), "selection": raw.agent_selection,
        "selector": [int(selector._current_agent), selector.selected_agent], **flags, **sums,
    }  # fmt: skip


def restore_mpe(env: Any, state: dict[str, Any]) -> None:
    """Put ``capture_mpe``'s state back into an MPE2 parallel env made with the same arguments."""
    env.reset(seed=0)  # a fresh env's wrappers refuse use before a reset; everything it draws is overwritten below
    raw = env.unwrapped
    entities = list(raw.world.entities)
    for e, row in zip(entities, state["entities"], strict=True):
        for target, key in ((e.state, "state"), (getattr(e, "action", None), "action"), (e, "arrays")):
            for k, v in row[key].items():
                setattr(target, k, np.array(v))
        for k, i in row["refs"].items():
            setattr(e, k, entities[int(i)])
    raw.steps = int(state["steps"])
    raw.np_random.bit_generator.state = state["rng"]
    raw.agents = [str(a) for a in state["agents"]]
    env.agents = raw.agents  # the parallel wrapper shares the AEC env's list between steps
    for k in ("terminations", "truncations"):
        setattr(raw, k, {a: bool(v) for a, v in state[k].items()})
    for k in ("rewards", "_cumulative_rewards"):
        setattr(raw, k, {a: float(v) for a, v in state[k].items()})
    raw.agent_selection = state["selection"]
    raw._agent_selector._current_agent, raw._agent_selector.selected_agent = (
        int(state["selector"][0]),
        state["selector"][1],
    )


def check_multiagent_env(
    env_id: str, env_kwargs: dict[str, Any], algo: str, needs_state: bool, box_actions: bool = True
) -> AgentSpaces:
    """Make one env of ``env_id`` and check it suits ``algo`` (spaces; a global state when ``needs_state``; Discrete
    actions unless ``box_actions``); one-line ``EnvError`` otherwise."""
    env = make_parallel_env(env_id, **env_kwargs)
    try:
        env.reset(seed=0)
        spaces = agent_spaces(env, env_id)
    finally:
        env.close()
    if needs_state and spaces.state_dim is None:
        raise EnvError(
            f"{algo}'s critic reads the env's global state, and {env_id!r} has no state(); use ippo (each agent's "
            "critic on its own observation)"
        )
    if spaces.continuous and not box_actions:
        raise EnvError(
            f"{algo} takes Discrete actions and {env_id!r} has Box actions of size {spaces.n_actions}; use ippo or "
            "mappo (a Gaussian actor), or Discrete actions (MPE2: --env.kwargs.continuous_actions false)"
        )
    return spaces
