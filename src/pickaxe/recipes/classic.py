"""Classic-RL recipes (gymnasium tasks); torch-free, like every config."""

from __future__ import annotations

from pickaxe.algos.configs import DQNConfig, PPOConfig
from pickaxe.recipes.recipe import Recipe
from pickaxe.train.config import CollectorConfig, EnvConfig, ModelConfig, TrainConfig, TrainerConfig


def _cartpole_ppo() -> TrainConfig:
    # Short rollouts, low gamma/lambda (the RL-zoo family of CartPole settings), then tuned for wall time on
    # a 2-core CPU: relu (tanh costs ~15x more per element there), 10 epochs at a constant 3e-3.
    return TrainConfig(
        recipe="cartpole-ppo",
        algo=PPOConfig(lr=3e-3, gamma=0.98, gae_lambda=0.8, clip=0.2, ent_coef=0.0, epochs=10, minibatch_size=256),
        env=EnvConfig(id="CartPole-v1", num_envs=8),
        model=ModelConfig(hidden=(64, 64), activation="relu"),
        collector=CollectorConfig(steps=256),
        # CartPole-v1 counts as solved at 475; stop there (--trainer.stop-at-target False trains the full budget)
        trainer=TrainerConfig(total_steps=100_000, eval_every=6_000, target_return=475.0),
    )


def _cartpole_dqn() -> TrainConfig:
    # A small net with few gradient steps per collect, fast epsilon decay and a frequent target sync: the
    # fastest setting in wall time of those tried (benchmarks/cartpole.py).
    return TrainConfig(
        recipe="cartpole-dqn",
        algo=DQNConfig(
            lr=5e-3, gamma=0.99, buffer_size=100_000, batch_size=64, learning_starts=1_000,
            gradient_steps=32, target_update_every=32, eps_start=1.0, eps_end=0.04, eps_fraction=0.075,
        ),
        env=EnvConfig(id="CartPole-v1", num_envs=8),
        model=ModelConfig(hidden=(64, 64), activation="relu"),
        collector=CollectorConfig(steps=256),
        trainer=TrainerConfig(total_steps=100_000, eval_every=6_000, target_return=475.0),
    )  # fmt: skip


def _pendulum_ppo() -> TrainConfig:
    return TrainConfig(
        recipe="pendulum-ppo",
        algo=PPOConfig(
            lr=1e-3,
            gamma=0.9,
            gae_lambda=0.95,
            clip=0.2,
            ent_coef=0.0,
            epochs=10,
            minibatch_size=256,
        ),
        env=EnvConfig(id="Pendulum-v1", num_envs=8),
        model=ModelConfig(hidden=(64, 64), activation="tanh"),
        collector=CollectorConfig(steps=4096),
        trainer=TrainerConfig(total_steps=300_000, eval_every=20_000),
    )


CLASSIC_RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "cartpole-ppo",
            "PPO on CartPole-v1, discrete actions; stops when solved (eval >= 475), in ~18k steps",
            _cartpole_ppo,
        ),
        Recipe(
            "cartpole-dqn",
            "Double DQN on CartPole-v1 with a target network and epsilon decay; stops when solved (eval >= 475)",
            _cartpole_dqn,
        ),
        Recipe("pendulum-ppo", "PPO with Gaussian actions on Pendulum-v1 (continuous control)", _pendulum_ppo),
    )
}
