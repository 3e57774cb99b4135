"""Env workers on Ray: a gymnasium ``VectorEnv`` whose sub-envs live in Ray actors, for the unchanged ``Collector``.

``RayVectorEnv(env_id, num_envs, seed, workers)`` splits the ``num_envs`` sub-envs into ``workers`` contiguous
chunks; actor ``k`` holds ``pickaxe.envs.make(env_id, n_k, seed + first_k, "sync")``, so sub-env ``j`` is seeded
``seed + j`` exactly as in the learner's process, and a step returns what the in-process env returns (same arrays,
dtypes and info keys with their masks, ``final_obs``/``final_info`` included; ``SAME_STEP`` autoreset).

A worker that dies (``RayActorError``: a crash, an OOM kill, ``ray.kill``, a lost node) is replaced and the call it
did not finish is redone, so no transition is lost or counted twice. The driver keeps, per chunk, a restore point
and the calls made since (steps with their actions, resets with their seeds, ``set_attr``/``call``); the new actor
is made like the old one, restored and replays those calls before it redoes the unfinished one:

- envs whose state ``pickaxe.envs.state`` captures (classic control, toy text, MuJoCo, Atari): the restore point is
  a snapshot of the chunk's env states, taken every ``snapshot_every`` calls and returned with that call's result.
  The run gives the same numbers as an undisturbed run.
- other envs: the restore point is the chunk's construction, and the replay is exact as long as the env is a
  function of its seed and actions (gymnasium's contract) and at most ``max_replay`` calls were made. Past that the
  log is dropped; a death then restarts the chunk's episodes from a seed fixed by the worker and its restart count
  (as a resume without env state does), and the unfinished step is reported for those sub-envs as a truncation
  with reward 0 whose final observation is the last one the learner saw. Each such restart is reported.

Every restart is counted in ``restarts`` and reported through ``on_event`` (the run's ``events.jsonl``).
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from pickaxe.dist.runtime import import_ray
from pickaxe.envs.make import make
from pickaxe.errors import PickaxeError

Call = tuple[Any, ...]  # ("step", actions) | ("reset", seed, options) | ("set_attr", name, values) | ("call", ...)


class EnvWorker:
    """The body of one env-worker actor: ``n`` sub-envs made by ``pickaxe.envs.make`` in the actor's process."""

    def __init__(self, env_id: str, n: int, seed: int, env_kwargs: dict[str, Any]) -> None:
        self.envs = make(env_id, n, seed, "sync", **env_kwargs)
        self._infos: list[tuple[dict[str, Any], int]] = []
        # Each sub-env's own info dict, in the order the vector env merges them: the driver merges them again over
        # all sub-envs, so dtypes come out as in one process (the first sub-env with a key decides its dtype).
        vector_env = self.envs.unwrapped

        def record(vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int) -> dict[str, Any]:
            if env_info:  # values copied now, as gymnasium copies them into its arrays (final_obs: by reference)
                copied = {k: v if k == "final_obs" else copy.deepcopy(v) for k, v in env_info.items()}
                self._infos.append((copied, env_num))
            return vector_infos

        vector_env._add_info = record  # type: ignore[method-assign]

    def describe(self) -> dict[str, Any]:
        """What the driver needs to present the chunk as part of one vector env."""
        e = self.envs
        return {
            "single_observation_space": e.single_observation_space,
            "single_action_space": e.single_action_space,
            "metadata": dict(e.metadata),
            "render_mode": e.render_mode,
            "spec": e.spec,
            "exact": set(e.get_attr("pickaxe_state_support")) == {"exact"},
        }

    def run(self, calls: list[Call], restore: dict[str, Any] | None = None, snapshot: bool = False) -> Any:
        """Restore ``restore`` (a ``snapshot()``) if given, make ``calls`` in order and return the last one's
        result, with the chunk's snapshot after it when ``snapshot`` (else None)."""
        if restore is not None:
            self.envs.set_attr("pickaxe_state", list(restore["envs"]))
            if restore["seeded"]:
                self.envs.mark_seeded()
        result = None
        for c in calls:
            result = self._one(c)
        return result, (self.snapshot() if snapshot else None)

    def _one(self, c: Call) -> Any:
        kind = c[0]
        if kind == "step":
            self._infos = []
            return (*self.envs.step(c[1])[:4], self._infos)
        if kind == "reset":
            self._infos = []
            return self.envs.reset(seed=c[1], options=c[2])[0], self._infos
        if kind == "set_attr":
            return self.envs.set_attr(c[1], c[2])
        if kind == "get_attr":
            return self.envs.get_attr(c[1])
        if kind == "call":
            return self.envs.call(c[1], *c[2], **c[3])
        if kind == "mark_seeded":
            return self.envs.mark_seeded()
        raise ValueError(f"unknown env worker call {kind!r}")

    def snapshot(self) -> dict[str, Any]:
        """The chunk's env states (each sub-env's ``pickaxe_state``) and whether it is past its seeding."""
        return {"envs": list(self.envs.get_attr("pickaxe_state")), "seeded": bool(self.envs._seeded)}


