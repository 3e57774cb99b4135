"""Sparse-reward recipes: PPO with an exploration bonus (RND, ICM); torch-free, like every config."""

from __future__ import annotations

from dataclasses import replace

from pickaxe.algos.explore_configs import ExplorePPOConfig
from pickaxe.recipes.recipe import Recipe
from pickaxe.train.config import CollectorConfig, EnvConfig, ModelConfig, TrainConfig, TrainerConfig


def _mountaincar_rnd() -> TrainConfig:
    # MountainCar-v0: -1 per step until the car reaches the flag (200 steps max); a policy that never reaches it
    # learns nothing from the extrinsic reward. --algo.intrinsic none is plain PPO with the same settings.
    return TrainConfig(
        recipe="mountaincar-rnd",
        algo=ExplorePPOConfig(
            intrinsic="rnd", lr=1e-3, gamma=0.999, gamma_int=0.99, gae_lambda=0.95, epochs=4, minibatch_size=512,
            ent_coef=0.0, int_coef=1.0, ext_coef=2.0, normalize_obs=True,
        ),
        env=EnvConfig(id="MountainCar-v0", num_envs=16),
        model=ModelConfig(hidden=(64, 64), activation="tanh"),
        collector=CollectorConfig(steps=2048),
        trainer=TrainerConfig(total_steps=200_000, eval_every=10_240, target_return=-150.0),
    )  # fmt: skip


def _mountaincar_icm() -> TrainConfig:
    # mountaincar-rnd's settings with ICM's bonus (eta 1: 0.01 is too small beside the -1 per step)
    cfg = _mountaincar_rnd()
    cfg.recipe = "mountaincar-icm"
    cfg.algo = replace(cfg.algo, intrinsic="icm", icm_eta=1.0)
    return cfg


EXPLORE_RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "mountaincar-rnd",
            "PPO with RND intrinsic rewards on MountainCar-v0 (sparse reward); stops at an eval return >= -150",
            _mountaincar_rnd,
        ),
        Recipe(
            "mountaincar-icm",
            "PPO with ICM intrinsic rewards on MountainCar-v0 (sparse reward); stops at an eval return >= -150",
            _mountaincar_icm,
        ),
    )
}
