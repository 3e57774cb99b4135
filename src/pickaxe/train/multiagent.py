"""The evaluation of multi-agent runs (IPPO, MAPPO, independent DQN on PettingZoo envs): per agent and in total,
with CIs (``train.build.build_multiagent_trainer`` builds the run; ``pickaxe eval`` and ``pickaxe eval
--checkpoints`` summarise the same per-episode values with :func:`multiagent_estimates`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from pickaxe.algos.base import Algorithm
from pickaxe.envs.multiagent import MultiAgentVectorEnv
from pickaxe.eval.stats import iqm, stratified_bootstrap_ci
from pickaxe.rollout.multiagent import play_episodes
from pickaxe.train.evaluate import BOOTSTRAP_REPS, Estimate, mean_ci

AGENT_PREFIX = "agent/"
"""Per-agent sample keys are ``agent/<name>/return``; their metrics ``eval/agent/<name>/return_mean``."""


class MultiAgentEvaluator:
    """The deterministic policy on separate eval envs: ``eval/return_mean`` is the episode return summed over the
    agents, ``eval/agent/<name>/return_mean`` each agent's, every mean with its 95% bootstrap CI over episodes."""

    def __init__(self, envs: MultiAgentVectorEnv, episodes: int, device: Any) -> None:
        self.envs, self.episodes, self.device = envs, episodes, device

    def samples(self, algo: Algorithm) -> dict[str, np.ndarray]:
        """Per-episode ``return`` (the total), ``length`` and ``agent/<name>/return``."""
        returns, lengths = play_episodes(algo.policy, self.envs, self.episodes, self.device)
        out = {"return": returns.sum(1), "length": lengths.astype(np.float64)}
        out.update({f"{AGENT_PREFIX}{a}/return": returns[:, j] for j, a in enumerate(self.envs.agents)})
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


def multiagent_estimates(values: dict[str, np.ndarray]) -> dict[str, Estimate]:
    """The evaluation of one set of weights from :meth:`MultiAgentEvaluator.samples`: the total's
    ``eval/return_mean`` and ``eval/return_iqm``, each agent's ``eval/agent/<name>/return_mean`` and ``_iqm``, and
    ``eval/length_mean``; every mean with the 95% bootstrap CI the run's evaluations log (the same numbers), every
    IQM with its stratified-bootstrap CI."""
    out: dict[str, Estimate] = {}
    for key, v in values.items():
        if key == "length":
            continue
        v = np.asarray(v, dtype=np.float64)
        n = len(v)
        out[f"eval/{key}_mean"] = Estimate(float(v.mean()), *mean_ci(v), n)
        out[f"eval/{key}_iqm"] = Estimate(float(iqm(v)), *stratified_bootstrap_ci(v, iqm, BOOTSTRAP_REPS, seed=0), n)
    length = np.asarray(values["length"], dtype=np.float64)
    out["eval/length_mean"] = Estimate(float(length.mean()), *mean_ci(length), len(length))
    return out
