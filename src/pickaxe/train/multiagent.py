"""The evaluation of multi-agent runs (IPPO, MAPPO on PettingZoo envs): per agent and in total, with CIs
(``train.build.build_multiagent_trainer`` builds the run)."""

from __future__ import annotations

from typing import Any

import numpy as np

from pickaxe.algos.base import Algorithm
from pickaxe.envs.multiagent import MultiAgentVectorEnv
from pickaxe.rollout.multiagent import play_episodes
from pickaxe.train.evaluate import mean_ci


class MultiAgentEvaluator:
    """The deterministic policy on separate eval envs: ``eval/return_mean`` is the episode return summed over the
    agents, ``eval/agent/<name>/return_mean`` each agent's, every mean with its 95% bootstrap CI over episodes."""

    def __init__(self, envs: MultiAgentVectorEnv, episodes: int, device: Any) -> None:
        self.envs, self.episodes, self.device = envs, episodes, device

    def samples(self, algo: Algorithm) -> dict[str, np.ndarray]:
        """Per-episode ``return`` (the total), ``length`` and ``agent/<name>/return``."""
        returns, lengths = play_episodes(algo.policy, self.envs, self.episodes, self.device)
        out = {"return": returns.sum(1), "length": lengths.astype(np.float64)}
        out.update({f"agent/{a}/return": returns[:, j] for j, a in enumerate(self.envs.agents)})
        return out

    def __call__(self, algo: Algorithm) -> dict[str, float]:
        """The eval metrics of ``algo.policy``."""
        values = self.samples(algo)
        out: dict[str, float] = {}
        for key, v in values.items():
            if key == "length":
                continue
            low, high = mean_ci(v)
            name = f"eval/{key}_mean"
            out.update({name: float(v.mean()), f"{name}_ci_low": low, f"{name}_ci_high": high})
        out["eval/return_std"] = float(values["return"].std())
        out["eval/length_mean"] = float(values["length"].mean())
        return out
