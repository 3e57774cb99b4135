"""Offline RL side by side with Tianshou 2.0.1 (issue 29): pickaxe's offline recipes and Tianshou's BC
(``OfflineImitationLearning``; beside pickaxe's likelihood BC, ``bc``, and its regression, ``bc-mse``), TD3+BC, CQL
(continuous, on SAC), discrete BCQ and discrete CQL (on QR-DQN), trained on the very same datasets, for the same
gradient steps, with the same evaluations.

Datasets: as ``benchmarks/offline.py`` makes them (its source runs ``cartpole-ppo`` / ``pendulum-sac``, seed 0, then
``pickaxe collect``): by default the medium ones (CartPole ``--epsilon 0.5``, 20 episodes; Pendulum ``--noise 0.5``,
20 episodes). Tianshou reads the same transitions, converted once into its ``ReplayBuffer`` (Box actions mapped into
its policies' [-1, 1] scale with ``map_action_inverse``, as its own collectors store them).

Budget: pickaxe's recipe, 2,000 gradient steps of 256 transitions with 5 evaluations of 10 deterministic episodes;
Tianshou's ``OfflineTrainer``, 5 epochs x 400 gradient steps of 256 with a test of 10 episodes after each epoch.
Settings shared by both come from the pickaxe recipe (64x64 relu networks, lr 1e-3, batch 256, gamma 0.99, tau
0.005, TD3+BC's alpha 2.5, policy delay 2 and target noise 0.2 clipped at 0.5, CQL's weight 1 and 10 sampled
actions, BCQ's threshold 0.3 and logit penalty 0.01, 1-step TD targets); settings only Tianshou has are its test
examples' (``test/offline/test_*.py``); ``DIFFERENCES`` lists every place the two methods differ.

Each (algorithm, seed) runs pickaxe then Tianshou in this process, one at a time, torch one thread. Recorded: the
final policy's return over 10 deterministic episodes and its normalised score (the references ``collect`` stored);
Tianshou's final policy also on the very episodes pickaxe's run of the same seed evaluated on (its eval envs and
seed), so that each seed's two scores can be compared on the same start states (the paired table); wall and
process-CPU seconds from the start of a run (dataset read and checked, networks built) to the end of its
last evaluation, and the training seconds alone (the gradient steps with their dataset sampling, no evaluation:
pickaxe's ``time/collect_s`` plus ``time/update_s``, Tianshou's trainer's ``train_time_update``), in wall and in
process-CPU seconds (pickaxe's ``time/update_cpu_s``; Tianshou's update calls timed around). The whole-run figures
charge each library for its evaluations, whose cost grows with the policy's return on CartPole (an episode lasts as
long as the pole stays up), so a better policy costs more; the training figure compares the same work. Usage::

    python benchmarks/tianshou_offline.py --out /tmp/ts-offline --seeds 3
    python benchmarks/tianshou_offline.py --algos bcq --seeds 1 --steps 16      # a smoke run
    python benchmarks/tianshou_offline.py --from-logs run1.log run2.log         # one table from earlier runs' logs

The last line printed is one JSON object: per algorithm the medians, ranges and ratios pickaxe / Tianshou, the
scores' mean and IQM with 95% bootstrap CIs, and the probability that a pickaxe seed outscores a Tianshou seed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offline import check_exit, make_dataset
from offline_step import build as build_step_case
from offline_step import plain_step

from pickaxe.algos.offline import split_minibatches
from pickaxe.cli import main
from pickaxe.offline.dataset import read
from pickaxe.offline.sampler import DatasetSampler
from pickaxe.runs.run import read_metrics

os.environ.setdefault("TQDM_DISABLE", "1")  # Tianshou's per-update progress bars

TIANSHOU_MISSING = "Tianshou is not installed; fix: pip install -r benchmarks/requirements-baselines.txt"

# algorithm -> (env, pickaxe recipe)
ALGOS: dict[str, tuple[str, str]] = {
    "bc": ("pendulum", "pendulum-bc"),
    "bc-mse": ("pendulum", "pendulum-bc"),
    "td3-bc": ("pendulum", "pendulum-td3-bc"),
    "cql": ("pendulum", "pendulum-cql"),
    "bcq": ("cartpole", "cartpole-bcq"),
    "cql-discrete": ("cartpole", "cartpole-cql"),
}

PLAIN: dict[str, str] = {"bcq": "bcq", "bc-mse": "bc-box-mse"}
"""Algorithm -> its ``benchmarks/offline_step.py`` case, for the algorithms also timed as plain PyTorch."""

FLAGS: dict[str, list[str]] = {"bc-mse": ["--algo.box-loss", "mse"]}
"""pickaxe's flags on top of the recipe, per algorithm."""

