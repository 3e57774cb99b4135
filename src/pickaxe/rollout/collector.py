"""The Collector: runs a policy in a vector of gymnasium envs and returns a time-major ``Batch``."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from tensordict import TensorDict

from pickaxe.data.batch import Batch
from pickaxe.models.policy import Policy, rollout_act
from pickaxe.models.recurrent import is_recurrent


class Collector:
    """Steps ``envs`` with ``policy`` and returns ``[T, N]`` batches of real transitions.

    Keys: ``obs``, ``action``, ``reward``, ``terminated``, ``truncated``, ``next_obs`` and whatever
    extras the policy reports (``logprob``, ``value``). ``next_obs`` is always the observation the
    action led to, the true final one where an episode ended, so learners can bootstrap truncated
    episodes. Reset steps are never transitions: with gymnasium's ``SAME_STEP`` autoreset the final
    observation comes from ``info["final_obs"]``; with ``NEXT_STEP`` or ``DISABLED`` the collector resets
    finished sub-envs itself (``reset_mask``) before the next step.

    The hot loop writes env outputs into preallocated numpy arrays and keeps policy outputs in a list
    stacked once per collect; no per-step ``TensorDict`` is built.

    A recurrent policy (``models.recurrent``) gets its hidden state carried from step to step and from collect to
    collect (zeroed per env after each episode end); it is part of ``state_dict``, so a resumed run continues with
    the state it had.
    """

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        policy: Policy,
        steps: int = 1024,
        device: str | torch.device = "cpu",
    ) -> None:
        n = envs.num_envs
        if steps < n or steps % n:
            raise ValueError(f"collector steps ({steps}) must be a positive multiple of the number of envs ({n})")
        self.envs = envs
        self.policy = policy
        self.steps = steps
        self.device = torch.device(device)
        self.num_envs = n
        obs_space = envs.single_observation_space
        self._obs_shape = obs_space.shape
        self._obs_dtype = np.float32 if np.issubdtype(obs_space.dtype, np.floating) else obs_space.dtype
        act_space = envs.single_action_space
        self._clip = (act_space.low, act_space.high) if isinstance(act_space, gym.spaces.Box) else None
        self._mode = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        self._obs: np.ndarray | None = None
        self._ep_return = np.zeros(n)
        self._ep_length = np.zeros(n, dtype=np.int64)
        self.total_steps = 0
        self.total_episodes = 0
        self.episodes: list[tuple[float, int]] = []  # (return, length) of episodes ended in the last collect
        self.steps_per_s = 0.0
        self._recurrent = is_recurrent(policy)
        self._state: tuple[torch.Tensor, torch.Tensor] | None = None  # a recurrent policy's hidden state

    def collect(self, steps: int | None = None) -> Batch:
        """Collect ``steps`` transitions (default: the constructor's) as a ``[steps // N, N]`` Batch."""
        steps = self.steps if steps is None else steps
        if steps % self.num_envs:
            raise ValueError(f"steps ({steps}) must be a multiple of the number of envs ({self.num_envs})")
        T, N = steps // self.num_envs, self.num_envs
        if self._obs is None:
            obs0, _ = self.envs.reset()
            self._obs = np.asarray(obs0, dtype=self._obs_dtype)
        obs_buf = np.empty((T + 1, N, *self._obs_shape), dtype=self._obs_dtype)
        next_obs_buf = np.empty((T, N, *self._obs_shape), dtype=self._obs_dtype)
        reward_buf = np.empty((T, N), dtype=np.float32)
        term_buf = np.empty((T, N), dtype=bool)
        trunc_buf = np.empty((T, N), dtype=bool)
        actions: list[torch.Tensor] = []
        extras: list[dict[str, torch.Tensor]] = []
        self.episodes = []
        obs_buf[0] = self._obs
        on_cpu = self.device.type == "cpu"
        recurrent = self._recurrent
        if recurrent and self._state is None:
            self._state = self.policy.initial_state(N, self.device)
        start = time.perf_counter()
        with torch.no_grad():
            act = self.policy.act if recurrent else rollout_act(self.policy)  # the weights are fixed for the rollout
            for t in range(T):
                obs_t = torch.from_numpy(obs_buf[t])
                obs_t = obs_t if on_cpu else obs_t.to(self.device, non_blocking=True)
                if recurrent:
                    action, extra, self._state = self.policy.act_recurrent(obs_t, self._state)
                else:
                    action, extra = act(obs_t)
                actions.append(action)
                extras.append(extra)
                act_np = action.numpy() if on_cpu else action.cpu().numpy()
                if self._clip is not None:
                    act_np = np.clip(act_np, *self._clip)
                nxt, reward, term, trunc, info = self.envs.step(act_np)
                next_obs_buf[t] = nxt
                obs_buf[t + 1] = nxt
                reward_buf[t] = reward
                term_buf[t] = term
                trunc_buf[t] = trunc
                self._ep_return += reward
                self._ep_length += 1
                done = term | trunc
                if np.count_nonzero(done):  # several times cheaper than done.any() on a few envs
                    self._end_episodes(done, info, next_obs_buf[t], obs_buf[t + 1])
                    if recurrent:
                        self._state = self.policy.reset_state(self._state, torch.from_numpy(done))
        self._obs = obs_buf[T].copy()
        elapsed = time.perf_counter() - start
        self.steps_per_s = steps / max(elapsed, 1e-9)
        self.total_steps += steps
        data: dict[str, Any] = {
            "obs": torch.from_numpy(obs_buf[:T]),
            "action": torch.stack(actions),
            "reward": torch.from_numpy(reward_buf),
            "terminated": torch.from_numpy(term_buf),
            "truncated": torch.from_numpy(trunc_buf),
            "next_obs": torch.from_numpy(next_obs_buf),
        }
        for key in extras[0]:
            data[key] = torch.stack([e[key] for e in extras])
        return TensorDict(data, batch_size=[T, N]).to(self.device)

    def _end_episodes(self, done: np.ndarray, info: dict, final_row: np.ndarray, obs_row: np.ndarray) -> None:
        """Record finished episodes, then make ``final_row`` hold the true final observations and ``obs_row``
        the first observations of the new episodes (SAME_STEP: from ``info``; other modes: by resetting)."""
        idx = np.flatnonzero(done)
        for i in idx:
            self.episodes.append((float(self._ep_return[i]), int(self._ep_length[i])))
        self.total_episodes += len(idx)
        self._ep_return[idx] = 0.0
        self._ep_length[idx] = 0
        if self._mode == AutoresetMode.SAME_STEP:
            for i in idx:  # returned obs is already the reset one; the real final one is in info
                final_row[i] = info["final_obs"][i]
        else:
            reset_obs, _ = self.envs.reset(options={"reset_mask": done})
            obs_row[idx] = np.asarray(reset_obs)[idx]

    def state_dict(self) -> dict[str, Any]:
        """Position in the env stream: current observations, partial-episode counters, env states.

        Env states are captured when every sub-env supports it (``envs.state``); otherwise
        ``envs`` is None and ``load_state_dict`` restarts episodes from a seed derived from ``reseed``.
        """
        support = self.state_support()
        return {
            "obs": None if self._obs is None else self._obs.copy(),
            "ep_return": self._ep_return.copy(),
            "ep_length": self._ep_length.copy(),
            "total_steps": self.total_steps,
            "total_episodes": self.total_episodes,
            "envs": list(self.envs.get_attr("pickaxe_state")) if support == "exact" else None,
            "policy_state": None if self._state is None else [s.detach().cpu().clone() for s in self._state],
        }

    def load_state_dict(self, state: dict[str, Any], reseed: int | None = None) -> None:
        """Restore ``state_dict()``. Without env states, reset every env with seed ``reseed`` instead."""
        self.total_steps = int(state["total_steps"])
        self.total_episodes = int(state["total_episodes"])
        if state["envs"] is not None and state["obs"] is not None:
            self.envs.set_attr("pickaxe_state", list(state["envs"]))
            self._obs = np.asarray(state["obs"], dtype=self._obs_dtype).copy()
            self._ep_return = np.asarray(state["ep_return"], dtype=np.float64).copy()
            self._ep_length = np.asarray(state["ep_length"], dtype=np.int64).copy()
            saved = state.get("policy_state")
            self._state = None if saved is None else tuple(torch.as_tensor(s).to(self.device) for s in saved)
        else:  # deterministic restart: fresh episodes from a known seed
            obs, _ = self.envs.reset(seed=reseed)
            self._obs = np.asarray(obs, dtype=self._obs_dtype)
            self._ep_return[:] = 0.0
            self._ep_length[:] = 0
            self._state = None
        if hasattr(self.envs, "mark_seeded"):
            self.envs.mark_seeded()

    def state_support(self) -> str:
        """``exact`` when every sub-env's state can be captured (``pickaxe.envs.state``), else ``deterministic``."""
        try:
            support = set(self.envs.get_attr("pickaxe_state_support"))
        except AttributeError:
            return "deterministic"
        return "exact" if support == {"exact"} else "deterministic"

    def metrics(self) -> dict[str, float]:
        """Episode statistics of the last collect and collection speed."""
        out: dict[str, float] = {"time/collect_steps_per_s": self.steps_per_s}
        if self.episodes:
            returns = np.array([r for r, _ in self.episodes])
            out["rollout/return_mean"] = float(returns.mean())
            out["rollout/length_mean"] = float(np.mean([n for _, n in self.episodes]))
            out["rollout/episodes"] = float(len(self.episodes))
        return out
