"""Stable-Baselines3 runs that the other benchmarks put side by side with pickaxe's (``cartpole.py``,
``collector.py``). SB3 is never a pickaxe dependency: ``pip install -r benchmarks/requirements-baselines.txt``.

A baseline runs exactly its source's settings: RL Baselines3 Zoo's tuned CartPole-v1 entries (``hyperparams/ppo.yml``
and ``dqn.yml``), the budget included. The budget matters beyond where training stops: SB3's schedules are fractions
of ``learn(total_timesteps=...)`` (DQN's epsilon decays over ``exploration_fraction`` of it, PPO's ``lin_`` learning
rate and clip range over all of it), so a larger budget is a different, slower-exploring algorithm. Each run calls
``learn`` with the zoo's ``n_timesteps`` and nothing else; a seed that has not reached the target by then is reported
as not solved within the zoo budget (``solved_step`` None, ``budget`` says which), never trained on past it.

Evaluation matches pickaxe's benchmark: every ``eval_every`` env steps, 10 deterministic episodes on 10 separate
eval envs (one episode each), stopping at the first evaluation whose mean return reaches the target.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

SB3_MISSING = "Stable-Baselines3 is not installed; fix: pip install -r benchmarks/requirements-baselines.txt"

# RL Baselines3 Zoo (github.com/DLR-RM/rl-baselines3-zoo, commit 208b6fdf), hyperparams/ppo.yml, CartPole-v1:
#   n_envs: 8, n_timesteps: !!float 1e5, policy: 'MlpPolicy', n_steps: 32, batch_size: 256, gae_lambda: 0.8,
#   gamma: 0.98, n_epochs: 20, ent_coef: 0.0, learning_rate: lin_0.001, clip_range: lin_0.2
# ("lin_X": X times progress_remaining, decaying linearly to 0 over n_timesteps; the rest are SB3's defaults)
PPO_ZOO = {
    "n_envs": 8, "n_timesteps": 100_000, "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98,
    "n_epochs": 20, "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2,
}  # fmt: skip
# RL Baselines3 Zoo (commit ce95481b), hyperparams/dqn.yml, CartPole-v1 ("# Almost Tuned"):
#   n_timesteps: !!float 5e4, policy: 'MlpPolicy', learning_rate: !!float 2.3e-3, batch_size: 64,
#   buffer_size: 100000, learning_starts: 1000, gamma: 0.99, target_update_interval: 10, train_freq: 256,
#   gradient_steps: 128, exploration_fraction: 0.16, exploration_final_eps: 0.04,
#   policy_kwargs: "dict(net_arch=[256, 256])"
# (epsilon falls from 1.0 to 0.04 over the first 0.16 x 50,000 = 8,000 env steps; the rest are SB3's defaults)
DQN_ZOO = {
    "n_timesteps": 50_000, "learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000,
    "learning_starts": 1000, "gamma": 0.99, "target_update_interval": 10, "train_freq": 256, "gradient_steps": 128,
    "exploration_fraction": 0.16, "exploration_final_eps": 0.04, "net_arch": [256, 256],
}  # fmt: skip
ZOO = {"ppo": PPO_ZOO, "dqn": DQN_ZOO}


def zoo_budget(algo: str) -> int:
    """The env steps SB3 trains ``algo`` ("ppo" or "dqn") for: the zoo's ``n_timesteps``, which its schedules span."""
    return int(ZOO[algo]["n_timesteps"])


def available() -> bool:
    """Whether Stable-Baselines3 imports."""
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return False
    return True


def _linear(start: float) -> Callable[[float], float]:
    return lambda progress_remaining: progress_remaining * start


