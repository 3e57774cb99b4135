"""DDPG with hindsight experience replay side by side with Tianshou 2.0.1 (issue 30) on ``pickaxe/PointGoal-v0``:
env steps and wall time to an evaluation success rate of 0.9, over seeds.

pickaxe runs its recipe ``pointgoal-her-ddpg`` unchanged but for the seed and the budget. Tianshou runs the pattern
of its own HER example (``examples/mujoco/fetch_her_ddpg.py`` of thu-ml/tianshou: ``DDPG`` with a
``HERVectorReplayBuffer`` over envs wrapped in ``TruncatedAsTerminated``, ``get_dict_state_decorator`` networks,
``GaussianNoise``, random warm-up steps; its networks read the observation and both goals, pickaxe's the
observation and the desired goal) with the recipe's settings, mapped one to one (``TIANSHOU`` below): 4
training envs, 64x64 ReLU nets, lr 1e-3 for actor and critic, gamma 0.95, tau 0.05, batch 256, noise 0.2, 500 random
warm-up steps, 32-step collects with 16 gradient steps each, 4 of every 5 sampled transitions relabelled with a future
goal (the recipe's ``her_k`` 4 is Tianshou's ``future_k`` 5).

The same target and evaluation for both: every 1,000 env steps, 50 deterministic episodes on separate eval envs, the
success rate (``info["is_success"]`` at an episode's last step) reaching 0.9 stops the run (Tianshou: its
``compute_score_fn`` is the success rate and its ``stop_fn`` the target). Env steps count every training env step,
warm-up included. Wall and process-CPU seconds run from before the networks are built to the end of the run (each
stops at the target). One run at a time, pickaxe then Tianshou per seed, torch one thread. Usage::

    python benchmarks/tianshou_her.py --seeds 3
    python benchmarks/tianshou_her.py --seeds 1 --budget 2000     # a smoke run

The last line printed is one JSON object: both libraries' env steps and seconds to the target per seed (null: not
reached within the budget), the best success rate, the medians and the ratios pickaxe / Tianshou.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from pickaxe.cli import main
from pickaxe.envs.goals import POINT_GOAL_ID, register
from pickaxe.recipes import get_recipe
from pickaxe.runs.run import read_metrics

os.environ.setdefault("TQDM_DISABLE", "1")
RECIPE, TARGET, PERIOD, EPISODES, BUDGET = "pointgoal-her-ddpg", 0.9, 1_000, 50, 10_000
TIANSHOU: dict[str, Any] = {
    "num_training_envs": 4, "hidden_sizes": [64, 64], "actor_lr": 1e-3, "critic_lr": 1e-3, "gamma": 0.95,
    "tau": 0.05, "batch_size": 256, "exploration_noise": 0.2, "start_timesteps": 500, "buffer_size": 100_000,
    "collection_step_num_env_steps": 32, "update_per_step": 0.5, "her_horizon": 30, "her_future_k": 5,
    "num_test_envs": 10,
}  # fmt: skip


def run_pickaxe(seed: int, budget: int, run: Path) -> dict[str, Any]:
    """One run of the recipe (it stops at an eval success rate of 0.9): env steps and seconds to the target."""
    shutil.rmtree(run, ignore_errors=True)
    args = ["train", RECIPE, "--seed", str(seed), "--device", "cpu", "--trainer.total-steps", str(budget)]
    wall, cpu = time.perf_counter(), time.process_time()
    code = main([*args, "--torch-threads", "1", "--run-dir", str(run), "--no-progress"])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if code != 0:
        raise SystemExit(f"pickaxe {RECIPE} seed {seed} failed with exit status {code}")
    evals = [r for r in read_metrics(run) if "eval/success_rate" in r]
    hit = next((r for r in evals if r["eval/success_rate"] >= TARGET), None)
    return {
        "steps": int(hit["step"]) if hit else None,
        "wall_s": wall if hit else None,
        "cpu_s": cpu if hit else None,
        "trained_steps": int(evals[-1]["step"]) if evals else 0,
        "best_success": max(float(r["eval/success_rate"]) for r in evals) if evals else None,
        "run_wall_s": wall,
    }


class Recorded(gym.Wrapper):
    """Counts the env steps taken and appends each finished episode's success to ``log``."""

    def __init__(self, env: gym.Env, log: list[float], steps: list[int]) -> None:
        super().__init__(env)
        self.log, self.steps = log, steps

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        """One step, recorded."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps[0] += 1
        if terminated or truncated:
            self.log.append(float(info["is_success"]))
        return obs, reward, terminated, truncated, info


def run_tianshou(seed: int, budget: int) -> dict[str, Any]:
    """One Tianshou run (its HER example's pattern, the recipe's settings), stopping at a success rate of 0.9."""
    from tianshou.algorithm import DDPG
    from tianshou.algorithm.modelfree.ddpg import ContinuousDeterministicPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector, HERVectorReplayBuffer
    from tianshou.env import DummyVectorEnv, TruncatedAsTerminated
    from tianshou.exploration import GaussianNoise
    from tianshou.trainer import OffPolicyTrainerParams
    from tianshou.utils.net.common import Net, get_dict_state_decorator
    from tianshou.utils.net.continuous import ContinuousActorDeterministic, ContinuousCritic

    a = TIANSHOU
    wall, cpu = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    np.random.seed(seed)
    train_log: list[float] = []
    test_log: list[float] = []
    steps = [0]

    def make(log: list[float], counter: list[int]) -> gym.Env:
        return Recorded(TruncatedAsTerminated(gym.make(POINT_GOAL_ID)), log, counter)

    env = gym.make(POINT_GOAL_ID)
    train_envs = DummyVectorEnv([lambda: make(train_log, steps) for _ in range(a["num_training_envs"])])
    test_envs = DummyVectorEnv([lambda: make(test_log, [0]) for _ in range(a["num_test_envs"])])
    train_envs.seed(seed)
    test_envs.seed(seed + 10_000)
    shapes = {k: env.observation_space[k].shape for k in ("observation", "achieved_goal", "desired_goal")}
    dec, flat = get_dict_state_decorator(state_shape=shapes, keys=["observation", "achieved_goal", "desired_goal"])
    actor = dec(ContinuousActorDeterministic)(
        preprocess_net=dec(Net)(state_shape=flat, hidden_sizes=a["hidden_sizes"]),
        action_shape=env.action_space.shape,
        max_action=1.0,
    )
    net_c = dec(Net)(state_shape=flat, action_shape=env.action_space.shape, hidden_sizes=a["hidden_sizes"], concat=True)
    critic = dec(ContinuousCritic)(preprocess_net=net_c)
    policy = ContinuousDeterministicPolicy(
        actor=actor, exploration_noise=GaussianNoise(sigma=a["exploration_noise"]), action_space=env.action_space
    )
    algorithm = DDPG(
        policy=policy,
        policy_optim=AdamOptimizerFactory(lr=a["actor_lr"]),
        critic=critic,
        critic_optim=AdamOptimizerFactory(lr=a["critic_lr"]),
        tau=a["tau"],
        gamma=a["gamma"],
    )
    unwrapped = env.unwrapped
    buffer = HERVectorReplayBuffer(
        a["buffer_size"],
        len(train_envs),
        compute_reward_fn=lambda ag, g: unwrapped.compute_reward(ag, g, {}),
        horizon=a["her_horizon"],
        future_k=a["her_future_k"],
    )
    train = Collector(algorithm, train_envs, buffer, exploration_noise=True)
    test = Collector(algorithm, test_envs)
    train.reset()
    train.collect(n_step=a["start_timesteps"], random=True)
    history: list[tuple[int, float]] = []

    def clear(epoch: int, env_step: int | None) -> None:
        test_log.clear()

    def success(stats: Any) -> float:
        rate = float(np.mean(test_log[:EPISODES])) if test_log else 0.0
        history.append((steps[0], rate))
        return rate

    result = algorithm.run_training(
        OffPolicyTrainerParams(
            training_collector=train,
            test_collector=test,
            max_epochs=max(math.ceil((budget - a["start_timesteps"]) / PERIOD), 1),
            epoch_num_steps=PERIOD,
            collection_step_num_env_steps=a["collection_step_num_env_steps"],
            update_step_num_gradient_steps_per_sample=a["update_per_step"],
            batch_size=a["batch_size"],
            test_step_num_episodes=EPISODES,
            test_fn=clear,
            compute_score_fn=success,
            stop_fn=lambda score: score >= TARGET,
            test_in_training=False,
            verbose=False,
            show_progress=False,
        )
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    hit = next((s for s, rate in history if rate >= TARGET), None)
    return {
        "steps": hit,
        "wall_s": wall if hit is not None else None,
        "cpu_s": cpu if hit is not None else None,
        "trained_steps": steps[0],
        "best_success": max((rate for _, rate in history), default=None),
        "run_wall_s": wall,
        "evaluations": history,
        "best_score": float(result.best_score),
    }


def median_or_inf(xs: list[float | None]) -> float:
    """Median with unsolved seeds (None) counting as infinitely slow."""
    return float(statistics.median([math.inf if x is None else x for x in xs]))


def summary(rows: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    """Both libraries' per-seed steps / seconds and medians; ratios pickaxe / Tianshou of the medians."""
    out: dict[str, Any] = {"budget": budget, "settings_tianshou": TIANSHOU}
    for lib in ("pickaxe", "tianshou"):
        group = [r for r in rows if r["lib"] == lib]
        out[lib] = {k: [r[k] for r in group] for k in ("steps", "wall_s", "cpu_s", "best_success")}
        out[lib]["solved"] = sum(r["steps"] is not None for r in group)
        for k in ("steps", "wall_s", "cpu_s"):
            m = median_or_inf(out[lib][k])
            out[lib][f"median_{k}"] = None if math.isinf(m) else m
    for k in ("steps", "wall_s", "cpu_s"):
        p, t = out["pickaxe"][f"median_{k}"], out["tianshou"][f"median_{k}"]
        out[f"{k.removesuffix('_s')}_ratio"] = p / t if p is not None and t is not None else None
    return out


def cli(argv: list[str] | None = None) -> None:
    """Parse the options, run both libraries seed by seed, print one line per run and the JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/tianshou-her", help="folder of pickaxe's run folders")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=BUDGET, help="env steps per run, both libraries")
    args = parser.parse_args(argv)
    try:
        import tianshou
    except ImportError:
        raise SystemExit(
            "Tianshou is not installed; fix: pip install -r benchmarks/requirements-baselines.txt"
        ) from None
    register()
    assert get_recipe(RECIPE).trainer.target_return == TARGET
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.2f}, tianshou {tianshou.__version__}, torch {torch.__version__}")
    rows: list[dict[str, Any]] = []
    for seed in range(args.seeds):
        p = run_pickaxe(seed, args.budget, Path(args.out) / f"s{seed}")
        t = run_tianshou(seed, args.budget)
        for lib, r in (("pickaxe", p), ("tianshou", t)):
            rows.append({"lib": lib, "seed": seed, **r})
            print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"load_average_end": os.getloadavg()[0], "result": summary(rows, args.budget), "runs": rows}))


if __name__ == "__main__":
    cli()