DIFFERENCES: dict[str, str] = {
    "bc": "pickaxe: Gaussian likelihood (tanh mean, learned std); Tianshou: deterministic actor, MSE to the action",
    "bc-mse": "the same method (a deterministic tanh actor, the mean squared error to the action: pickaxe's "
    "--algo.box-loss mse); only the initialisation differs",
    "td3-bc": "the same method and settings; only the initialisation differs (observations normalised in neither)",
    "cql": "pickaxe CQL(H) on SAC, fixed weight 1, alpha auto from 1.0; Tianshou CQL on SAC, fixed weight 1 "
    "(with_lagrange off, calibrated off: plain CQL(H)), alpha auto from 1.0, its critic grad-norm clip 1.0 "
    "(pickaxe none)",
    "bcq": "pickaxe: Polyak target (tau 0.005), Huber TD loss; Tianshou: hard target copy every 320 steps "
    "(its test's value), Huber TD loss",
    "cql-discrete": "pickaxe: CQL on DQN (Polyak tau 0.005); Tianshou: CQL on QR-DQN with 200 quantiles and a hard "
    "target copy every 500 steps (its test's values)",
}


def normalised(ret: float, meta: dict[str, Any]) -> float | None:
    """D4RL's 100 * (return - random) / (expert - random) with the references the dataset records."""
    lo, hi = meta.get("ref_min_score"), meta.get("ref_max_score")
    if lo is None or hi is None or hi == lo:
        return None
    return 100.0 * (ret - float(lo)) / (float(hi) - float(lo))


