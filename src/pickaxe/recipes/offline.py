"""Offline-RL recipes: behaviour cloning, TD3+BC, IQL, CQL, discrete BCQ and CRR on CartPole and Pendulum datasets,
IQL and TD3+BC on Hopper and HalfCheetah datasets, IQL and CQL trained online to continue them, and GAIL, which
imitates a dataset while it interacts with the env (torch-free).

Each takes ``--data.dataset DIR``: a dataset ``pickaxe collect`` made from one of pickaxe's own runs (expert: the
run's final policy; medium: ``--epsilon``/``--noise`` or an earlier step; random: ``--epsilon 1``), or any Minari
dataset of the same env; without it, the ``--data.make`` kind (medium) of the env's dataset, made once from a source
run and cached (``recipes/datasets.py``). ``trainer.total_steps`` counts transitions sampled: ``total_steps /
algo.batch_size`` gradient steps. ``benchmarks/offline.py`` makes the datasets and measures these recipes over seeds
(docs/offline.md).
"""

from __future__ import annotations

from typing import Any

from pickaxe.algos.imitation_configs import GAILConfig
from pickaxe.algos.offline_configs import (
    BCConfig,
    BCQConfig,
    CQLConfig,
    CQLOnlineConfig,
    CRRConfig,
    IQLConfig,
    IQLOnlineConfig,
    TD3BCConfig,
)
from pickaxe.recipes.recipe import Recipe
from pickaxe.train.config import CollectorConfig, DataConfig, EnvConfig, ModelConfig, TrainConfig, TrainerConfig


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
        data=DataConfig(make="medium"),  # without --data.dataset: the env's medium dataset, made once and cached
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


def _mujoco(recipe: str, algo: Any, env_id: str, source_steps: int) -> TrainConfig:
    """An offline run on a MuJoCo dataset at a CPU budget: 256x256 relu nets (D4RL's), observations normalised by the
    dataset's mean and std (TD3+BC's practice; on Hopper medium it lifted TD3+BC from 30.4 to 73.8, docs/offline.md),
    10,000 gradient steps of 256 (the papers take 1M), five evaluations of 5 episodes; without --data.dataset the
    medium dataset of a source run of ``source_steps`` env steps."""
    algo.normalize_obs = True
    cfg = _offline(recipe, algo, env_id, 10_000)
    cfg.env.eval_envs, cfg.trainer.eval_episodes = 5, 5
    cfg.model.hidden = (256, 256)
    cfg.data = DataConfig(make="medium", source_steps=source_steps)
    return cfg


def _online(recipe: str, algo: Any, env_id: str) -> TrainConfig:
    """An offline algorithm trained online (``--warm-start.run`` an offline run of it): 4 envs, 32-step collects, 16
    gradient steps of 256 replay transitions after each (half a step per env step, as pendulum-sac), 10,000 env
    steps, an evaluation of 10 episodes every 1,000 (the offline recipes' evaluation, so a warm start's step-0
    evaluation repeats the offline run's last one)."""
    return TrainConfig(
        recipe=recipe,
        algo=algo,
        env=EnvConfig(id=env_id, num_envs=4, eval_envs=10),
        model=ModelConfig(hidden=(64, 64), activation="relu"),
        collector=CollectorConfig(steps=32),
        trainer=TrainerConfig(total_steps=10_000, eval_every=1_000, eval_episodes=10),
    )


def _iql_online() -> IQLOnlineConfig:
    return IQLOnlineConfig(lr=1e-3, buffer_size=100_000, gradient_steps=16)


def _cql_online() -> CQLOnlineConfig:
    return CQLOnlineConfig(lr=1e-3, buffer_size=100_000, gradient_steps=16)


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
        Recipe(
            "hopper-iql",
            "IQL on a Hopper-v5 dataset (mujoco; default: the medium dataset of a 300k-step hopper-ppo); CPU budget",
            lambda: _mujoco("hopper-iql", IQLConfig(lr=3e-4), "Hopper-v5", 300_000),
        ),
        Recipe(
            "hopper-td3-bc",
            "TD3+BC on a Hopper-v5 dataset (mujoco; default: the medium dataset of a 300k-step hopper-ppo); CPU budget",
            lambda: _mujoco("hopper-td3-bc", TD3BCConfig(lr=3e-4), "Hopper-v5", 300_000),
        ),
        Recipe(
            "halfcheetah-iql",
            "IQL on a HalfCheetah-v5 dataset (mujoco; default: the medium dataset of halfcheetah-sac); CPU budget",
            lambda: _mujoco("halfcheetah-iql", IQLConfig(lr=3e-4), "HalfCheetah-v5", 100_000),
        ),
        Recipe(
            "halfcheetah-td3-bc",
            "TD3+BC on a HalfCheetah-v5 dataset (mujoco; default: the medium dataset of halfcheetah-sac); CPU budget",
            lambda: _mujoco("halfcheetah-td3-bc", TD3BCConfig(lr=3e-4), "HalfCheetah-v5", 100_000),
        ),
        Recipe(
            "cartpole-iql-online",
            "IQL trained online on CartPole-v1, replay seeded from the dataset (--warm-start.run a cartpole-iql run)",
            lambda: _online("cartpole-iql-online", _iql_online(), "CartPole-v1"),
        ),
        Recipe(
            "cartpole-cql-online",
            "Discrete CQL trained online on CartPole-v1, penalty kept (--warm-start.run a cartpole-cql run)",
            lambda: _online("cartpole-cql-online", _cql_online(), "CartPole-v1"),
        ),
        Recipe(
            "pendulum-iql-online",
            "IQL trained online on Pendulum-v1, replay seeded from the dataset (--warm-start.run a pendulum-iql run)",
            lambda: _online("pendulum-iql-online", _iql_online(), "Pendulum-v1"),
        ),
        Recipe(
            "pendulum-cql-online",
            "CQL(H) on SAC trained online on Pendulum-v1, penalty kept (--warm-start.run a pendulum-cql run)",
            lambda: _online("pendulum-cql-online", _cql_online(), "Pendulum-v1"),
        ),
    )
}
