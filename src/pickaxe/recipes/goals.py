"""Goal-conditioned recipes: off-policy algorithms with hindsight experience replay (``--algo.her``) on goal envs,
judged by their evaluation success rate; torch-free, like every config."""

from __future__ import annotations

from pickaxe.algos.control_configs import DDPGConfig, SACConfig
from pickaxe.recipes.recipe import Recipe
from pickaxe.train.config import CollectorConfig, EnvConfig, ModelConfig, TrainConfig, TrainerConfig

SUCCESS = "eval/success_rate"


def _pointgoal(recipe: str, algo: SACConfig | DDPGConfig) -> TrainConfig:
    # pickaxe/PointGoal-v0 (30-step episodes, sparse -1/0 reward): 4 envs, 32-step collects, a gradient step per two
    # env steps, small nets; stops once 90% of 50 eval episodes end on their goal
    return TrainConfig(
        recipe=recipe,
        algo=algo,
        env=EnvConfig(id="pickaxe/PointGoal-v0", num_envs=4),
        model=ModelConfig(hidden=(64, 64), activation="relu"),
        collector=CollectorConfig(steps=32),
        trainer=TrainerConfig(
            total_steps=10_000, eval_every=1_000, eval_episodes=50, target_return=0.9, target_metric=SUCCESS
        ),
    )


def _pointgoal_her_sac() -> TrainConfig:
    return _pointgoal(
        "pointgoal-her-sac",
        SACConfig(
            lr=1e-3, gamma=0.95, tau=0.05, buffer_size=100_000, batch_size=256, learning_starts=500,
            gradient_steps=16, her="future", her_k=4,
        ),
    )  # fmt: skip


def _pointgoal_her_ddpg() -> TrainConfig:
    # DDPG with HER as in the HER paper (there with Fetch's 50-step episodes): Gaussian exploration noise
    return _pointgoal(
        "pointgoal-her-ddpg",
        DDPGConfig(
            lr=1e-3, gamma=0.95, tau=0.05, buffer_size=100_000, batch_size=256, learning_starts=500,
            gradient_steps=16, exploration_noise=0.2, her="future", her_k=4,
        ),
    )  # fmt: skip


def _pointmaze_her_sac() -> TrainConfig:
    # gymnasium-robotics' PointMaze_UMaze-v3 (the `goals` extra): sparse reward 1 within 0.45 of the goal, episodes
    # cut to 100 steps; its success is info["success"] at the last step
    return TrainConfig(
        recipe="pointmaze-her-sac",
        algo=SACConfig(
            lr=1e-3, gamma=0.98, tau=0.05, buffer_size=300_000, batch_size=256, learning_starts=1_000,
            gradient_steps=16, her="future", her_k=4,
        ),
        env=EnvConfig(id="gymnasium_robotics:PointMaze_UMaze-v3", num_envs=4, kwargs={"max_episode_steps": 100}),
        model=ModelConfig(hidden=(128, 128), activation="relu"),
        collector=CollectorConfig(steps=32),
        trainer=TrainerConfig(
            total_steps=24_000, eval_every=2_000, eval_episodes=50, target_return=0.9, target_metric=SUCCESS
        ),
    )  # fmt: skip


def _fetchreach_her_sac() -> TrainConfig:
    # gymnasium-robotics' FetchReach-v4 (the `goals` extra, MuJoCo < 3.12): 50-step episodes, reward -1 until the
    # gripper is within 5 cm of the goal; PointGoal's SAC settings with gamma 0.98, a CPU budget of 20,000 env steps
    return TrainConfig(
        recipe="fetchreach-her-sac",
        algo=SACConfig(
            lr=1e-3, gamma=0.98, tau=0.05, buffer_size=100_000, batch_size=256, learning_starts=500,
            gradient_steps=16, her="future", her_k=4,
        ),
        env=EnvConfig(id="gymnasium_robotics:FetchReach-v4", num_envs=4),
        model=ModelConfig(hidden=(64, 64), activation="relu"),
        collector=CollectorConfig(steps=32),
        trainer=TrainerConfig(
            total_steps=20_000, eval_every=2_000, eval_episodes=50, target_return=0.9, target_metric=SUCCESS
        ),
    )  # fmt: skip


GOAL_RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "pointgoal-her-sac",
            "SAC with hindsight replay (future, k=4) on pickaxe/PointGoal-v0; stops at an eval success rate >= 0.9",
            _pointgoal_her_sac,
        ),
        Recipe(
            "pointgoal-her-ddpg",
            "DDPG with hindsight replay (future, k=4) on pickaxe/PointGoal-v0; stops at an eval success rate >= 0.9",
            _pointgoal_her_ddpg,
        ),
        Recipe(
            "pointmaze-her-sac",
            "SAC with hindsight replay on gymnasium-robotics' PointMaze_UMaze-v3 (pip install 'pickaxe[goals]'); "
            "stops at an eval success rate >= 0.9",
            _pointmaze_her_sac,
        ),
        Recipe(
            "fetchreach-her-sac",
            "SAC with hindsight replay on gymnasium-robotics' FetchReach-v4 "
            "(pip install 'pickaxe[goals]', MuJoCo < 3.12); "
            "stops at an eval success rate >= 0.9",
            _fetchreach_her_sac,
        ),
    )
}