def run_pickaxe(
    recipe: str, data: Path, seed: int, run: Path, steps: int, flags: tuple[str, ...] = ()
) -> dict[str, Any]:
    """One pickaxe offline run of ``steps`` gradient steps (5 evaluations) with ``flags`` on top of ``recipe``; its
    final return, wall and CPU seconds."""
    args = ["train", recipe, *flags, "--data.dataset", str(data), "--seed", str(seed), "--device", "cpu"]
    args += ["--trainer.total-steps", str(steps * 256), "--trainer.eval-every", str(steps * 256 // 5)]
    if steps * 256 < 2048:  # a smoke budget: one collector iteration must fit in it
        args += ["--collector.steps", "256"]
    shutil.rmtree(run, ignore_errors=True)
    wall, cpu = time.perf_counter(), time.process_time()
    check_exit(main([*args, "--run-dir", str(run), "--no-progress", "--overwrite"]), str(run))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    records = read_metrics(run)
    last = [r for r in records if "eval/return_mean" in r][-1]
    # the gradient steps alone: sampling the dataset (the offline collector) and updating, no evaluation; CPU: the
    # updates' own (sampling a minibatch of indices is ~0.1% of it, counted in wall seconds only)
    train = sum(r.get("time/collect_s", 0.0) + r.get("time/update_s", 0.0) for r in records)
    train_cpu = sum(r.get("time/update_cpu_s", 0.0) for r in records)
    return {"eval_return": float(last["eval/return_mean"]), "wall_s": wall, "cpu_s": cpu, "train_s": train,
            "train_cpu_s": train_cpu}  # fmt: skip


def run_plain(algo: str, data: Path, seed: int, steps: int) -> dict[str, Any]:
    """``steps`` gradient steps of ``algo`` as plain PyTorch (``PLAIN``) on ``data``'s transitions, drawn by pickaxe's
    own dataset sampler (2,048 per iteration, cut into minibatches of 256): the process-CPU seconds of the steps alone
    (the draws are made before the clock starts, as pickaxe's training CPU excludes its sampling)."""
    case = PLAIN[algo]
    torch.manual_seed(seed)
    algorithm = build_step_case(case)[0]
    step = plain_step(case, algorithm)[0]
    size = algorithm.config.batch_size
    sampler = DatasetSampler(read(data), 8 * size, seed)
    batches, left = [], steps * size
    while left > 0:
        batches.append(sampler.collect(min(8 * size, left)))
        left -= 8 * size
    start = time.process_time()
    for batch in batches:
        for mb in split_minibatches(batch, size):
            step(mb)
    return {"train_cpu_s": time.process_time() - start}


def tianshou_algorithm(algo: str, env: Any) -> Any:
    """Tianshou's algorithm for ``algo`` with the shared settings (module docstring) on ``env``'s spaces."""
    from tianshou.algorithm import CQL, TD3BC, DiscreteBCQ, DiscreteCQL
    from tianshou.algorithm.imitation.discrete_bcq import DiscreteBCQPolicy
    from tianshou.algorithm.imitation.imitation_base import ImitationPolicy, OfflineImitationLearning
    from tianshou.algorithm.modelfree.ddpg import ContinuousDeterministicPolicy
    from tianshou.algorithm.modelfree.qrdqn import QRDQNPolicy
    from tianshou.algorithm.modelfree.sac import AutoAlpha, SACPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.continuous import (
        ContinuousActorDeterministic,
        ContinuousActorProbabilistic,
        ContinuousCritic,
    )

    obs, space = env.observation_space.shape, env.action_space
    hidden, lr = [64, 64], 1e-3
    adam = AdamOptimizerFactory(lr=lr)
    if algo == "bcq":
        policy = DiscreteBCQPolicy(
            model=Net(state_shape=obs, action_shape=space.n, hidden_sizes=hidden),
            imitator=Net(state_shape=obs, action_shape=space.n, hidden_sizes=hidden),
            action_space=space,
            unlikely_action_threshold=0.3,
            target_update_freq=320,
        )
        return DiscreteBCQ(policy=policy, optim=adam, gamma=0.99, target_update_freq=320, imitation_logits_penalty=0.01)
    if algo == "cql-discrete":
        net = Net(state_shape=obs, action_shape=space.n, hidden_sizes=hidden, num_atoms=200)
        policy = QRDQNPolicy(model=net, action_space=space)
        return DiscreteCQL(
            policy=policy, optim=adam, min_q_weight=1.0, gamma=0.99, num_quantiles=200, target_update_freq=500
        )
    act = space.shape
    if algo in ("bc", "bc-mse"):  # Tianshou's BC on Box actions is the regression either way
        actor = ContinuousActorDeterministic(preprocess_net=Net(state_shape=obs, hidden_sizes=hidden), action_shape=act)
        policy = ImitationPolicy(actor=actor, action_space=space, action_scaling=True, action_bound_method="clip")
        return OfflineImitationLearning(policy=policy, optim=adam)
    critics = [
        ContinuousCritic(preprocess_net=Net(state_shape=obs, action_shape=act, hidden_sizes=hidden, concat=True))
        for _ in range(2)
    ]
    if algo == "td3-bc":
        actor = ContinuousActorDeterministic(preprocess_net=Net(state_shape=obs, hidden_sizes=hidden), action_shape=act)
        policy = ContinuousDeterministicPolicy(actor=actor, action_space=space, action_scaling=True)
        return TD3BC(
            policy=policy,
            policy_optim=adam,
            critic=critics[0],
            critic_optim=adam,
            critic2=critics[1],
            critic2_optim=adam,
            tau=0.005,
            gamma=0.99,
            policy_noise=0.2,
            update_actor_freq=2,
            noise_clip=0.5,
            alpha=2.5,
        )
    actor = ContinuousActorProbabilistic(
        preprocess_net=Net(state_shape=obs, hidden_sizes=hidden),
        action_shape=act,
        unbounded=True,
        conditioned_sigma=True,
    )
    policy = SACPolicy(actor=actor, action_space=space, action_scaling=True)
    alpha = AutoAlpha(target_entropy=-float(np.prod(act)), log_alpha=0.0, optim=AdamOptimizerFactory(lr=lr))
    return CQL(
        policy=policy,
        policy_optim=adam,
        critic=critics[0],
        critic_optim=adam,
        critic2=critics[1],
        critic2_optim=adam,
        cql_weight=1.0,
        with_lagrange=False,
        calibrated=False,
        tau=0.005,
        gamma=0.99,
        alpha=alpha,
        min_action=-1.0,
        max_action=1.0,
        num_repeat_actions=10,
    )


class TianshouActing:
    """A trained Tianshou policy behind pickaxe's ``act(obs, deterministic)``, so pickaxe's evaluation plays it: its
    deterministic action (greedy, or the actor's output) mapped to the env's units."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def act(self, obs: torch.Tensor, deterministic: bool = True) -> tuple[torch.Tensor, dict[str, Any]]:
        """Actions of a batch of observations (deterministic only), in env units."""
        from tianshou.data import Batch

        with torch.no_grad():
            act = self.policy(Batch(obs=obs.cpu().numpy(), info={})).act
        act = act.cpu().numpy() if isinstance(act, torch.Tensor) else np.asarray(act)
        return torch.as_tensor(self.policy.map_action(act)), {}


def common_return(policy: Any, run: Path) -> float:
    """The mean return of Tianshou's final ``policy`` on the very episodes pickaxe's run ``run`` evaluated on (its
    eval envs and seed, its episode count), so both libraries' scores of a seed come from the same start states."""
    from pickaxe.api import run_config
    from pickaxe.train.build import run_eval_envs
    from pickaxe.train.evaluate import evaluate

    cfg = run_config(run)
    envs = run_eval_envs(cfg)
    try:
        policy.eval()
        returns, _ = evaluate(TianshouActing(policy), envs, cfg.trainer.eval_episodes)
    finally:
        envs.close()
    return float(returns.mean())


def run_tianshou(
    algo: str, env_id: str, data: Path, seed: int, steps: int, common: Path | None = None
) -> dict[str, Any]:
    """One Tianshou offline run on the same dataset: ``steps`` gradient steps in 5 epochs with a 10-episode test
    after each; its final policy's return (10 more episodes of its own, untimed), and with ``common`` (pickaxe's run
    of the same seed) its return on that run's evaluation episodes; wall and CPU seconds."""
    import gymnasium as gym
    from tianshou.data import Collector, ReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.trainer import OfflineTrainerParams

    wall, cpu = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    np.random.seed(seed)
    env = gym.make(env_id)
    algorithm = tianshou_algorithm(algo, env)
    t = read(data)
    a = t.arrays
    action = a["action"]
    if isinstance(env.action_space, gym.spaces.Box):  # the policy's [-1, 1] scale, as its collectors store actions
        action = algorithm.policy.map_action_inverse(action.astype(np.float32))
    done = a["terminated"] | a["truncated"]
    buffer = ReplayBuffer.from_data(a["obs"], action, a["reward"], a["terminated"], a["truncated"], done, a["next_obs"])
    test_envs = DummyVectorEnv([lambda: gym.make(env_id) for _ in range(10)])
    test_envs.seed(seed)
    test = Collector(algorithm, test_envs)
    per_epoch = max(steps // 5, 1)
    train_cpu = [0.0]  # process CPU seconds inside the trainer's update calls (minibatch sampling included)
    update = algorithm.update

    def timed_update(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return update(*args, **kwargs)
        finally:
            train_cpu[0] += time.process_time() - start

    algorithm.update = timed_update  # type: ignore[method-assign]
    info = algorithm.run_training(
        OfflineTrainerParams(
            buffer=buffer,
            test_collector=test,
            max_epochs=5,
            epoch_num_steps=per_epoch,
            test_step_num_episodes=10,
            batch_size=256,
            verbose=False,
            show_progress=False,
        )
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    test.reset()
    stats = test.collect(n_episode=10)
    # the trainer's sum over its gradient steps of each one's sampling, batch processing and update (its train_time
    # is the rest of the run after the last test only, so it still holds the earlier tests)
    train = float(info.timing.train_time_update)
    out = {"eval_return": float(np.mean(stats.returns)), "wall_s": wall, "cpu_s": cpu, "train_s": train,
           "train_cpu_s": train_cpu[0]}  # fmt: skip
    if common is not None:
        out["common_return"] = common_return(algorithm.policy, common)
    return out


def spread(xs: list[float]) -> dict[str, float]:
    """Median, min and max."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def score_cis(scores: list[float]) -> dict[str, float]:
    """Mean and IQM of the seeds' normalised scores, each with its 95% percentile-bootstrap CI (2,000 resamples,
    seed 0: a pure function of the scores)."""
    from pickaxe.eval.stats import iqm, mean, stratified_bootstrap_ci

    x = np.asarray(scores, dtype=np.float64)
    m_lo, m_hi = stratified_bootstrap_ci(x, statistic=mean)
    i_lo, i_hi = stratified_bootstrap_ci(x, statistic=iqm)
    return {"mean": float(x.mean()), "mean_low": m_lo, "mean_high": m_hi,
            "iqm": float(iqm(x[:, None])), "iqm_low": i_lo, "iqm_high": i_hi}  # fmt: skip


def paired(pickaxe: list[float], tianshou: list[float]) -> dict[str, Any]:
    """Both libraries' seeds scored on the same evaluation episodes (pickaxe's): Tianshou's mean with its 95% CI and
    the mean paired difference pickaxe - Tianshou with its 95% bootstrap CI over seeds."""
    from pickaxe.eval.stats import mean, stratified_bootstrap_ci

    diff = np.asarray(pickaxe, dtype=np.float64) - np.asarray(tianshou, dtype=np.float64)
    low, high = stratified_bootstrap_ci(diff, statistic=mean)
    return {"tianshou": score_cis(tianshou), "difference": {"mean": float(diff.mean()), "low": low, "high": high}}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per algorithm and library: score, return, wall and CPU spreads, the score's mean and IQM with 95% CIs; ratios
    of medians pickaxe / Tianshou; the probability that a pickaxe seed outscores a Tianshou seed, with its CI."""
    from pickaxe.eval.stats import probability_of_improvement, probability_of_improvement_ci

    out: dict[str, Any] = {}
    for algo in dict.fromkeys(r["algo"] for r in rows):
        entry: dict[str, Any] = {}
        scores: dict[str, list[float]] = {}
        for lib in ("pickaxe", "tianshou"):
            group = [r for r in rows if r["algo"] == algo and r["lib"] == lib]
            keys = ("score", "eval_return", "wall_s", "cpu_s", "train_s", "train_cpu_s")
            entry[lib] = {k: spread([r[k] for r in group]) for k in keys}
            scores[lib] = [r["score"] for r in group]
            entry[lib]["score_ci"] = score_cis(scores[lib])
        p, t = scores["pickaxe"], scores["tianshou"]
        low, high = probability_of_improvement_ci(p, t)
        entry["p_improvement"] = {"value": probability_of_improvement(p, t), "low": low, "high": high}
        pairs = {r["seed"]: r for r in rows if r["algo"] == algo and r["lib"] == "tianshou"}
        same = [(r["score"], pairs[r["seed"]].get("common_score")) for r in rows
                if r["algo"] == algo and r["lib"] == "pickaxe" and r["seed"] in pairs]  # fmt: skip
        if same and all(c is not None for _, c in same):
            entry["same_episodes"] = paired([a for a, _ in same], [c for _, c in same])
        for k in ("wall_s", "cpu_s", "train_s", "train_cpu_s"):
            entry[f"{k[:-2]}_ratio"] = entry["pickaxe"][k]["median"] / entry["tianshou"][k]["median"]
        plain = [r["train_cpu_s"] for r in rows if r["algo"] == algo and r["lib"] == "plain"]
        if plain:
            entry["plain"] = {"train_cpu_s": spread(plain)}
            median = entry["plain"]["train_cpu_s"]["median"]
            entry["pickaxe_over_plain"] = entry["pickaxe"]["train_cpu_s"]["median"] / median
            entry["plain_over_tianshou"] = median / entry["tianshou"]["train_cpu_s"]["median"]
        entry["seeds"] = len([r for r in rows if r["algo"] == algo and r["lib"] == "pickaxe"])
        entry["differences"] = DIFFERENCES[algo]
        out[algo] = entry
    return out


def table(result: dict[str, Any]) -> str:
    """Markdown: per algorithm the normalised score and wall/CPU seconds of both, median [min, max], and ratios."""

    def fmt(s: dict[str, float], d: int = 1) -> str:
        return f"{s['median']:.{d}f} [{s['min']:.{d}f}, {s['max']:.{d}f}]"

    lines = [
        "| algorithm | pickaxe score | Tianshou score | pickaxe wall s | Tianshou wall s | wall ratio | CPU ratio "
        "| pickaxe training CPU s | Tianshou training CPU s | training CPU ratio | training wall ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for algo, e in result.items():
        p, t = e["pickaxe"], e["tianshou"]
        lines.append(
            f"| {algo} | {fmt(p['score'])} | {fmt(t['score'])} | {fmt(p['wall_s'], 2)} | {fmt(t['wall_s'], 2)} | "
            f"{e['wall_ratio']:.2f} | {e['cpu_ratio']:.2f} | {fmt(p['train_cpu_s'], 2)} | {fmt(t['train_cpu_s'], 2)} | "
            f"{e['train_cpu_ratio']:.2f} | {e['train_ratio']:.2f} |"
        )
    lines += [
        "",
        "| algorithm | seeds | pickaxe mean [95% CI] | Tianshou mean [95% CI] | pickaxe IQM [95% CI] "
        "| Tianshou IQM [95% CI] | P(pickaxe seed > Tianshou seed) [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    for algo, e in result.items():
        p, t, poi = e["pickaxe"]["score_ci"], e["tianshou"]["score_ci"], e["p_improvement"]

        def ci(c: dict[str, float], k: str) -> str:
            return f"{c[k]:.1f} [{c[k + '_low']:.1f}, {c[k + '_high']:.1f}]"

        lines.append(
            f"| {algo} | {e['seeds']} | {ci(p, 'mean')} | {ci(t, 'mean')} | {ci(p, 'iqm')} | {ci(t, 'iqm')} | "
            f"{poi['value']:.2f} [{poi['low']:.2f}, {poi['high']:.2f}] |"
        )
    plain = {algo: e for algo, e in result.items() if "plain" in e}
    if plain:
        lines += [
            "",
            "| algorithm | plain PyTorch training CPU s | pickaxe / plain PyTorch | plain PyTorch / Tianshou |",
            "|---|---|---|---|",
        ]
        lines += [f"| {algo} | {fmt(e['plain']['train_cpu_s'], 2)} | {e['pickaxe_over_plain']:.2f} | "
                  f"{e['plain_over_tianshou']:.2f} |" for algo, e in plain.items()]  # fmt: skip
    same = {algo: e for algo, e in result.items() if "same_episodes" in e}
    if same:
        lines += [
            "",
            "| algorithm | seeds | pickaxe mean [95% CI] | Tianshou on pickaxe's episodes, mean [95% CI] "
            "| paired difference pickaxe - Tianshou [95% CI] |",
            "|---|---|---|---|---|",
        ]
        for algo, e in same.items():
            p, t, d = e["pickaxe"]["score_ci"], e["same_episodes"]["tianshou"], e["same_episodes"]["difference"]
            lines.append(
                f"| {algo} | {e['seeds']} | {p['mean']:.1f} [{p['mean_low']:.1f}, {p['mean_high']:.1f}] | "
                f"{t['mean']:.1f} [{t['mean_low']:.1f}, {t['mean_high']:.1f}] | "
                f"{d['mean']:.1f} [{d['low']:.1f}, {d['high']:.1f}] |"
            )
    return "\n".join(lines)


def read_rows(paths: list[str]) -> list[dict[str, Any]]:
    """The per-run rows (the JSON lines with a ``lib``) printed by earlier runs of this script, from their logs."""
    rows = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.startswith("{") and '"lib"' in line and '"runs"' not in line:
                rows.append(json.loads(line))
    return rows


def cli(argv: list[str] | None = None) -> None:
    """Parse the options, make the datasets, run both libraries seed by seed, print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/tianshou-offline", help="folder of the runs and datasets (reused)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--algos", default=",".join(ALGOS), help=f"comma-separated, of {','.join(ALGOS)}")
    parser.add_argument("--dataset", default="medium", choices=["expert", "medium", "random"])
    parser.add_argument("--steps", type=int, default=2000, help="gradient steps of 256 transitions (multiple of 5)")
    parser.add_argument("--source-steps", type=int, default=None, help="cut the source runs short (smoke runs)")
    parser.add_argument("--from-logs", nargs="+", default=None, metavar="LOG",
                        help="summarise the runs printed in these logs of earlier runs (no training)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.from_logs:
        missing = [p for p in args.from_logs if not Path(p).is_file()]
        if missing:
            raise SystemExit(f"{missing[0]}: no such log; fix: pass the logs this script printed (saved with > FILE)")
        rows = read_rows(args.from_logs)
        if not rows:
            raise SystemExit(f"no runs found in {' '.join(args.from_logs)}; fix: pass this script's printed logs")
        result = summary(rows)
        print(table(result))
        print(json.dumps({"from_logs": args.from_logs, "algos": result, "runs": rows}))
        return
    try:
        import tianshou
    except ImportError:
        raise SystemExit(TIANSHOU_MISSING) from None
    algos = args.algos.split(",")
    unknown = [a for a in algos if a not in ALGOS]
    if unknown:
        raise SystemExit(f"unknown algorithm {unknown[0]!r}; fix: --algos from {','.join(ALGOS)}")
    torch.set_num_threads(1)
    out = Path(args.out)
    print(f"load average {os.getloadavg()[0]:.2f}, tianshou {tianshou.__version__}, torch {torch.__version__}")
    rows: list[dict[str, Any]] = []
    for algo in algos:
        env, recipe = ALGOS[algo]
        data = make_dataset(env, args.dataset, out, args.source_steps)
        meta = read(data).metadata
        env_id = "CartPole-v1" if env == "cartpole" else "Pendulum-v1"
        for seed in range(args.seeds):
            run = out / env / f"{algo}-{args.dataset}-s{seed}"
            p = run_pickaxe(recipe, data, seed, run, args.steps, tuple(FLAGS.get(algo, ())))
            t = run_tianshou(algo, env_id, data, seed, args.steps, common=run)
            for lib, r in (("pickaxe", p), ("tianshou", t)):
                score = normalised(r["eval_return"], meta)
                common = score if lib == "pickaxe" else normalised(r["common_return"], meta)
                rows.append({"algo": algo, "lib": lib, "seed": seed, **r, "score": score, "common_score": common})
                print(json.dumps(rows[-1]), flush=True)
            if algo in PLAIN:
                rows.append({"algo": algo, "lib": "plain", "seed": seed, **run_plain(algo, data, seed, args.steps)})
                print(json.dumps(rows[-1]), flush=True)
    result = summary(rows)
    print(table(result))
    print(json.dumps({"dataset": args.dataset, "steps": args.steps, "algos": result, "runs": rows}))


if __name__ == "__main__":
    cli()
