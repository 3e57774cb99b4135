"""Independent DQN on MPE2 simple_spread side by side with Tianshou 2.0.1's PettingZoo support (issue 30).

Tianshou: one ``DQN`` per agent (its ``DiscreteQLearningPolicy`` on a ``Net``), joined by its
``MultiAgentOffPolicyAlgorithm``, stepping its ``PettingZooEnv`` wrapper of MPE2's AEC ``simple_spread_v3.env``
(agents act in turn) in a ``DummyVectorEnv``, trained by its ``OffPolicyTrainer``: the layout of its PettingZoo
examples (``test/pettingzoo/pistonball.py`` and ``tic_tac_toe.py`` of thu-ml/tianshou). pickaxe: the
``simple-spread-idqn`` recipe (one Q-network shared by the agents, their one-hot id appended), the same with
``--algo.shared False`` (one Q-network per agent, as Tianshou's), and ``simple-spread-mappo`` as a reference row.

Same env (N 3, local ratio 0.5, 25-step episodes, Discrete actions), same budget in env steps counted per joint step
(Tianshou's collector counts one step per agent's turn: its count is divided by the agents), and every setting both
have set equal, from the pickaxe recipe (``SETTINGS``): learning rate, discount per joint step, replay size, batch,
gradient steps per collected step, target copy period, Huber loss, double Q, epsilon schedule, 64x64 ReLU networks,
8 training envs. Tianshou stores every agent's turn as one transition, and MPE2's AEC env hands out a joint step's
rewards at the last agent's turn (the others see 0), so its DQN takes an ``N``-step return over turns
(``n_step_return_horizon`` = 3) with a per-turn discount ``gamma ** (1 / N)``: each agent's target then holds the
joint step's reward once and bootstraps from its own next observation, one joint step later, discounted by gamma.

Evaluation: the final greedy policy (each agent's argmax Q) on the very episodes pickaxe's evaluation of the same
seed plays (its eval envs' seeds: 4 envs, 20 episodes), the team total (summed over the agents) with its 95%
bootstrap CI, as pickaxe's ``eval/return_mean``. Wall and process CPU seconds: pickaxe's around ``pickaxe train``
(construction, training, its 5 evaluations); Tianshou's from building the envs and networks to the end of training
(its trainer's 4 test steps of 20 episodes included; the final evaluation above, outside). Every run in a fresh
process, one at a time, torch one thread.

Usage::

    python benchmarks/tianshou_multiagent.py --seeds 3 --root /tmp/ma --write docs/multi-agent.md
    python benchmarks/tianshou_multiagent.py --quick     # one seed at 2,400 env steps: a smoke run

``--root`` keeps the runs: finished ones found there are read back, not run again (``benchmarks/multiagent.py --root
DIR --reuse`` and this script share pickaxe's run folders), so a second call with ``--write`` only writes the table.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multiagent import RunRecord, fmt_return, provenance, shown_command, spawn
from results import MarkerError, fmt_seconds, replace_block

os.environ.setdefault("TQDM_DISABLE", "1")

MARKERS = ("<!-- tianshou-multiagent:begin -->", "<!-- tianshou-multiagent:end -->")
TIANSHOU_MISSING = "Tianshou is not installed; fix: pip install -r benchmarks/requirements-baselines.txt"
RECIPE = "simple-spread-idqn"

# Tianshou's PettingZoo DQN example (test/pettingzoo/pistonball.py get_parser, thu-ml/tianshou): quoted for the doc's
# table; the values used are in SETTINGS.
TIANSHOU_EXAMPLE: dict[str, Any] = {
    "lr": 1e-3, "gamma": 0.9, "n_step": 100, "target_update_freq": 320, "buffer_size": 2000, "batch_size": 100,
    "hidden_sizes": [64, 64], "eps_train": 0.1, "eps_test": 0.05, "collection_step_num_env_steps": 10,
    "update_per_step": 0.1, "num_train_envs": 10, "num_test_envs": 10, "loss": "MSE (huber_loss_delta None)",
}  # fmt: skip


def settings(steps: int) -> dict[str, Any]:
    """Tianshou's settings for a budget of ``steps`` joint env steps: the recipe's where both libraries have the
    setting, Tianshou's own layout (one network per agent, n-step over turns) where only it has one."""
    from pickaxe.recipes import get_recipe

    cfg = get_recipe(RECIPE)
    a, n_agents = cfg.algo, int(cfg.env.kwargs["N"])
    collect = cfg.collector.steps  # joint steps per collect (over all envs)
    collects = math.ceil(steps / collect)
    epochs = 3 if collects % 3 == 0 else 1
    return {
        "env_kwargs": dict(cfg.env.kwargs),
        "agents": n_agents,
        "num_train_envs": cfg.env.num_envs,
        "num_test_envs": cfg.env.eval_envs,
        "eval_episodes": cfg.trainer.eval_episodes,
        "lr": a.lr,
        "gamma_joint": a.gamma,
        "gamma_turn": a.gamma ** (1 / n_agents),
        "n_step": n_agents,
        "buffer_size": a.buffer_size,
        "batch_size": a.batch_size,
        "collect_turns": collect * n_agents,
        "gradient_steps_per_collect": a.gradient_steps,
        "target_update_freq": a.target_update_every,
        "double": a.double,
        "huber_loss_delta": 1.0,
        "eps": (a.eps_start, a.eps_end, a.eps_fraction),
        "hidden_sizes": list(cfg.model.hidden),
        "total_steps": steps,
        "collects": collects,
        "epochs": epochs,
    }


