"""Online algorithms side by side with Tianshou 2.0.1 (issue 30): REINFORCE, NPG and TRPO on CartPole-v1, REDQ on
Pendulum-v1, IQN and FQF on CartPole-v1; env steps and wall time to the same target over seeds.

Each library runs its own settings. pickaxe: its recipes (``cartpole-reinforce``, ``cartpole-npg``,
``cartpole-trpo``, ``pendulum-redq``, ``cartpole-iqn``, ``cartpole-fqf``) unchanged but for the budget. Tianshou:
the settings of its own examples for the algorithm (``test/discrete/test_reinforce.py``,
``test/continuous/test_npg.py`` and ``test_trpo.py``, ``test/continuous/test_redq.py``,
``test/discrete/test_iqn.py`` and ``test_fqf.py`` of thu-ml/tianshou, quoted in ``TIANSHOU``), its own
``OnPolicyTrainer`` / ``OffPolicyTrainer`` with ``test_in_training`` as there. Tianshou has NPG and TRPO examples on
Pendulum only; on CartPole they run those examples' settings with a categorical actor and a discrete critic.

The same target and evaluation for both: the recipe's target return (CartPole 475, Pendulum -250) as the mean of 10
deterministic episodes (greedy for IQN and FQF; Tianshou's examples test with epsilon 0.05, here 0), at pickaxe's
evaluation period (Tianshou: ``epoch_num_steps`` set to it; with ``test_in_training`` Tianshou also tests whenever
its training episodes reach the target, so it can stop between periods), within the same env-step budget. Env steps
count every env step taken, Tianshou's warm-up collection included. Wall and process-CPU seconds run from before
the networks are built to the evaluation that reached the target (or the budget's end). One run at a time, pickaxe
then Tianshou per seed, torch one thread. Usage::

    python benchmarks/tianshou_online.py --seeds 3
    python benchmarks/tianshou_online.py --algos reinforce --seeds 1 --budget reinforce=4096   # a smoke run
    python benchmarks/tianshou_online.py --algos iqn,fqf --also-target iqn=195 --also-target fqf=195

``--also-target ALGO=RETURN`` also reports each run's env steps to a second, lower return (Tianshou's own CartPole
tests stop at 195), read off the same evaluations: the first of pickaxe's evaluations, and of Tianshou's test
episodes, whose mean reaches it. Runs still stop at the recipe's target, so one run gives both figures.

The last line printed is one JSON object: per algorithm both libraries' env steps and seconds to the target per
seed (null: not reached within the budget), the best evaluation's return, medians (unsolved seeds count as
infinitely slow) and the ratios.
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

import numpy as np
import torch

from pickaxe.cli import main
from pickaxe.recipes import get_recipe
from pickaxe.runs.run import read_metrics

os.environ.setdefault("TQDM_DISABLE", "1")  # Tianshou's per-update progress bars

TIANSHOU_MISSING = "Tianshou is not installed; fix: pip install -r benchmarks/requirements-baselines.txt"

# algorithm -> (pickaxe recipe, default env-step budget for both)
ALGOS: dict[str, tuple[str, int]] = {
    "reinforce": ("cartpole-reinforce", 50_000),
    "npg": ("cartpole-npg", 50_000),
    "trpo": ("cartpole-trpo", 50_000),
    "redq": ("pendulum-redq", 10_000),
    "iqn": ("cartpole-iqn", 30_000),
    "fqf": ("cartpole-fqf", 30_000),
}

# Tianshou's example settings (thu-ml/tianshou, test/*/test_<algo>.py get_args), the test budget and test episodes
# left out (ours apply).
TIANSHOU: dict[str, dict[str, Any]] = {
    "reinforce": {
        "lr": 1e-3, "gamma": 0.95, "collection_step_num_episodes": 8, "update_step_num_repetitions": 2,
        "batch_size": 64, "hidden_sizes": [64, 64], "num_training_envs": 8, "return_scaling": True,
        "buffer_size": 20_000, "init": "orthogonal, gain sqrt(2)",
    },
    "npg": {
        "lr": 1e-3, "gamma": 0.95, "collection_step_num_env_steps": 2048, "batch_size": 99_999,
        "hidden_sizes": [64, 64], "activation": "tanh", "num_training_envs": 16, "gae_lambda": 0.95,
        "return_scaling": True, "advantage_normalization": True, "optim_critic_iters": 5,
        "trust_region_size": 0.5, "buffer_size": 50_000, "init": "orthogonal",
    },
    "trpo": {
        "lr": 1e-3, "gamma": 0.95, "collection_step_num_env_steps": 2048, "batch_size": 99_999,
        "hidden_sizes": [64, 64], "activation": "tanh", "num_training_envs": 16, "gae_lambda": 0.95,
        "return_scaling": True, "advantage_normalization": True, "optim_critic_iters": 5, "max_kl": 0.005,
        "backtrack_coeff": 0.8, "max_backtracks": 10, "buffer_size": 50_000, "init": "orthogonal",
    },
    "redq": {
        "ensemble_size": 4, "subset_size": 2, "actor_lr": 1e-4, "critic_lr": 1e-3, "gamma": 0.99, "tau": 0.005,
        "alpha": 0.2, "start_timesteps": 1000, "collection_step_num_env_steps": 1, "update_per_step": 3,
        "n_step": 1, "batch_size": 64, "target_mode": "min", "hidden_sizes": [64, 64], "num_training_envs": 8,
        "buffer_size": 20_000,
    },
    "iqn": {
        "eps_train": 0.1, "lr": 3e-3, "gamma": 0.9, "sample_size": 32, "online_sample_size": 8,
        "target_sample_size": 8, "num_cosines": 64, "n_step": 3, "target_update_freq": 320,
        "collection_step_num_env_steps": 10, "update_per_step": 0.1, "batch_size": 64, "hidden_sizes": [64, 64, 64],
        "num_training_envs": 10, "buffer_size": 20_000,
    },
    "fqf": {
        "eps_train": 0.1, "lr": 3e-3, "fraction_lr": 2.5e-9, "gamma": 0.9, "num_fractions": 32, "num_cosines": 64,
        "ent_coef": 10.0, "n_step": 3, "target_update_freq": 320, "collection_step_num_env_steps": 10,
        "update_per_step": 0.1, "batch_size": 64, "hidden_sizes": [64, 64, 64], "num_training_envs": 10,
        "buffer_size": 20_000,
    },
}  # fmt: skip


def run_pickaxe(algo: str, seed: int, budget: int, run: Path, also: float | None = None) -> dict[str, Any]:
    """One pickaxe run of the algorithm's recipe (stopping at its target): env steps and seconds to the target, and
    env steps to the return ``also`` (first evaluation reaching it) where given."""
    recipe = ALGOS[algo][0]
    target = get_recipe(recipe).trainer.target_return
    args = ["train", recipe, "--seed", str(seed), "--device", "cpu", "--trainer.total-steps", str(budget)]
    shutil.rmtree(run, ignore_errors=True)
    wall, cpu = time.perf_counter(), time.process_time()
    code = main([*args, "--run-dir", str(run), "--no-progress"])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if code != 0:
        raise SystemExit(f"pickaxe {recipe} seed {seed} failed with exit status {code}")
    evals = [r for r in read_metrics(run) if "eval/return_mean" in r]
    hit = next((r for r in evals if r["eval/return_mean"] >= target), None)
    low = next((r for r in evals if also is not None and r["eval/return_mean"] >= also), None)
    return {
        "steps": int(hit["step"]) if hit else None,
        "wall_s": wall if hit else None,
        "cpu_s": cpu if hit else None,
        "trained_steps": int(evals[-1]["step"]) if evals else 0,
        "best_return": max(float(r["eval/return_mean"]) for r in evals) if evals else None,
        "run_wall_s": wall,
        "steps_also": int(low["step"]) if low else None,
    }


def tianshou_setup(algo: str, env_id: str, seed: int) -> tuple[Any, Any, dict[str, Any]]:
    """Tianshou's algorithm, training envs and the trainer keyword arguments of its example for ``algo``."""
    import gymnasium as gym
    from tianshou.algorithm import FQF, IQN, NPG, REDQ, TRPO, Reinforce
    from tianshou.algorithm.modelfree.fqf import FQFPolicy
    from tianshou.algorithm.modelfree.iqn import IQNPolicy
    from tianshou.algorithm.modelfree.redq import REDQPolicy
    from tianshou.algorithm.modelfree.reinforce import ProbabilisticActorPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory, RMSpropOptimizerFactory
    from tianshou.env import DummyVectorEnv
    from tianshou.utils.net.common import EnsembleLinear, Net
    from tianshou.utils.net.continuous import ContinuousActorProbabilistic, ContinuousCritic
    from tianshou.utils.net.discrete import (
        DiscreteActor,
        DiscreteCritic,
        FractionProposalNetwork,
        FullQuantileFunction,
        ImplicitQuantileNetwork,
    )
    from torch import nn
    from torch.distributions import Categorical

    a = TIANSHOU[algo]
    env = gym.make(env_id)
    obs, space = env.observation_space.shape, env.action_space
    train_envs = DummyVectorEnv([lambda: gym.make(env_id) for _ in range(a["num_training_envs"])])
    train_envs.seed(seed)
    kwargs: dict[str, Any] = {"batch_size": a["batch_size"]}
    if algo == "reinforce":
        net = Net(state_shape=obs, action_shape=space.n, hidden_sizes=a["hidden_sizes"], softmax=True)
        for m in net.modules():
            if isinstance(m, nn.Linear):
                nn.init.orthogonal_(m.weight, gain=np.sqrt(2))
                nn.init.zeros_(m.bias)
        policy = ProbabilisticActorPolicy(actor=net, dist_fn=Categorical, action_space=space, action_scaling=False)
        algorithm = Reinforce(
            policy=policy,
            optim=AdamOptimizerFactory(lr=a["lr"]),
            gamma=a["gamma"],
            return_standardization=a["return_scaling"],
        )
        kwargs |= {
            "collection_step_num_episodes": a["collection_step_num_episodes"],
            "collection_step_num_env_steps": None,
            "update_step_num_repetitions": a["update_step_num_repetitions"],
        }
    elif algo in ("npg", "trpo"):
        actor = DiscreteActor(
            preprocess_net=Net(state_shape=obs, hidden_sizes=a["hidden_sizes"], activation=nn.Tanh),
            action_shape=space.n,
        )
        critic = DiscreteCritic(preprocess_net=Net(state_shape=obs, hidden_sizes=a["hidden_sizes"], activation=nn.Tanh))
        for m in list(actor.modules()) + list(critic.modules()):
            if isinstance(m, nn.Linear):
                nn.init.orthogonal_(m.weight)
                nn.init.zeros_(m.bias)
        policy = ProbabilisticActorPolicy(
            actor=actor, dist_fn=Categorical, action_space=space, deterministic_eval=True, action_scaling=False
        )
        common = {
            "policy": policy,
            "critic": critic,
            "optim": AdamOptimizerFactory(lr=a["lr"]),
            "gamma": a["gamma"],
            "return_scaling": a["return_scaling"],
            "advantage_normalization": a["advantage_normalization"],
            "gae_lambda": a["gae_lambda"],
            "optim_critic_iters": a["optim_critic_iters"],
        }
        if algo == "npg":
            algorithm = NPG(**common, trust_region_size=a["trust_region_size"])
        else:
            algorithm = TRPO(
                **common, max_kl=a["max_kl"], backtrack_coeff=a["backtrack_coeff"], max_backtracks=a["max_backtracks"]
            )
        kwargs |= {"collection_step_num_env_steps": a["collection_step_num_env_steps"]}
    elif algo == "redq":
        actor = ContinuousActorProbabilistic(
            preprocess_net=Net(state_shape=obs, hidden_sizes=a["hidden_sizes"]),
            action_shape=space.shape,
            unbounded=True,
            conditioned_sigma=True,
        )

        def linear(x: int, y: int) -> nn.Module:
            return EnsembleLinear(a["ensemble_size"], x, y)

        net_c = Net(
            state_shape=obs, action_shape=space.shape, hidden_sizes=a["hidden_sizes"], concat=True, linear_layer=linear
        )
        critic = ContinuousCritic(preprocess_net=net_c, linear_layer=linear, flatten_input=False)
        algorithm = REDQ(
            policy=REDQPolicy(actor=actor, action_space=space),
            policy_optim=AdamOptimizerFactory(lr=a["actor_lr"]),
            critic=critic,
            critic_optim=AdamOptimizerFactory(lr=a["critic_lr"]),
            ensemble_size=a["ensemble_size"],
            subset_size=a["subset_size"],
            tau=a["tau"],
            gamma=a["gamma"],
            alpha=a["alpha"],
            n_step_return_horizon=a["n_step"],
            actor_delay=a["update_per_step"],
            target_mode=a["target_mode"],
        )
        kwargs |= {
            "collection_step_num_env_steps": a["collection_step_num_env_steps"],
            "update_step_num_gradient_steps_per_sample": a["update_per_step"],
        }
    else:
        hidden = a["hidden_sizes"]
        feature = Net(state_shape=obs, action_shape=hidden[-1], hidden_sizes=hidden[:-1], softmax=False)
        if algo == "iqn":
            net = ImplicitQuantileNetwork(preprocess_net=feature, action_shape=space.n, num_cosines=a["num_cosines"])
            policy = IQNPolicy(
                model=net,
                action_space=space,
                sample_size=a["sample_size"],
                online_sample_size=a["online_sample_size"],
                target_sample_size=a["target_sample_size"],
                eps_training=a["eps_train"],
                eps_inference=0.0,
            )
            algorithm = IQN(
                policy=policy,
                optim=AdamOptimizerFactory(lr=a["lr"]),
                gamma=a["gamma"],
                n_step_return_horizon=a["n_step"],
                target_update_freq=a["target_update_freq"],
            )
        else:
            net = FullQuantileFunction(
                preprocess_net=feature, action_shape=space.n, hidden_sizes=hidden, num_cosines=a["num_cosines"]
            )
            policy = FQFPolicy(
                model=net,
                fraction_model=FractionProposalNetwork(a["num_fractions"], net.input_dim),
                action_space=space,
                eps_training=a["eps_train"],
                eps_inference=0.0,
            )
            algorithm = FQF(
                policy=policy,
                optim=AdamOptimizerFactory(lr=a["lr"]),
                fraction_optim=RMSpropOptimizerFactory(lr=a["fraction_lr"]),
                gamma=a["gamma"],
                num_fractions=a["num_fractions"],
                ent_coef=a["ent_coef"],
                n_step_return_horizon=a["n_step"],
                target_update_freq=a["target_update_freq"],
            )
        eps = a["eps_train"]

        def training_fn(epoch: int, env_step: int) -> None:  # the examples' epsilon schedule
            if env_step <= 10_000:
                policy.set_eps_training(eps)
            elif env_step <= 50_000:
                policy.set_eps_training(eps - (env_step - 10_000) / 40_000 * (0.9 * eps))
            else:
                policy.set_eps_training(0.1 * eps)

        kwargs |= {
            "collection_step_num_env_steps": a["collection_step_num_env_steps"],
            "update_step_num_gradient_steps_per_sample": a["update_per_step"],
            "training_fn": training_fn,
        }
    return algorithm, train_envs, kwargs


