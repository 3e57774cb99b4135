"""Test helper: a small Minari dataset of random actions, made on the spot (no download)."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np

from pickaxe.offline.dataset import Episode, write


def random_dataset(out: Path, env_id: str, seeds: tuple[int, ...] = (1, 2)) -> Path:
    """Write one episode of uniformly random actions per reset seed in ``seeds`` (actions seeded with 3) of
    ``env_id`` as a dataset in ``out``, named ``t/<env name>-v0``, and return its folder."""
    env = gym.make(env_id)
    env.action_space.seed(3)
    episodes = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        o, a, r, term, trunc = [obs], [], [], [], []
        done = False
        while not done:
            action = env.action_space.sample()
            obs, reward, terminated, truncated, _ = env.step(action)
            o.append(obs), a.append(action), r.append(reward), term.append(terminated), trunc.append(truncated)
            done = terminated or truncated
        episodes.append(Episode(np.array(o), np.array(a), np.array(r), np.array(term), np.array(trunc)))
    name = env_id.split("-")[0].lower()
    data = write(out, episodes, env.observation_space, env.action_space, f"t/{name}-v0", {}, env_id)
    env.close()
    return data
