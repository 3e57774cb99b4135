"""Stable-Baselines3 runs that the other benchmarks put side by side with pickaxe's (``cartpole.py``,
``collector.py``). SB3 is never a pickaxe dependency: ``pip install -r benchmarks/requirements-baselines.txt``.

Hyper-parameters are RL Baselines3 Zoo's tuned CartPole-v1 settings (``hyperparams/ppo.yml`` and ``dqn.yml``);
evaluation matches pickaxe's benchmark: every ``eval_every`` env steps, 10 deterministic episodes on 10 separate
eval envs (one episode each), stopping at the first evaluation whose mean return reaches the target.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

SB3_MISSING = "Stable-Baselines3 is not installed; fix: pip install -r benchmarks/requirements-baselines.txt"

# rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1 ("lin_" schedules decay linearly to 0 over n_timesteps)
PPO_ZOO = {
    "n_envs": 8, "n_timesteps": 100_000, "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98,
    "n_epochs": 20, "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2,
}  # fmt: skip
# rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1
DQN_ZOO = {
    "n_timesteps": 50_000, "learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000,
    "learning_starts": 1000, "gamma": 0.99, "target_update_interval": 10, "train_freq": 256, "gradient_steps": 128,
    "exploration_fraction": 0.16, "exploration_final_eps": 0.04, "net_arch": [256, 256],
}  # fmt: skip


def available() -> bool:
    """Whether Stable-Baselines3 imports."""
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return False
    return True


def _linear(start: float) -> Callable[[float], float]:
    return lambda progress_remaining: progress_remaining * start


def _solve(model: Any, n_envs: int, eval_every: int, eval_episodes: int, target: float, max_steps: int) -> dict:
    """``model.learn`` with an evaluation every ``eval_every`` env steps, stopping at ``target``."""
    from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
    from stable_baselines3.common.env_util import make_vec_env

    result: dict[str, Any] = {
        "solved_step": None,
        "solved_wall_s": None,
        "solved_cpu_s": None,
        "best_eval_return": None,
    }
    start = [0.0, 0.0]

    class Stop(BaseCallback):
        def _on_step(self) -> bool:
            best = result["best_eval_return"]
            result["best_eval_return"] = max(best if best is not None else -1e9, float(self.parent.last_mean_reward))
            if self.parent.last_mean_reward >= target:
                result["solved_step"] = int(self.num_timesteps)
                result["solved_wall_s"] = time.perf_counter() - start[0]
                result["solved_cpu_s"] = time.process_time() - start[1]
                return False
            return True

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
    model.learn(total_timesteps=max_steps, callback=callback)
    result["wall_s"] = time.perf_counter() - start[0]
    result["steps"] = int(model.num_timesteps)
    return result


def sb3_ppo_cartpole(seed: int, eval_every: int, eval_episodes: int, target: float, max_steps: int) -> dict:
    """SB3 PPO (zoo settings) on CartPole-v1 until the eval mean return reaches ``target``; seconds from ``learn``."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    z = PPO_ZOO
    env = make_vec_env("CartPole-v1", n_envs=z["n_envs"], seed=seed)
    model = PPO(
        "MlpPolicy", env, n_steps=z["n_steps"], batch_size=z["batch_size"], gae_lambda=z["gae_lambda"],
        gamma=z["gamma"], n_epochs=z["n_epochs"], ent_coef=z["ent_coef"], learning_rate=_linear(z["learning_rate"]),
        clip_range=_linear(z["clip_range"]), seed=seed, device="cpu", verbose=0,
    )  # fmt: skip
    return _solve(model, z["n_envs"], eval_every, eval_episodes, target, max_steps)


def sb3_dqn_cartpole(seed: int, eval_every: int, eval_episodes: int, target: float, max_steps: int) -> dict:
    """SB3 DQN (zoo settings) on CartPole-v1 until the eval mean return reaches ``target``; seconds from ``learn``."""
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
    return _solve(model, 1, eval_every, eval_episodes, target, max_steps)


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