def run_tianshou(algo: str, seed: int, budget: int, also: float | None = None) -> dict[str, Any]:
    """One Tianshou run with its example's settings, stopping when 10 deterministic test episodes reach the target;
    env steps to the return ``also`` (the first test whose mean reaches it) where given."""
    import gymnasium as gym
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.trainer import OffPolicyTrainerParams, OnPolicyTrainerParams
    from tianshou.utils.torch_utils import policy_within_training_step

    recipe = get_recipe(ALGOS[algo][0])
    target, period = float(recipe.trainer.target_return), int(recipe.trainer.eval_every)
    env_id = recipe.env.id
    a = TIANSHOU[algo]
    wall, cpu = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    np.random.seed(seed)
    algorithm, train_envs, kwargs = tianshou_setup(algo, env_id, seed)
    test_envs = DummyVectorEnv([lambda: gym.make(env_id) for _ in range(10)])
    test_envs.seed(seed + 10_000)
    buffer = VectorReplayBuffer(a["buffer_size"], len(train_envs))
    explore = algo in ("redq", "iqn", "fqf")
    train = Collector(algorithm, train_envs, buffer, exploration_noise=explore)
    test = Collector(algorithm, test_envs)
    env_step: list[int] = [0]  # the trainer's env step at its latest test
    low: list[int | None] = [None]  # env steps (warm-up included) at the first test whose mean reaches ``also``
    collect = test.collect

    def collect_noting(*args: Any, **kw: Any) -> Any:  # the test collector, noting the first test reaching ``also``
        stats = collect(*args, **kw)
        mean = stats.returns_stat.mean if stats.returns_stat is not None else -math.inf
        if also is not None and low[0] is None and mean >= also:
            low[0] = warmup + env_step[0]
        return stats

    test.collect = collect_noting  # type: ignore[method-assign]
    warmup = 0
    train.reset()
    if algo == "redq":
        warmup = a["start_timesteps"]
        train.collect(n_step=warmup, random=True)
    elif algo in ("iqn", "fqf"):
        warmup = a["batch_size"] * a["num_training_envs"]
        with policy_within_training_step(algorithm.policy):
            train.collect(n_step=warmup)
    common = {
        "training_collector": train,
        "test_collector": test,
        "max_epochs": max(math.ceil((budget - warmup) / period), 1),
        "epoch_num_steps": min(period, budget),
        "test_step_num_episodes": 10,
        "stop_fn": lambda mean: mean >= target,
        "test_fn": lambda epoch, step: env_step.__setitem__(0, step),
        "test_in_training": True,
        "verbose": False,
        "show_progress": False,
    }
    params = (OnPolicyTrainerParams if algo in ("reinforce", "npg", "trpo") else OffPolicyTrainerParams)(
        **common, **kwargs
    )
    result = algorithm.run_training(params)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    steps = warmup + int(result.train_step)
    solved = result.best_reward >= target
    return {
        "steps": steps if solved else None,
        "wall_s": wall if solved else None,
        "cpu_s": cpu if solved else None,
        "trained_steps": steps,
        "best_return": float(result.best_reward),
        "run_wall_s": wall,
        "steps_also": low[0],
    }


