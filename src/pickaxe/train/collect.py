"""``pickaxe collect``: a Minari dataset of episodes played by any kept policy of a classic run.

The policy is the run's algorithm rebuilt from its ``config.json`` with the weights of ``--checkpoint`` (final, best,
latest or an env step: a checkpoint or a kept policy), verified as every load is. It acts deterministically, with
``epsilon`` (a uniformly random action with that probability, any action space) or ``noise`` (Gaussian noise of that
std relative to the half-range, Box actions) for less-than-expert data: ``--epsilon 1`` is the random dataset.

The dataset's metadata records where the policy came from (``pickaxe_source``: run, recipe, algorithm, seed,
checkpoint and its env step, config hash, git commit) with the sha256 of the acting weights it loaded, how it acted,
and the D4RL references that normalise scores: ``ref_min_score`` (mean return of uniformly random actions) and
``ref_max_score`` (mean deterministic return of the run's best kept policy), each over ``ref_episodes`` episodes of
the eval seed, unless given.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from pickaxe.envs.make import make
from pickaxe.errors import PickaxeError
from pickaxe.offline.dataset import Episode, write
from pickaxe.runs.model import checkpoint_choice, load_model, weights_source
from pickaxe.runs.policies import acting_networks
from pickaxe.train.build import build_algorithm, config_from_dict, derive_seeds
from pickaxe.train.config import TrainConfig
from pickaxe.train.evaluate import evaluate
from pickaxe.utils import resolve_device, set_torch_threads


def weights_sha256(networks: dict[str, torch.nn.Module]) -> str:
    """sha256 of the networks' weights as loaded (names, dtypes, shapes and bytes in name order): the identity of
    the policy whatever file it came from."""
    h = hashlib.sha256()
    for name in sorted(networks):
        for key, t in sorted(networks[name].state_dict().items()):
            t = t.detach().cpu().contiguous()
            h.update(f"{name}.{key}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return h.hexdigest()


def run_config(run_dir: Path) -> TrainConfig:
    """A classic run's config (one-line ``PickaxeError`` for anything else)."""
    path = run_dir / "config.json"
    if not path.is_file():
        raise PickaxeError(f"{run_dir} is not a run directory (no config.json); pass the folder of a classic run")
    try:
        cfg = config_from_dict(json.loads(path.read_bytes()))
    except ValueError as e:
        raise PickaxeError(f"{path} is unreadable ({e})") from None
    if not isinstance(cfg, TrainConfig):
        raise PickaxeError(f"{run_dir} is an LLM run; pickaxe collect plays classic runs' policies in their envs")
    return cfg


def _actions(
    policy: Any, obs: np.ndarray, space: gym.Space, epsilon: float, noise: float, rng: np.random.Generator, device: Any
) -> np.ndarray:
    """The policy's deterministic actions for ``obs``, made noisy as asked (numpy RNG ``rng`` decides)."""
    with torch.no_grad():
        action, _ = policy.act(torch.as_tensor(obs, dtype=torch.float32, device=device), deterministic=True)
    a = action.cpu().numpy()
    n = len(a)
    if noise > 0:
        low, high = np.asarray(space.low, dtype=np.float64), np.asarray(space.high, dtype=np.float64)
        a = np.clip(a + noise * (high - low) / 2 * rng.standard_normal(a.shape), low, high).astype(a.dtype)
    if epsilon > 0:
        explore = rng.random(n) < epsilon
        if explore.any():
            if isinstance(space, gym.spaces.Discrete):
                random = rng.integers(0, int(space.n), n) + int(space.start)
            else:
                low, high = np.asarray(space.low), np.asarray(space.high)
                random = rng.uniform(low, high, (n, *space.shape))
            a = np.where(explore.reshape(-1, *([1] * (a.ndim - 1))), random, a).astype(a.dtype)
    return a


def play_episodes(
    policy: Any, envs: Any, episodes: int, epsilon: float, noise: float, seed: int, device: Any
) -> list[Episode]:
    """The first ``episodes`` episodes to end across ``envs`` (ordered by when they end, then by sub-env), each with
    its ``T + 1`` observations; the final observation of an episode is the true one (``info["final_obs"]``)."""
    rng = np.random.default_rng(seed)
    space = envs.single_action_space
    obs, _ = envs.reset(seed=seed)
    n = obs.shape[0]
    bufs: list[dict[str, list]] = [{"obs": [obs[i]], "a": [], "r": [], "term": [], "trunc": []} for i in range(n)]
    done_eps: list[Episode] = []
    while len(done_eps) < episodes:
        a = _actions(policy, obs, space, epsilon, noise, rng, device)
        next_obs, reward, term, trunc, info = envs.step(a)
        for i in range(n):
            b = bufs[i]
            b["a"].append(a[i])
            b["r"].append(float(reward[i]))
            b["term"].append(bool(term[i]))
            b["trunc"].append(bool(trunc[i]))
            if term[i] or trunc[i]:
                b["obs"].append(np.asarray(info["final_obs"][i]))
                done_eps.append(
                    Episode(
                        np.stack(b["obs"]),
                        np.stack(b["a"]),
                        np.array(b["r"]),
                        np.array(b["term"]),
                        np.array(b["trunc"]),
                    )
                )
                bufs[i] = {"obs": [next_obs[i]], "a": [], "r": [], "term": [], "trunc": []}
            else:
                b["obs"].append(next_obs[i])
        obs = next_obs
    return done_eps[:episodes]