def _solve(model: Any, n_envs: int, eval_every: int, eval_episodes: int, target: float, budget: int) -> dict:
    """``model.learn(total_timesteps=budget)`` with an evaluation every ``eval_every`` env steps, stopping at
    ``target``; ``solved_step`` stays None when the budget ends first."""
    from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    result: dict[str, Any] = {
        "solved_step": None,
        "solved_wall_s": None,
        "solved_cpu_s": None,
        "best_eval_return": None,
        "budget": budget,
    }
    start = [0.0, 0.0]

    def record(mean_return: float, step: int) -> bool:
        """Note one evaluation; True once it reaches the target."""
        best = result["best_eval_return"]
        result["best_eval_return"] = max(best if best is not None else -1e9, mean_return)
        if mean_return < target:
            return False
        result["solved_step"] = step
        result["solved_wall_s"] = time.perf_counter() - start[0]
        result["solved_cpu_s"] = time.process_time() - start[1]
        return True

    class Stop(BaseCallback):
        def _on_step(self) -> bool:
            return not record(float(self.parent.last_mean_reward), int(self.num_timesteps))

    eval_env = make_vec_env("CartPole-v1", n_envs=eval_episodes, seed=1000)
    callback = EvalCallback(
        eval_env,
        callback_after_eval=Stop(),
        n_eval_episodes=eval_episodes,
        eval_freq=max(eval_every // n_envs, 1),
        deterministic=True,
        verbose=0,
        warn=False,
    )
    start[0], start[1] = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=budget, callback=callback)
    if result["solved_step"] is None and model.num_timesteps % eval_every:  # the budget ends between evaluations
        mean_return, _ = evaluate_policy(model, eval_env, n_eval_episodes=eval_episodes, deterministic=True)
        record(float(mean_return), int(model.num_timesteps))  # the zoo-trained model, at the end of its budget
    result["wall_s"] = time.perf_counter() - start[0]
    result["steps"] = int(model.num_timesteps)
    return result


def sb3_ppo_cartpole(seed: int, eval_every: int, eval_episodes: int, target: float) -> dict:
    """SB3 PPO (zoo settings and budget) on CartPole-v1 until the eval mean return reaches ``target``; seconds from
    ``learn``."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    z = PPO_ZOO
    env = make_vec_env("CartPole-v1", n_envs=z["n_envs"], seed=seed)
    model = PPO(
        "MlpPolicy", env, n_steps=z["n_steps"], batch_size=z["batch_size"], gae_lambda=z["gae_lambda"],
        gamma=z["gamma"], n_epochs=z["n_epochs"], ent_coef=z["ent_coef"], learning_rate=_linear(z["learning_rate"]),
        clip_range=_linear(z["clip_range"]), seed=seed, device="cpu", verbose=0,
    )  # fmt: skip
    return _solve(model, z["n_envs"], eval_every, eval_episodes, target, zoo_budget("ppo"))


def sb3_dqn_cartpole(seed: int, eval_every: int, eval_episodes: int, target: float) -> dict:
    """SB3 DQN (zoo settings and budget) on CartPole-v1 until the eval mean return reaches ``target``; seconds from
    ``learn``."""
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    z = DQN_ZOO
    env = make_vec_env("CartPole-v1", n_envs=1, seed=seed)
    model = DQN(
        "MlpPolicy", env, learning_rate=z["learning_rate"], batch_size=z["batch_size"], buffer_size=z["buffer_size"],
        learning_starts=z["learning_starts"], gamma=z["gamma"], target_update_interval=z["target_update_interval"],
        train_freq=z["train_freq"], gradient_steps=z["gradient_steps"], exploration_fraction=z["exploration_fraction"],
        exploration_final_eps=z["exploration_final_eps"], policy_kwargs={"net_arch": z["net_arch"]}, seed=seed,
        device="cpu", verbose=0,
    )  # fmt: skip
    return _solve(model, 1, eval_every, eval_episodes, target, zoo_budget("dqn"))


def sb3_ppo_collector(n_envs: int, steps: int, seed: int = 0) -> Callable[[], float]:
    """A function timing one SB3 PPO rollout collection of ``steps`` env steps (all envs) in steps/s.

    SB3's default ``MlpPolicy`` (separate 64x64 tanh actor and critic), ``DummyVecEnv`` of CartPole-v1: the same
    policy network size as ``pickaxe.models.ActorCritic.for_env``; ``collect_rollouts`` as ``learn`` calls it.
    """
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import CallbackList
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env("CartPole-v1", n_envs=n_envs, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=steps // n_envs, batch_size=steps, seed=seed, device="cpu", verbose=0)
    model._setup_learn(total_timesteps=10**9, callback=None)
    callback = CallbackList([])
    callback.init_callback(model)

    def collect() -> float:
        start = time.perf_counter()
        model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=steps // n_envs)
        return steps / (time.perf_counter() - start)

    return collect