def median_or_inf(xs: list[float | None]) -> float:
    """Median with unsolved seeds (None) counting as infinitely slow."""
    return float(statistics.median([math.inf if x is None else x for x in xs]))


def summary(
    rows: list[dict[str, Any]], budgets: dict[str, int], also: dict[str, float] | None = None
) -> dict[str, Any]:
    """Per algorithm: both libraries' per-seed steps / seconds and medians; ratios pickaxe / Tianshou of medians;
    with ``also`` given for the algorithm, the per-seed env steps to that return (``steps_also``) too."""
    also = also or {}
    out: dict[str, Any] = {}
    for algo in dict.fromkeys(r["algo"] for r in rows):
        entry: dict[str, Any] = {"budget": budgets[algo], "settings_tianshou": TIANSHOU[algo]}
        if algo in also:
            entry["also_target"] = also[algo]
        for lib in ("pickaxe", "tianshou"):
            group = [r for r in rows if r["algo"] == algo and r["lib"] == lib]
            entry[lib] = {k: [r[k] for r in group] for k in ("steps", "wall_s", "cpu_s", "best_return", "steps_also")}
            entry[lib]["solved"] = sum(r["steps"] is not None for r in group)
            for k in ("steps", "wall_s", "cpu_s"):
                m = median_or_inf(entry[lib][k])
                entry[lib][f"median_{k}"] = None if math.isinf(m) else m
        for k in ("steps", "wall_s", "cpu_s"):
            p, t = entry["pickaxe"][f"median_{k}"], entry["tianshou"][f"median_{k}"]
            entry[f"{k.removesuffix('_s')}_ratio"] = p / t if p is not None and t is not None else None
        out[algo] = entry
    return out