def random_return(cfg: TrainConfig, episodes: int, seed: int) -> float:
    """Mean return of uniformly random actions over ``episodes`` episodes (D4RL's random reference)."""
    envs = make(cfg.env.id, min(episodes, 8), seed, evaluation=True, **cfg.env.kwargs)
    try:
        space = envs.single_action_space
        rng = np.random.default_rng(seed)
        obs, _ = envs.reset(seed=seed)
        returns: list[float] = []
        totals = np.zeros(obs.shape[0])
        while len(returns) < episodes:
            n = obs.shape[0]
            if isinstance(space, gym.spaces.Discrete):
                a = rng.integers(0, int(space.n), n) + int(space.start)
            else:
                a = rng.uniform(space.low, space.high, (n, *space.shape)).astype(space.dtype)
            obs, reward, term, trunc, _ = envs.step(a)
            totals += reward
            for i in np.flatnonzero(term | trunc):
                returns.append(float(totals[i]))
                totals[i] = 0.0
        return float(np.mean(returns[:episodes]))
    finally:
        envs.close()


def collect(
    run_dir: str | Path,
    out: str | Path,
    episodes: int,
    checkpoint: str | int = "final",
    epsilon: float = 0.0,
    noise: float = 0.0,
    seed: int | None = None,
    envs: int = 8,
    ref_episodes: int = 10,
    ref_min: float | None = None,
    ref_max: float | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """Write ``episodes`` episodes of a run's policy as a Minari dataset in ``out`` (see the module docstring);
    returns a summary (steps, episodes, mean return, references, weights sha256). Everything the command line can
    get wrong is a one-line ``PickaxeError`` before any episode is played."""
    run_dir, out = Path(run_dir), Path(out)
    if episodes < 1:
        raise PickaxeError(f"--episodes must be at least 1, got {episodes}")
    if not 0 <= epsilon <= 1:
        raise PickaxeError(f"--epsilon must be in [0, 1], got {epsilon}")
    if noise < 0:
        raise PickaxeError(f"--noise must be >= 0, got {noise}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PickaxeError(f"{out} already exists and is not empty; choose another --out or remove it")
    cfg = run_config(run_dir)
    which = checkpoint_choice(checkpoint)
    set_torch_threads(cfg.torch_threads)
    dev = resolve_device(device)
    seed = derive_seeds(cfg.seed)["eval_env"] if seed is None else seed
    vec = make(cfg.env.id, max(1, min(envs, episodes)), seed, **cfg.env.kwargs)
    try:
        space = vec.single_action_space
        if noise > 0 and not isinstance(space, gym.spaces.Box):
            raise PickaxeError(f"--noise needs Box actions; {cfg.env.id} has {space}: use --epsilon")
        algo = build_algorithm(cfg, vec)
        networks = acting_networks(algo.networks())
        load_model(run_dir, networks, dev, checkpoint=which)
        digest = weights_sha256(networks)
        played = play_episodes(algo.policy, vec, episodes, epsilon, noise, seed, dev)
        if ref_max is None:
            expert = build_algorithm(cfg, vec)
            try:
                load_model(run_dir, acting_networks(expert.networks()), dev, checkpoint="best")
            except PickaxeError:  # a run without evaluations: the collected policy is the reference
                expert = algo
            eval_envs = make(cfg.env.id, min(ref_episodes, 10), seed + 1, evaluation=True, **cfg.env.kwargs)
            try:
                ref_max = float(evaluate(expert.policy, eval_envs, ref_episodes, dev)[0].mean())
            finally:
                eval_envs.close()
        if ref_min is None:
            ref_min = random_return(cfg, ref_episodes, seed + 2)
        source = weights_source(run_dir, json.loads((run_dir / "config.json").read_bytes()), which)
        returns = [float(ep.reward.sum()) for ep in played]
        metadata = {
            "algorithm_name": f"pickaxe {cfg.algo_name()} ({cfg.recipe})",
            "author": {"pickaxe collect"},
            "description": f"{episodes} episodes of {run_dir.name} at {which} (epsilon {epsilon}, noise {noise})",
            "ref_min_score": ref_min,
            "ref_max_score": ref_max,
            "num_episodes_average_score": ref_episodes,
            "pickaxe_source": {**source, "weights_sha256": digest},
            "pickaxe_collect": {"epsilon": epsilon, "noise": noise, "seed": seed, "env_id": cfg.env.id,
                                "env_kwargs": cfg.env.kwargs, "return_mean": float(np.mean(returns))},
        }  # fmt: skip
        dataset_id = f"pickaxe/{out.resolve().name}-v0"
        write(out, played, vec.single_observation_space, space, dataset_id, metadata, env_id=cfg.env.id)
    finally:
        vec.close()
    return {
        "out": str(out),
        "episodes": len(played),
        "steps": int(sum(len(ep) for ep in played)),
        "return_mean": float(np.mean(returns)),
        "ref_min_score": ref_min,
        "ref_max_score": ref_max,
        "weights_sha256": digest,
    }
