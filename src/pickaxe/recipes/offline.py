"""Offline-RL recipes: behaviour cloning, TD3+BC, IQL, CQL, discrete BCQ and CRR on CartPole and Pendulum datasets;
GAIL, which imitates a dataset while it interacts with the env (torch-free).

Each needs ``--data.dataset DIR``: a dataset ``pickaxe collect`` made from one of pickaxe's own runs (expert: the
run's final policy; medium: ``--epsilon``/``--noise`` or an earlier step; random: ``--epsilon 1``), or any Minari
dataset of the same env. ``trainer.total_steps`` counts transitions sampled: ``total_steps / algo.batch_size``
gradient steps. ``benchmarks/offline.py`` makes the datasets and measures these recipes over seeds (docs/offline.md).
"""

from __future__ import annotations

from typing import Any

from pickaxe.algos.imitation_configs import GAILConfig
from pickaxe.algos.offline_configs import BCConfig, BCQConfig, CQLConfig, CRRConfig, IQLConfig, TD3BCConfig
from pickaxe.recipes.recipe import Recipe
from pickaxe.train.config import CollectorConfig, EnvConfig, ModelConfig, TrainConfig, TrainerConfig


def _offline(recipe: str, algo: Any, env_id: str, gradient_steps: int, evals: int = 5) -> TrainConfig:
    """An offline run on ``env_id``'s dataset: 8 gradient steps of 256 transitions per iteration, ``gradient_steps``
    in all, ``evals`` evaluations of 10 episodes."""
    total = gradient_steps * 256
    return TrainConfig(
        recipe=recipe,
        algo=algo,
        env=EnvConfig(id=env_id, num_envs=1, eval_envs=10),
        model=ModelConfig(hidden=(64, 64), activation="relu"),
        collector=CollectorConfig(steps=2048),
        trainer=TrainerConfig(total_steps=total, eval_every=total // evals, eval_episodes=10),
    )


def _cartpole_gail() -> TrainConfig:
    # cartpole-ppo's PPO (its settings solve CartPole in 6k-30k env steps) on the discriminator's reward
    return TrainConfig(
        recipe="cartpole-gail",
        algo=GAILConfig(
            lr=3e-3,
            epochs=10,
            minibatch_size=256,
            normalize_obs=True,
            normalize_reward=True,
            disc_lr=1e-3,
            disc_steps=8,
            disc_batch_size=256,
        ),
        env=EnvConfig(id="CartPole-v1", num_envs=8, vectorization="auto"),
        model=ModelConfig(hidden=(64, 64), activation="tanh"),
        collector=CollectorConfig(steps=256),
        trainer=TrainerConfig(total_steps=50_000, eval_every=5_000, target_return=475.0),
    )


def _pendulum_gail() -> TrainConfig:
    # pendulum-ppo's PPO on the discriminator's reward
    return TrainConfig(
        recipe="pendulum-gail",
        algo=GAILConfig(
            lr=1e-3,
            gamma=0.9,
            gae_lambda=0.95,
            epochs=10,
            minibatch_size=256,
            normalize_reward=True,
            disc_lr=1e-3,
            disc_steps=4,
            disc_batch_size=256,
        ),
        env=EnvConfig(id="Pendulum-v1", num_envs=8),
        model=ModelConfig(hidden=(64, 64), activation="tanh"),
        collector=CollectorConfig(steps=4096),
        trainer=TrainerConfig(total_steps=300_000, eval_every=20_000),
    )


OFFLINE_RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "cartpole-bc",
            "Behaviour cloning on a CartPole-v1 dataset (--data.dataset DIR; pickaxe collect makes one)",
            lambda: _offline("cartpole-bc", BCConfig(lr=1e-3), "CartPole-v1", 2_000),
        ),
        Recipe(
            "cartpole-iql",
            "IQL (expectile value, advantage-weighted policy) on a CartPole-v1 dataset (--data.dataset DIR)",
            lambda: _offline("cartpole-iql", IQLConfig(lr=1e-3), "CartPole-v1", 2_000),
        ),
        Recipe(
            "cartpole-cql",
            "Discrete CQL on DQN on a CartPole-v1 dataset (--data.dataset DIR)",
            lambda: _offline("cartpole-cql", CQLConfig(lr=1e-3), "CartPole-v1", 2_000),
        ),
        Recipe(
            "cartpole-bcq",
            "Discrete BCQ (DQN with a behaviour-cloning action filter) on a CartPole-v1 dataset (--data.dataset DIR)",
            lambda: _offline("cartpole-bcq", BCQConfig(lr=1e-3), "CartPole-v1", 2_000),
        ),
        Recipe(
            "cartpole-crr",
            "CRR (critic-weighted behaviour cloning, exp weights) on a CartPole-v1 dataset (--data.dataset DIR)",
            lambda: _offline("cartpole-crr", CRRConfig(lr=1e-3), "CartPole-v1", 2_000),
        ),
        Recipe(
            "pendulum-bc",
            "Behaviour cloning (Gaussian policy) on a Pendulum-v1 dataset (--data.dataset DIR)",
            lambda: _offline("pendulum-bc", BCConfig(lr=1e-3), "Pendulum-v1", 2_000),
        ),
        Recipe(
            "pendulum-td3-bc",
            "TD3+BC on a Pendulum-v1 dataset (--data.dataset DIR)",
            lambda: _offline("pendulum-td3-bc", TD3BCConfig(lr=1e-3), "Pendulum-v1", 2_000),
        ),
        Recipe(
            "pendulum-iql",
            "IQL on a Pendulum-v1 dataset (--data.dataset DIR)",
            lambda: _offline("pendulum-iql", IQLConfig(lr=1e-3), "Pendulum-v1", 2_000),
        ),
        Recipe(
            "pendulum-cql",
            "CQL(H) on SAC on a Pendulum-v1 dataset (--data.dataset DIR)",
            lambda: _offline("pendulum-cql", CQLConfig(lr=1e-3), "Pendulum-v1", 2_000),
        ),
        Recipe(
            "pendulum-crr",
            "CRR (exp weights, V from 4 policy samples) on a Pendulum-v1 dataset (--data.dataset DIR)",
            lambda: _offline("pendulum-crr", CRRConfig(lr=1e-3), "Pendulum-v1", 2_000),
        ),
        Recipe(
            "cartpole-gail",
            "GAIL (PPO on a discriminator's reward) imitating a CartPole-v1 dataset (--data.dataset DIR); stops at 475",
            _cartpole_gail,
        ),
        Recipe(
            "pendulum-gail",
            "GAIL (PPO with Gaussian actions on a discriminator's reward) imitating a Pendulum-v1 dataset "
            "(--data.dataset DIR)",
            _pendulum_gail,
        ),
    )
}