def table(result: dict[str, Any]) -> str:
    """Markdown: per algorithm both libraries' env steps and wall seconds to the target per seed, and the ratios."""

    def seeds(xs: list[float | None], d: int) -> str:
        return " / ".join("-" if x is None else f"{x:,.{d}f}" for x in xs)

    def ratio(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    lines = [
        "| algorithm (budget) | pickaxe env steps | Tianshou env steps | pickaxe wall s | Tianshou wall s | "
        "steps ratio | wall ratio | CPU ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for algo, e in result.items():
        p, t = e["pickaxe"], e["tianshou"]
        lines.append(
            f"| {algo} ({e['budget']:,}) | {seeds(p['steps'], 0)} | {seeds(t['steps'], 0)} | {seeds(p['wall_s'], 1)} "
            f"| {seeds(t['wall_s'], 1)} | {ratio(e['steps_ratio'])} | {ratio(e['wall_ratio'])} | "
            f"{ratio(e['cpu_ratio'])} |"
        )
        if "also_target" in e:
            lines.append(
                f"| {algo} to {e['also_target']:g} | {seeds(p['steps_also'], 0)} | {seeds(t['steps_also'], 0)} "
                "| | | | | |"
            )
    return "\n".join(lines)


def cli(argv: list[str] | None = None) -> None:
    """Parse the options, run both libraries seed by seed, print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/tianshou-online", help="folder of pickaxe's run folders")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--algos", default=",".join(ALGOS), help=f"comma-separated, of {','.join(ALGOS)}")
    parser.add_argument("--budget", action="append", default=[], help="ALGO=ENV_STEPS (repeatable)")
    parser.add_argument(
        "--also-target",
        action="append",
        default=[],
        help="ALGO=RETURN (repeatable): also report env steps to this return, from the same runs",
    )
    args = parser.parse_args(argv)
    try:
        import tianshou
    except ImportError:
        raise SystemExit(TIANSHOU_MISSING) from None
    algos = args.algos.split(",")
    unknown = [a for a in algos if a not in ALGOS]
    if unknown:
        raise SystemExit(f"unknown algorithm {unknown[0]!r}; fix: --algos from {','.join(ALGOS)}")
    budgets = {a: b for a, (_, b) in ALGOS.items()}
    for item in args.budget:
        name, _, steps = item.partition("=")
        if name not in ALGOS or not steps.isdigit():
            raise SystemExit(f"bad --budget {item!r}; fix: ALGO=ENV_STEPS with ALGO from {','.join(ALGOS)}")
        budgets[name] = int(steps)
    also: dict[str, float] = {}
    for item in args.also_target:
        name, _, value = item.partition("=")
        try:
            also[name] = float(value)
        except ValueError:
            name = ""
        if name not in ALGOS:
            raise SystemExit(f"bad --also-target {item!r}; fix: ALGO=RETURN with ALGO from {','.join(ALGOS)}")
    torch.set_num_threads(1)
    out = Path(args.out)
    print(f"load average {os.getloadavg()[0]:.2f}, tianshou {tianshou.__version__}, torch {torch.__version__}")
    rows: list[dict[str, Any]] = []
    for algo in algos:
        for seed in range(args.seeds):
            p = run_pickaxe(algo, seed, budgets[algo], out / f"{algo}-s{seed}", also.get(algo))
            t = run_tianshou(algo, seed, budgets[algo], also.get(algo))
            for lib, r in (("pickaxe", p), ("tianshou", t)):
                rows.append({"algo": algo, "lib": lib, "seed": seed, **r})
                print(json.dumps(rows[-1]), flush=True)
    result = summary(rows, budgets, also)
    print(table(result))
    print(json.dumps({"load_average_end": os.getloadavg()[0], "algos": result, "runs": rows}))


if __name__ == "__main__":
    cli()