@dataclass
class _Chunk:
    """Driver-side record of one worker: its actor, its sub-envs ``[lo, hi)`` and how to rebuild it."""

    index: int
    lo: int
    hi: int
    actor: Any
    obs_space: Any  # the chunk's batched observation space
    restore: dict[str, Any] | None = None  # None: the chunk as constructed
    log: list[Call] = field(default_factory=list)  # calls made since ``restore``
    replayable: bool = True
    last_obs: Any = None  # the chunk's observations after its latest step or reset


class RayVectorEnv(VectorEnv):
    """``num_envs`` copies of ``env_id`` stepped by ``workers`` Ray actors, seen as one ``SAME_STEP`` vector env.

    Seeds as ``pickaxe.envs.make``: the first ``reset()`` without a seed uses ``seed`` (sub-env ``j`` gets
    ``seed + j``), later ones continue each sub-env's generator. ``get_attr``/``set_attr``/``call`` reach every
    sub-env in order, so ``Collector.state_dict``/``load_state_dict`` (``pickaxe_state``) work unchanged. Each
    actor reserves ``worker_cpus`` CPUs and ``worker_gpus`` GPUs and runs in Ray's ``runtime_env`` if given (e.g.
    ``{"env_vars": {"PYTHONPATH": ...}}`` so that the module of a ``module:EnvId`` id imports there); Ray must be
    initialised (``pickaxe.dist.runtime.ensure_ray``). See the module docstring for what a worker death does.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int,
        workers: int,
        env_kwargs: dict[str, Any] | None = None,
        worker_cpus: float = 1.0,
        worker_gpus: float = 0.0,
        snapshot_every: int = 64,
        max_replay: int = 10_000,
        max_retries: int = 3,
        on_event: Callable[[str], None] | None = None,
        runtime_env: dict[str, Any] | None = None,
    ) -> None:
        if not 1 <= workers <= num_envs:
            raise PickaxeError(
                f"env workers ({workers}) must be between 1 and the number of envs ({num_envs}): "
                "use fewer workers or more envs"
            )
        self._ray = import_ray()
        self.env_id, self.num_envs, self.seed, self.workers = env_id, num_envs, seed, workers
        self.env_kwargs = dict(env_kwargs or {})
        self.snapshot_every, self.max_replay, self.max_retries = snapshot_every, max_replay, max_retries
        self.on_event = on_event
        self.restarts = 0
        """Worker actors replaced since this env was made."""
        self._seeded = False
        options: dict[str, Any] = {"num_cpus": worker_cpus, "num_gpus": worker_gpus, "max_restarts": 0}
        if runtime_env is not None:
            options["runtime_env"] = runtime_env
        self._actor_cls = self._ray.remote(EnvWorker).options(**options)
        bounds = [round(k * num_envs / workers) for k in range(workers + 1)]  # contiguous, sizes differ by <= 1
        self._chunks: list[_Chunk] = []
        for k in range(workers):
            lo, hi = bounds[k], bounds[k + 1]
            self._chunks.append(_Chunk(k, lo, hi, self._new_actor(lo, hi), obs_space=None))
        try:
            described = self._ray.get([c.actor.describe.remote() for c in self._chunks])
        except self._ray.exceptions.RayActorError as e:
            self.close_extras()
            raise _init_error(e, env_id) or e from None
        self._exact = all(d["exact"] for d in described)
        info = described[0]
        self.single_observation_space = info["single_observation_space"]
        self.single_action_space = info["single_action_space"]
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        for c in self._chunks:
            c.obs_space = batch_space(self.single_observation_space, c.hi - c.lo)
        self.metadata = {**info["metadata"], "autoreset_mode": AutoresetMode.SAME_STEP}
        self.render_mode, self.spec = info["render_mode"], info["spec"]

    # ------------------------------------------------------------------------------------------- the API
    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every sub-env (each worker its slice, all in parallel); the results in sub-env order."""
        parts = self._run_all([("step", self._slice_actions(actions, c)) for c in self._chunks])
        obs = self._concat_obs([p[0] for p in parts])
        rewards = np.concatenate([p[1] for p in parts])
        terminated = np.concatenate([p[2] for p in parts])
        truncated = np.concatenate([p[3] for p in parts])
        return obs, rewards, terminated, truncated, self._merge_infos([p[4] for p in parts])

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset; the very first call defaults to the stored seed (the action space is seeded with it too).
        ``options["reset_mask"]`` resets only the masked sub-envs."""
        masked = bool(options) and "reset_mask" in options  # type: ignore[operator]
        if seed is None and not self._seeded:
            seed = self.seed
            self.action_space.seed(self.seed)
        if seed is not None and not masked:
            self._seeded = True
        calls: list[Call] = []
        for c in self._chunks:
            if isinstance(seed, int | np.integer):
                chunk_seed: Any = int(seed) + c.lo
            else:
                chunk_seed = None if seed is None else list(seed[c.lo : c.hi])
            chunk_options = options
            if masked:
                mask = np.asarray(options["reset_mask"])[c.lo : c.hi].copy()  # type: ignore[index]
                chunk_options = {**options, "reset_mask": mask}  # type: ignore[dict-item]
            calls.append(("reset", chunk_seed, chunk_options))
        parts = self._run_all(calls)
        return self._concat_obs([p[0] for p in parts]), self._merge_infos([p[1] for p in parts])

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """An attribute of every sub-env, in sub-env order."""
        parts = self._run_all([("get_attr", name)] * len(self._chunks), log=False)
        return tuple(v for part in parts for v in part)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set an attribute on every sub-env, one value each when ``values`` is a list or tuple."""
        if isinstance(values, list | tuple):
            if len(values) != self.num_envs:
                raise ValueError(f"set_attr needs one value per sub-env ({self.num_envs}), got {len(values)}")
            calls: list[Call] = [("set_attr", name, list(values[c.lo : c.hi])) for c in self._chunks]
        else:
            calls = [("set_attr", name, values)] * len(self._chunks)
        self._run_all(calls)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call a method (or read an attribute) of every sub-env; the results in sub-env order."""
        parts = self._run_all([("call", name, args, kwargs)] * len(self._chunks))
        return tuple(v for part in parts for v in part)

    def mark_seeded(self) -> None:
        """Record that the envs are past their first reset (used when state is restored from a checkpoint)."""
        self._seeded = True
        self._run_all([("mark_seeded",)] * len(self._chunks))

    def close_extras(self, **kwargs: Any) -> None:
        """Stop the worker actors."""
        for c in self._chunks:
            with contextlib.suppress(Exception):  # Ray already shut down: its actors went with it
                self._ray.kill(c.actor)

    @property
    def worker_actors(self) -> list[Any]:
        """The current actor of each worker, in sub-env order."""
        return [c.actor for c in self._chunks]

    # ------------------------------------------------------------------------------------------ internals
    def _new_actor(self, lo: int, hi: int) -> Any:
        return self._actor_cls.remote(self.env_id, hi - lo, self.seed + lo, self.env_kwargs)

    def _run_all(self, calls: list[Call], log: bool = True) -> list[Any]:
        """Send chunk ``k`` its call ``calls[k]``, all at once; a dead worker is replaced and its call redone."""
        snaps = [log and self._exact and len(c.log) + 1 >= self.snapshot_every for c in self._chunks]
        refs = [c.actor.run.remote([call], None, s) for c, call, s in zip(self._chunks, calls, snaps, strict=True)]
        dead = self._ray.exceptions.RayActorError
        try:
            replies = self._ray.get(refs)  # one wait for all: the common case
        except dead:
            replies = [None] * len(refs)
        out = []
        for c, call, s, ref, reply in zip(self._chunks, calls, snaps, refs, replies, strict=True):
            done = log
            try:
                result, state = reply if reply is not None else self._ray.get(ref)
            except dead as e:
                result, state, done = self._recover(c, call, s, e)
                done = done and log
            if done:
                self._record(c, call, result, state)
            out.append(result)
        return out

    def _record(self, c: _Chunk, call: Call, result: Any, state: dict[str, Any] | None) -> None:
        """Move the chunk's restore point forward: a new snapshot, or one more call to replay."""
        if call[0] in ("step", "reset"):
            c.last_obs = result[0]
        if state is not None:
            c.restore, c.log = state, []
        elif c.replayable:
            c.log.append(call)
            if len(c.log) > self.max_replay:  # too long to replay (only envs whose state cannot be captured)
                c.replayable, c.log = False, []

    def _recover(self, c: _Chunk, call: Call, snapshot: bool, error: Exception) -> tuple[Any, Any, bool]:
        """Replace the dead actor of chunk ``c``; what ``call`` returns, the snapshot after it, and whether the new
        actor made the call (a step of a chunk that restarts its episodes is not made: it only ends them)."""
        for _ in range(self.max_retries):
            self.restarts += 1
            with contextlib.suppress(Exception):  # it is dead already, or its node is gone
                self._ray.kill(c.actor)
            c.actor = self._new_actor(c.lo, c.hi)
            where = f"env worker {c.index} (envs {c.lo}-{c.hi - 1}) died ({type(error).__name__})"
            try:
                if c.replayable:
                    result, state = self._ray.get(c.actor.run.remote([*c.log, call], c.restore, snapshot))
                    origin = "a snapshot" if c.restore is not None else "its start"
                    self._event(
                        f"{where}; replaced it and replayed {len(c.log)} calls from {origin}: the run goes on "
                        f"exactly (restart {self.restarts})"
                    )
                    return result, state, True
                result = self._restart_episodes(c, call)
                self._event(
                    f"{where}; its envs' state cannot be captured and is too far back to replay: replaced it and "
                    f"restarted its episodes from a fixed seed (the unfinished step ends them as truncated; "
                    f"restart {self.restarts})"
                )
                return result, None, call[0] != "step"
            except self._ray.exceptions.RayActorError as e:
                init_error = _init_error(e, self.env_id)
                if init_error is not None:
                    raise init_error from None
                error = e
        raise PickaxeError(
            f"env worker {c.index} (envs {c.lo}-{c.hi - 1}) died {self.max_retries} times in a row on the same call "
            f"(last: {type(error).__name__}: {error}); check the env and the workers' memory"
        ) from error

    def _restart_episodes(self, c: _Chunk, call: Call) -> Any:
        """Fresh episodes for a chunk that cannot be restored; a step becomes a reward-0 truncation of the
        episodes the learner saw (final observation: its last one), anything else is redone after the reset."""
        reseed = (self.seed + c.lo + 1_000_003 * self.restarts) % 2**31
        first: list[Call] = [("reset", reseed, None)]  # a seeded reset: later ones continue its generators
        c.restore, c.log, c.replayable = None, list(first), True
        if call[0] != "step":
            result, _ = self._ray.get(c.actor.run.remote([*first, call]))
            return result
        if c.last_obs is None:
            raise PickaxeError(f"env worker {c.index} died before its envs were reset; reset the env first")
        (obs, reset_infos), _ = self._ray.get(c.actor.run.remote(first))
        n = c.hi - c.lo
        ended = [({"final_obs": row, "final_info": {}}, i) for i, row in enumerate(iterate(c.obs_space, c.last_obs))]
        c.last_obs = obs
        return obs, np.zeros(n), np.zeros(n, dtype=bool), np.ones(n, dtype=bool), ended + reset_infos

    def _event(self, message: str) -> None:
        if self.on_event is not None:
            self.on_event(message)
        else:
            print(f"pickaxe: {message}", file=sys.stderr)

    def _slice_actions(self, actions: Any, c: _Chunk) -> Any:
        if isinstance(actions, np.ndarray):
            return actions[c.lo : c.hi].copy()
        items = list(iterate(self.action_space, actions))[c.lo : c.hi]
        return concatenate(self.single_action_space, items, create_empty_array(self.single_action_space, len(items)))

    def _concat_obs(self, parts: list[Any]) -> Any:
        if all(isinstance(p, np.ndarray) for p in parts):
            return np.concatenate(parts)
        items = [x for c, p in zip(self._chunks, parts, strict=True) for x in iterate(c.obs_space, p)]
        empty = create_empty_array(self.single_observation_space, self.num_envs)
        return concatenate(self.single_observation_space, items, empty)

    def _merge_infos(self, parts: Sequence[list[tuple[dict[str, Any], int]]]) -> dict[str, Any]:
        """The sub-envs' own infos merged as gymnasium's vector envs merge them (arrays with ``_key`` masks)."""
        out: dict[str, Any] = {}
        for records, c in zip(parts, self._chunks, strict=True):
            for env_info, i in records:
                out = self._add_info(out, env_info, c.lo + i)
        return out


def _init_error(error: Exception, env_id: str) -> PickaxeError | None:
    """A one-line error for a worker whose envs could not be made (the cause's last line), else None."""
    if not getattr(error, "actor_init_failed", False):
        return None
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    cause = lines[-1] if lines else type(error).__name__
    return PickaxeError(f"env workers could not make {env_id!r}: {cause}")