def greedy_eval(models: list[Any], agents: list[str], seed: int, s: dict[str, Any]) -> np.ndarray:
    """Per-episode returns ``[E, A]`` of each agent's argmax-Q policy on the episodes pickaxe's evaluation of
    ``seed`` plays: env ``i`` reset with the eval seed + ``i``, then unseeded resets, episodes split evenly."""
    import torch
    from mpe2 import simple_spread_v3

    from pickaxe.train.build import derive_seeds

    eval_seed, n, episodes = derive_seeds(seed)["eval_env"], s["num_test_envs"], s["eval_episodes"]
    out: list[np.ndarray] = []
    for i in range(n):
        env = simple_spread_v3.env(**s["env_kwargs"])
        env.reset(seed=eval_seed + i)
        for _ in range((episodes + i) // n):
            ret = dict.fromkeys(agents, 0.0)
            for agent in env.agent_iter():  # last(): the agent's reward since its previous turn
                obs, reward, term, trunc, _ = env.last()
                ret[agent] += float(reward)
                if term or trunc:
                    action = None
                else:
                    with torch.no_grad():
                        q, _ = models[agents.index(agent)](torch.as_tensor(obs, dtype=torch.float32)[None])
                    action = int(q.argmax(-1).item())
                env.step(action)
            out.append(np.array([ret[a] for a in agents]))
            env.reset()
        env.close()
    return np.stack(out)


def run_tianshou(seed: int, steps: int) -> dict[str, Any]:
    """One Tianshou run: train, then the greedy evaluation; its figures (JSON-ready)."""
    import torch
    from mpe2 import simple_spread_v3
    from tianshou.algorithm import DQN, MultiAgentOffPolicyAlgorithm
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.env.pettingzoo_env import PettingZooEnv
    from tianshou.trainer import OffPolicyTrainerParams
    from tianshou.utils.net.common import Net

    from pickaxe.algos.core import linear_schedule
    from pickaxe.train.build import derive_seeds
    from pickaxe.train.evaluate import mean_ci

    torch.set_num_threads(1)
    s = settings(steps)
    started, load = time.time(), os.getloadavg()[0]
    wall, cpu = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    np.random.seed(seed)

    def make() -> PettingZooEnv:
        return PettingZooEnv(simple_spread_v3.env(**s["env_kwargs"]))

    env = make()
    seeds = derive_seeds(seed)
    train_envs = DummyVectorEnv([make for _ in range(s["num_train_envs"])])
    train_envs.seed([seeds["env"] + i for i in range(s["num_train_envs"])])
    test_envs = DummyVectorEnv([make for _ in range(s["num_test_envs"])])
    test_envs.seed([seeds["eval_env"] + i for i in range(s["num_test_envs"])])
    obs_shape, n_actions = env.observation_space.shape, int(env.action_space.n)
    algorithms: list[DQN] = []
    for _ in env.agents:
        net = Net(state_shape=obs_shape, action_shape=n_actions, hidden_sizes=s["hidden_sizes"])
        policy = DiscreteQLearningPolicy(model=net, action_space=env.action_space, eps_training=1.0)
        algorithms.append(
            DQN(
                policy=policy,
                optim=AdamOptimizerFactory(lr=s["lr"]),
                gamma=s["gamma_turn"],
                n_step_return_horizon=s["n_step"],
                target_update_freq=s["target_update_freq"],
                is_double=s["double"],
                huber_loss_delta=s["huber_loss_delta"],
            )
        )
    algorithm = MultiAgentOffPolicyAlgorithm(algorithms=algorithms, env=env)
    buffer = VectorReplayBuffer(s["buffer_size"], s["num_train_envs"])
    train = Collector(algorithm, train_envs, buffer, exploration_noise=True)
    test = Collector(algorithm, test_envs)
    eps_start, eps_end, eps_fraction = s["eps"]

    def training_fn(epoch: int, env_step: int) -> None:  # pickaxe's schedule, by joint steps
        eps = linear_schedule(eps_start, eps_end, env_step / s["agents"] / s["total_steps"] / eps_fraction)
        for algo in algorithms:
            algo.policy.set_eps_training(eps)
            # Tianshou 2.0.1's MultiAgentPolicy does not pass "within a training step" on to the agents' policies,
            # so they explore with their eps_inference while collecting for training: set both
            algo.policy.eps_inference = eps

    def test_fn(epoch: int, env_step: int | None) -> None:
        for algo in algorithms:
            algo.policy.eps_inference = 0.0

    turns = s["collects"] * s["collect_turns"]
    params = OffPolicyTrainerParams(
        training_collector=train,
        test_collector=test,
        max_epochs=s["epochs"],
        epoch_num_steps=turns // s["epochs"],
        collection_step_num_env_steps=s["collect_turns"],
        update_step_num_gradient_steps_per_sample=s["gradient_steps_per_collect"] / s["collect_turns"],
        batch_size=s["batch_size"],
        test_step_num_episodes=s["eval_episodes"],
        training_fn=training_fn,
        test_fn=test_fn,
        multi_agent_return_reduction=lambda returns: returns.sum(axis=1),
        verbose=False,
        show_progress=False,
    )
    result = algorithm.run_training(params)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    models = [algo.policy.model for algo in algorithms]
    for m in models:
        m.eval()
    returns = greedy_eval(models, list(env.agents), seed, s)
    total = returns.sum(1)
    low, high = mean_ci(total)
    return {
        "seed": seed,
        "steps": int(result.train_step) // s["agents"],
        "turns": int(result.train_step),
        "final": float(total.mean()),
        "final_low": low,
        "final_high": high,
        "agents": {a: float(returns[:, j].mean()) for j, a in enumerate(env.agents)},
        "wall_s": wall,
        "cpu_s": cpu,
        "started": started,
        "load_average": load,
        "state": "finished",
    }


def spawn_tianshou(seed: int, steps: int, root: Path) -> dict[str, Any]:
    """One Tianshou run in a fresh interpreter (or the record of a finished one already in ``root``); its record
    (``state`` says how it ended)."""
    out = root / f"tianshou-idqn-s{seed}-{steps}.json"
    if out.is_file():
        return json.loads(out.read_text())
    cmd = [sys.executable, os.path.abspath(__file__), "--one-tianshou", f"{seed}:{steps}:{out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"  tianshou seed {seed} failed (exit {proc.returncode}): {tail}", file=sys.stderr, flush=True)
        return {"seed": seed, "state": f"exit {proc.returncode}"}
    return json.loads(out.read_text())


def row(name: str, settings_text: str, runs: list[dict[str, Any]]) -> str:
    """One table row: per-seed final totals with CIs, their mean, wall and CPU seconds per seed."""
    done = [r for r in runs if r.get("final") is not None]
    finals = " / ".join(
        f"{fmt_return(r['final'])} [{fmt_return(r['final_low'])}, {fmt_return(r['final_high'])}]"
        if r.get("final") is not None
        else f"seed {r['seed']} {r.get('state')}"
        for r in runs
    )
    mean = fmt_return(float(np.mean([r["final"] for r in done]))) if done else "-"
    walls = " / ".join(fmt_seconds(r.get("wall_s")) for r in runs)
    cpus = " / ".join(fmt_seconds(r.get("cpu_s")) for r in runs)
    return f"| {name} | {settings_text} | {finals} | {mean} | {walls} | {cpus} |"


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    """The median of ``key`` over the runs that have it."""
    values = [r[key] for r in runs if r.get(key) is not None]
    return float(np.median(values)) if values else None


def build_table(rows: dict[str, list[dict[str, Any]]]) -> str:
    """The markdown table (one row per library and variant) and a line of the wall and CPU ratios."""
    names = {
        "tianshou": ("Tianshou 2.0.1 DQN x3", "one network per agent, n-step 3 over turns"),
        "pickaxe-idqn": ("pickaxe `simple-spread-idqn`", "one shared network, agent id appended"),
        "pickaxe-idqn-unshared": ("pickaxe `simple-spread-idqn --algo.shared False`", "one network per agent"),
        "pickaxe-mappo": ("pickaxe `simple-spread-mappo` (reference)", "MAPPO, its recipe's settings"),
    }
    lines = [
        "| run | networks | final eval total per seed [95% CI] | mean | training wall s (per seed) "
        "| training CPU s (per seed) |",
        "|---|---|---|---|---|---|",
    ]
    lines += [row(*names[k], runs) for k, runs in rows.items() if k in names]
    t = rows.get("tianshou", [])
    ratios = []
    for k, short in (("pickaxe-idqn", "`simple-spread-idqn`"), ("pickaxe-idqn-unshared", "`--algo.shared False`")):
        parts = []
        for key, what in (("cpu_s", "CPU"), ("wall_s", "wall")):
            p, q = median_of(rows.get(k, []), key), median_of(t, key)
            if p is not None and q:
                parts.append(f"{what} {p / q:.2f}")
        if parts:
            ratios.append(f"{short} {', '.join(parts)}")
    return "\n".join(lines) + (
        "\n\nRatios of the medians, pickaxe / Tianshou: " + "; ".join(ratios) + "." if ratios else ""
    )


def records(runs: list[RunRecord]) -> list[dict[str, Any]]:
    """pickaxe's run records as dicts."""
    from dataclasses import asdict

    return [asdict(r) for r in runs]


def main(argv: list[str] | None = None) -> int:
    """Run pickaxe's rows and Tianshou's seed by seed, print the table and the JSON line, optionally --write it."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    parser.add_argument("--budget", type=int, default=50_000, help="joint env steps (default 50,000: 50,400 run)")
    parser.add_argument("--quick", action="store_true", help="one seed, 2,400 env steps, no MAPPO row: a smoke run")
    parser.add_argument("--no-mappo", action="store_true", help="leave out the MAPPO reference row")
    parser.add_argument("--root", help="where runs go (default: a temporary folder); finished runs there are reused")
    parser.add_argument("--write", metavar="FILE", help="replace the block between the tianshou-multiagent markers")
    parser.add_argument("--one-tianshou", help=argparse.SUPPRESS)  # SEED:STEPS:OUT_JSON, run by the parent
    args = parser.parse_args(argv)
    if args.one_tianshou:
        seed, steps, out = args.one_tianshou.split(":", 2)
        Path(out).write_text(json.dumps(run_tianshou(int(seed), int(steps))))
        return 0
    try:
        import tianshou
    except ImportError:
        raise SystemExit(TIANSHOU_MISSING) from None
    if args.quick:
        args.seeds, args.budget, args.no_mappo = 1, 2_400, True
    if args.seeds < 1 or args.budget < 1:
        parser.error("--seeds and --budget take whole numbers >= 1")
    if args.write and (not Path(args.write).is_file() or MARKERS[0] not in Path(args.write).read_text()):
        parser.error(f"--write: {args.write} is not a file with the '{MARKERS[0]}' marker; fix: add the markers")
    print(f"load average {os.getloadavg()[0]:.2f}, tianshou {tianshou.__version__}", flush=True)
    rows: dict[str, list[dict[str, Any]]] = {"tianshou": [], "pickaxe-idqn": [], "pickaxe-idqn-unshared": []}
    if not args.no_mappo:
        rows["pickaxe-mappo"] = []
    pickaxe_runs: list[RunRecord] = []
    with tempfile.TemporaryDirectory(prefix="pickaxe-tianshou-ma-") as tmp:
        root = Path(args.root or tmp)
        root.mkdir(parents=True, exist_ok=True)
        for seed in range(args.seeds):
            plan = [
                ("pickaxe-idqn", RECIPE, [], ""),
                ("pickaxe-idqn-unshared", RECIPE, ["--algo.shared", "False"], "-unshared"),
            ]
            if not args.no_mappo:
                plan.append(("pickaxe-mappo", "simple-spread-mappo", [], ""))
            for key, recipe, extra, tag in plan:
                record = spawn(recipe, seed, args.budget, root, reuse=True, extra=extra, tag=tag)
                pickaxe_runs.append(record)
                rows[key].append(records([record])[0])
                print(f"  {key}: {json.dumps(rows[key][-1])}", file=sys.stderr, flush=True)
            rows["tianshou"].append(spawn_tianshou(seed, args.budget, root))
            print(f"  tianshou: {json.dumps(rows['tianshou'][-1])}", file=sys.stderr, flush=True)
    ends = [r["started"] + r["wall_s"] for runs in rows.values() for r in runs if r.get("started") and r.get("wall_s")]
    ended = max(ends, default=time.time())  # the last run's end (runs read back keep their times)
    table = build_table(rows)
    print()
    print(table)
    if args.write:
        path = Path(args.write)
        starts = [(r["started"], r.get("load_average")) for runs in rows.values() for r in runs if r.get("started")]
        line = provenance(shown_command(argv, "benchmarks/tianshou_multiagent.py"), starts, ended)
        try:
            path.write_text(replace_block(path.read_text(), table + "\n\n" + line, MARKERS))
        except MarkerError as e:
            print(f"tianshou_multiagent.py: error: {path}: {e}", file=sys.stderr)
            return 2
        print(f"\nwrote the table into {path}")
    settings_used = settings(args.budget)
    machine = {"nproc": os.cpu_count(), "load_average": list(os.getloadavg()), "torch_threads": 1}
    print(
        json.dumps({"settings": settings_used, "tianshou_example": TIANSHOU_EXAMPLE, "runs": rows, "machine": machine})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
