"""The multi-agent collector and evaluation episodes: a policy over every agent of a ``MultiAgentVectorEnv``.

A collected batch is ``[T, N]`` (env steps: what the Trainer counts) whose per-agent keys carry the agents as a
third dimension: ``obs`` / ``next_obs`` ``[T, N, A, D]``; ``action``, ``logprob``, ``value``, ``reward``,
``terminated``, ``truncated`` and ``mask`` ``[T, N, A]`` (Box actions: ``action`` ``[T, N, A, d]``, as sampled,
before the env adapter clips them); with a global state ``state`` / ``next_state`` ``[T, N,
S]``. ``mask`` is True where the agent was present and acted; the learner keeps only those agent-steps.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from pickaxe.data.batch import Batch
from pickaxe.envs.multiagent import MultiAgentVectorEnv


class MultiAgentCollector:
    """Steps ``envs`` with ``policy`` (``act(obs, state, deterministic)`` over ``[N, A]``) for ``steps`` env steps
    per collect. Episode returns are kept per agent; ``episodes`` holds ``(returns [A], length)`` of the episodes
    that ended in the last collect."""

    def __init__(self, envs: MultiAgentVectorEnv, policy: Any, steps: int = 1024, device: Any = "cpu") -> None:
        n = envs.num_envs
        if steps < n or steps % n:
            raise ValueError(f"collector steps ({steps}) must be a positive multiple of the number of envs ({n})")
        self.envs, self.policy, self.steps, self.num_envs = envs, policy, steps, n
        self.device = torch.device(device)
        A = envs.num_agents
        self._obs: np.ndarray | None = None
        self._alive: np.ndarray | None = None
        self._state: np.ndarray | None = None
        self._ep_return = np.zeros((n, A))
        self._ep_length = np.zeros(n, dtype=np.int64)
        self.total_steps = 0
        self.total_episodes = 0
        self.episodes: list[tuple[np.ndarray, int]] = []
        self.steps_per_s = 0.0

    def collect(self, steps: int | None = None) -> Batch:
        """``steps`` env steps (default: the constructor's) as a ``[steps // N, N]`` Batch."""
        steps = self.steps if steps is None else steps
        T, N = steps // self.num_envs, self.num_envs
        if self._obs is None:
            self._obs, self._alive, self._state = self.envs.reset()
        keys = ("obs", "next_obs", "reward", "terminated", "truncated", "mask", "state", "next_state")
        out: dict[str, list[np.ndarray]] = {k: [] for k in keys}
        actions, extras = [], []
        self.episodes = []
        start = time.perf_counter()
        with torch.no_grad():
            for _ in range(T):
                obs_t = torch.from_numpy(self._obs).to(self.device)
                state_t = None if self._state is None else torch.from_numpy(self._state).to(self.device)
                action, extra = self.policy.act(obs_t, state_t)
                actions.append(action)
                extras.append(extra)
                step = self.envs.step(action.cpu().numpy(), self._alive)
                out["obs"].append(self._obs)
                out["mask"].append(self._alive)
                out["state"].append(self._state)
                out["next_obs"].append(step.next_obs)
                out["next_state"].append(step.next_state)
                for k in ("reward", "terminated", "truncated"):
                    out[k].append(getattr(step, k))
                self._ep_return += step.reward
                self._ep_length += 1
                for i in np.flatnonzero(step.ended):
                    self.episodes.append((self._ep_return[i].copy(), int(self._ep_length[i])))
                    self._ep_return[i], self._ep_length[i] = 0.0, 0
                self.total_episodes += int(step.ended.sum())
                self._obs, self._alive, self._state = step.obs, step.alive, step.state
        self.steps_per_s = steps / max(time.perf_counter() - start, 1e-9)
        self.total_steps += steps
        data: dict[str, Any] = {k: torch.from_numpy(np.stack(v)) for k, v in out.items() if v[0] is not None}
        data["action"] = torch.stack(actions)
        for key in extras[0]:
            data[key] = torch.stack([e[key] for e in extras])
        return TensorDict(data, batch_size=[T, N]).to(self.device)

    def state_dict(self) -> dict[str, Any]:
        """Position in the env stream: what the agents see, who is alive, partial episodes, env states."""
        exact = self.state_support() == "exact"
        return {
            "obs": self._obs,
            "alive": self._alive,
            "state": self._state,
            "ep_return": self._ep_return.copy(),
            "ep_length": self._ep_length.copy(),
            "total_steps": self.total_steps,
            "total_episodes": self.total_episodes,
            "envs": self.envs.get_states() if exact and self._obs is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any], reseed: int | None = None) -> None:
        """Restore ``state_dict()``; without env states, every env starts a new episode from seed ``reseed``."""
        self.total_steps = int(state["total_steps"])
        self.total_episodes = int(state["total_episodes"])
        if state["envs"] is not None:
            self.envs.set_states(list(state["envs"]))
            self._obs = np.asarray(state["obs"], dtype=np.float32).copy()
            self._alive = np.asarray(state["alive"], dtype=bool).copy()
            saved = state.get("state")
            self._state = None if saved is None else np.asarray(saved, dtype=np.float32).copy()
            self._ep_return = np.asarray(state["ep_return"], dtype=np.float64).copy()
            self._ep_length = np.asarray(state["ep_length"], dtype=np.int64).copy()
            return
        self._obs, self._alive, self._state = self.envs.reset(seed=reseed)
        self._ep_return[:] = 0.0
        self._ep_length[:] = 0

    def state_support(self) -> str:
        """``exact`` when every env's state is captured, else ``deterministic``."""
        return self.envs.state_support()

    def metrics(self) -> dict[str, float]:
        """Episode returns of the last collect (the total over agents and each agent's) and collection speed."""
        out: dict[str, float] = {"time/collect_steps_per_s": self.steps_per_s}
        if self.episodes:
            returns = np.stack([r for r, _ in self.episodes])
            out["rollout/return_mean"] = float(returns.sum(1).mean())
            out["rollout/length_mean"] = float(np.mean([n for _, n in self.episodes]))
            out["rollout/episodes"] = float(len(self.episodes))
            for j, agent in enumerate(self.envs.agents):
                out[f"rollout/agent/{agent}/return_mean"] = float(returns[:, j].mean())
        return out


