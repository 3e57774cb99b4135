"""A multi-agent run's policies loaded from its folder, ready to act: what ``pickaxe.load`` returns for IPPO, MAPPO
and independent-DQN runs.

:class:`MultiAgentPolicy` rebuilds the run's networks from its ``config.json`` as training built them, loads the
chosen weights through :func:`pickaxe.runs.model.load_model` (digests verified) and acts for every agent at once on a
PettingZoo parallel env's observation dict (each agent's observation flattened and padded into its row as training
did it, ``envs.multiagent.AgentRows``), in the run's own eval envs (:meth:`MultiAgentPolicy.evaluate`: the team's
and each agent's returns the run logged for the same weights) or in any parallel env of the same agents
(:meth:`MultiAgentPolicy.play`, e.g. one made with ``render_mode="human"``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pickaxe.algos.base import Algorithm
from pickaxe.envs.multiagent import AgentRows, MultiAgentVectorEnv, make_parallel_env
from pickaxe.errors import PickaxeError
from pickaxe.runs.model import checkpoint_choice, load_model
from pickaxe.runs.policies import acting_networks
from pickaxe.train.build import build_algorithm, run_eval_envs
from pickaxe.train.config import TrainConfig
from pickaxe.train.multiagent import AGENT_PREFIX, MultiAgentEvaluator
from pickaxe.utils import resolve_device, set_torch_threads

__all__ = ["MultiAgentEpisodes", "MultiAgentPolicy"]


@dataclass(frozen=True)
class MultiAgentEpisodes:
    """Whole episodes played by a multi-agent policy: each one's team return (summed over the agents), each agent's
    return and each episode's length (env steps), in the order the episodes ended."""

    returns: np.ndarray
    agent_returns: dict[str, np.ndarray]
    lengths: np.ndarray

    @property
    def mean_return(self) -> float:
        """The mean team return (NaN for no episode)."""
        return float(np.mean(self.returns)) if len(self.returns) else float("nan")


class MultiAgentPolicy:
    """A multi-agent run's policies at one checkpoint (see the module docstring). ``act`` takes one parallel env's
    observation dict (agent name -> observation, the agents present now) and returns the action of each of them;
    the actions of Box action spaces are clipped to each agent's bounds, as the run's envs clip them."""

    def __init__(
        self, run_dir: Path, config: TrainConfig, algo: Algorithm, which: str | int, device: torch.device,
        rows: AgentRows,
    ) -> None:  # fmt: skip
        self.run_dir, self.config, self.algo, self.checkpoint, self.device = run_dir, config, algo, which, device
        self.rows = rows

    @classmethod
    def load(cls, run_dir: str | Path, config: TrainConfig, checkpoint: str | int = "best",
             device: str | torch.device = "cpu") -> MultiAgentPolicy:  # fmt: skip
        """``config``'s networks (the run's ``config.json``) with the weights of ``checkpoint`` of ``run_dir`` (as
        :func:`pickaxe.runs.model.load_model` takes it), verified, on ``device``; a missing or damaged weights file
        is a one-line ``PickaxeError``."""
        run_dir = Path(run_dir)
        which = checkpoint_choice(checkpoint)
        set_torch_threads(config.torch_threads)
        dev = resolve_device(device)
        config = replace(config, device=str(dev))  # the networks are built on it
        envs = MultiAgentVectorEnv(config.env.id, 1, 0, **config.env.kwargs)
        try:
            algo = build_algorithm(config, envs)
        finally:
            envs.close()
        try:
            load_model(run_dir, acting_networks(algo.networks()), dev, checkpoint=which)
        except FileNotFoundError as e:  # a file that vanished under us: the same one line
            raise PickaxeError(str(e)) from None
        return cls(run_dir, config, algo, which, dev, envs.rows)

    @property
    def agents(self) -> tuple[str, ...]:
        """Every agent the policies act for, in the env's ``possible_agents`` order."""
        return self.rows.agents

    @property
    def module(self) -> torch.nn.Module:
        """The policies' network (one shared, or one per agent inside)."""
        return self.algo.policy  # type: ignore[return-value]

    def act(self, obs: dict[str, Any], deterministic: bool = True) -> dict[str, Any]:
        """The action of every agent in ``obs`` (ints for Discrete actions, arrays for Box ones). ``deterministic=
        False`` samples instead: from IPPO's and MAPPO's distributions; independent DQN's act epsilon-greedily at the
        epsilon its config starts from (the schedule's position is training state, not part of the weights)."""
        unknown = [a for a in obs if a not in self.agents]
        if unknown:
            raise PickaxeError(f"act got an observation of agent {unknown[0]!r}; this run's agents are {self.agents}")
        row = torch.as_tensor(self.rows.obs_row(obs)[None], device=self.device)
        with torch.no_grad():
            actions = self.module.actions(row, deterministic=deterministic)[0].cpu().numpy()
        return {a: self.rows.env_action(j, actions[j]) for j, a in enumerate(self.agents) if a in obs}

    def play(self, env: Any = None, episodes: int = 1, seed: int | None = 0,
             deterministic: bool = True) -> MultiAgentEpisodes:  # fmt: skip
        """Play ``episodes`` whole episodes in ``env`` (a PettingZoo parallel env of the run's agents; default: the
        run's env, made here and closed) and return the team's and each agent's returns. Episode ``k`` starts from
        ``env.reset(seed=seed + k)`` (``seed`` None: unseeded)."""
        own = env is None
        if env is None:
            env = make_parallel_env(self.config.env.id, **self.config.env.kwargs)
        per_agent: list[list[float]] = []
        lengths: list[int] = []
        try:
            for k in range(episodes):
                obs, _ = env.reset(seed=None if seed is None else seed + k)
                totals, length = dict.fromkeys(self.agents, 0.0), 0
                while env.agents:
                    obs, rewards, _, _, _ = env.step(self.act(obs, deterministic))
                    for agent, reward in rewards.items():
                        totals[agent] += float(reward)
                    length += 1
                per_agent.append([totals[a] for a in self.agents])
                lengths.append(length)
        finally:
            if own:
                env.close()
        returns = np.array(per_agent, dtype=np.float64).reshape(len(per_agent), len(self.agents))
        return MultiAgentEpisodes(
            returns.sum(1), {a: returns[:, j] for j, a in enumerate(self.agents)}, np.array(lengths)
        )

    def evaluate(self, episodes: int | None = None) -> MultiAgentEpisodes:
        """Play ``episodes`` (default the run's ``trainer.eval_episodes``) in the run's own eval envs (its eval seed
        and count): the team and per-agent returns the run logged for the same weights."""
        envs = run_eval_envs(self.config)
        try:
            values = MultiAgentEvaluator(envs, episodes or self.config.trainer.eval_episodes, self.device).samples(
                self.algo
            )
        finally:
            envs.close()
        agents = {a: values[f"{AGENT_PREFIX}{a}/return"] for a in self.agents}
        return MultiAgentEpisodes(values["return"], agents, values["length"].astype(np.int64))

    def __repr__(self) -> str:
        return (f"MultiAgentPolicy({str(self.run_dir)!r}, checkpoint={self.checkpoint!r}, "
                f"algo={self.config.algo_name()!r}, env={self.config.env.id!r}, agents={self.agents})")  # fmt: skip
