"""Recipes of the rest of the classic algorithm list (REINFORCE, NPG, TRPO, REDQ, IQN, FQF, branching DQN);
torch-free, like every config. ``pickaxe.recipes.classic`` lists them with the others."""

from __future__ import annotations

from pickaxe.algos.extra_configs import (
    BranchingDQNConfig,
    FQFConfig,
    IQNConfig,
    NPGConfig,
    REDQConfig,
    ReinforceConfig,
    TRPOConfig,
)
from pickaxe.recipes.recipe import Recipe
from pickaxe.train.config import CollectorConfig, EnvConfig, ModelConfig, TrainConfig, TrainerConfig


def _cartpole_on_policy(recipe: str, algo: ReinforceConfig | NPGConfig, steps: int) -> TrainConfig:
    """CartPole-v1 with 8 envs, tanh 64x64 networks, ``steps`` env steps per update, stopping at eval >= 475."""
    return TrainConfig(
        recipe=recipe,
        algo=algo,
        env=EnvConfig(id="CartPole-v1", num_envs=8, vectorization="auto"),
        model=ModelConfig(hidden=(64, 64), activation="tanh"),
        collector=CollectorConfig(steps=steps),
        trainer=TrainerConfig(total_steps=100_000, eval_every=4_096, target_return=475.0),
    )


def _cartpole_reinforce() -> TrainConfig:
    return _cartpole_on_policy(
        "cartpole-reinforce", ReinforceConfig(lr=3e-3, gamma=0.99, baseline=True, normalize_obs=True), 1024
    )


def _cartpole_npg() -> TrainConfig:
    return _cartpole_on_policy(
        "cartpole-npg", NPGConfig(max_kl=0.01, gamma=0.99, gae_lambda=0.95, critic_lr=3e-3, normalize_obs=True), 1024
    )


def _cartpole_trpo() -> TrainConfig:
    return _cartpole_on_policy(
        "cartpole-trpo", TRPOConfig(max_kl=0.02, gamma=0.99, gae_lambda=0.95, critic_lr=3e-3, normalize_obs=True), 1024
    )


def _pendulum_redq() -> TrainConfig:
    # pendulum-sac's setting (4 envs, 32-step collects, 64x64 relu nets, stop at -250) with REDQ's ensemble of 10
    # critics, targets from a random pair of them, and twice pendulum-sac's gradient steps per env step.
    return TrainConfig(
        recipe="pendulum-redq",
        algo=REDQConfig(
            lr=3e-3, gamma=0.99, tau=0.02, buffer_size=100_000, batch_size=256, learning_starts=500,
            gradient_steps=32, ensemble_size=10, subset_size=2, actor_delay=1,
        ),
        env=EnvConfig(id="Pendulum-v1", num_envs=4),
        model=ModelConfig(hidden=(64, 64), activation="relu"),
        collector=CollectorConfig(steps=32),
        trainer=TrainerConfig(total_steps=20_000, eval_every=1_000, target_return=-250.0),
    )  # fmt: skip


def _cartpole_quantile(recipe: str, algo: IQNConfig) -> TrainConfig:
    """cartpole-dqn's setting (8 envs, 256-step collects, 64x64 relu, stop at 475) around an IQN or FQF config."""
    return TrainConfig(
        recipe=recipe,
        algo=algo,
        env=EnvConfig(id="CartPole-v1", num_envs=8),
        model=ModelConfig(hidden=(64, 64), activation="relu"),
        collector=CollectorConfig(steps=256),
        trainer=TrainerConfig(total_steps=100_000, eval_every=6_000, target_return=475.0),
    )


_QUANTILE = {
    "lr": 5e-3, "gamma": 0.99, "buffer_size": 100_000, "batch_size": 64, "learning_starts": 1_000,
    "gradient_steps": 32, "target_update_every": 32, "eps_start": 1.0, "eps_end": 0.04, "eps_fraction": 0.075,
    "n_step": 3,
}  # fmt: skip
"""cartpole-rainbow's learning rate, 3-step returns, replay, exploration and target settings (those of cartpole-dqn
plus n-step), shared by cartpole-iqn and cartpole-fqf: both reach 475 on seeds 0-4 within 100k env steps
(docs/more-algorithms.md). At lr 1e-3 with 1-step returns (their first setting) IQN reached it on 1 of 3 seeds at
61,440 steps; FQF diverged until its quantile loss weighted the target's steps by their widths."""


def _cartpole_iqn() -> TrainConfig:
    return _cartpole_quantile("cartpole-iqn", IQNConfig(**_QUANTILE))


def _cartpole_fqf() -> TrainConfig:
    return _cartpole_quantile("cartpole-fqf", FQFConfig(**_QUANTILE, fractions=16))


def _pendulum_bdq() -> TrainConfig:
    return TrainConfig(
        recipe="pendulum-bdq",
        algo=BranchingDQNConfig(
            lr=1e-3, gamma=0.99, buffer_size=100_000, batch_size=128, learning_starts=1_000, gradient_steps=16,
            target_update_every=100, eps_start=1.0, eps_end=0.05, eps_fraction=0.2,
        ),
        env=EnvConfig(id="pickaxe/Discretized-v0", num_envs=4, kwargs={"task": "Pendulum-v1", "bins": 11}),
        model=ModelConfig(hidden=(64, 64), activation="relu"),
        collector=CollectorConfig(steps=32),
        trainer=TrainerConfig(total_steps=30_000, eval_every=2_000, target_return=-250.0),
    )  # fmt: skip


MORE_CLASSIC_RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "cartpole-reinforce",
            "REINFORCE with a learned baseline on CartPole-v1; stops when solved (eval >= 475)",
            _cartpole_reinforce,
        ),
        Recipe(
            "cartpole-npg",
            "Natural policy gradient (conjugate gradient, KL-sized step) on CartPole-v1; stops when solved (>= 475)",
            _cartpole_npg,
        ),
        Recipe(
            "cartpole-trpo",
            "TRPO (natural gradient, line search on the KL bound) on CartPole-v1; stops when solved (eval >= 475)",
            _cartpole_trpo,
        ),
        Recipe(
            "pendulum-redq",
            "REDQ (10 critics, min over a random pair) on Pendulum-v1; stops when solved (eval >= -250)",
            _pendulum_redq,
        ),
        Recipe(
            "cartpole-iqn",
            "Implicit quantile network (sampled fractions) on CartPole-v1; stops when solved (eval >= 475)",
            _cartpole_iqn,
        ),
        Recipe(
            "cartpole-fqf",
            "Fully parameterized quantile function (proposed fractions) on CartPole-v1; stops when solved (>= 475)",
            _cartpole_fqf,
        ),
        Recipe(
            "pendulum-bdq",
            "Branching DQN on Pendulum-v1 with MultiDiscrete (binned) actions; stops when solved (eval >= -250)",
            _pendulum_bdq,
        ),
    )
}