def play_episodes(
    policy: Any, envs: MultiAgentVectorEnv, episodes: int, device: Any = "cpu", deterministic: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``episodes`` whole episodes (split evenly over the envs, re-seeded from ``envs.seed`` first, so the result
    is a pure function of the weights); returns ``(returns [E, A], lengths [E])``."""
    n, A = envs.num_envs, envs.num_agents
    quota = np.array([(episodes + i) // n for i in range(n)])
    obs, alive, state = envs.reset(seed=envs.seed)
    ep_ret, ep_len = np.zeros((n, A)), np.zeros(n, dtype=np.int64)
    done = np.zeros(n, dtype=np.int64)
    returns: list[np.ndarray] = []
    lengths: list[int] = []
    device = torch.device(device)
    with torch.no_grad():
        while np.count_nonzero(done < quota):
            state_t = None if state is None else torch.from_numpy(state).to(device)
            action, _ = policy.act(torch.from_numpy(obs).to(device), state_t, deterministic=deterministic)
            step = envs.step(action.cpu().numpy(), alive)
            ep_ret += step.reward
            ep_len += 1
            for i in np.flatnonzero(step.ended):
                if done[i] < quota[i]:
                    returns.append(ep_ret[i].copy())
                    lengths.append(int(ep_len[i]))
                done[i] += 1
            ep_ret[step.ended], ep_len[step.ended] = 0.0, 0
            obs, alive, state = step.obs, step.alive, step.state
    return np.stack(returns), np.array(lengths)
