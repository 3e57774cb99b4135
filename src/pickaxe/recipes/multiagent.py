"""Multi-agent recipes: IPPO, MAPPO (Discrete and continuous actions) and independent DQN on MPE2 simple_spread
(PettingZoo); torch-free."""

from __future__ import annotations

from pickaxe.algos.multiagent_configs import IDQNConfig, IPPOConfig, MAPPOConfig
from pickaxe.recipes.recipe import Recipe
from pickaxe.train.config import CollectorConfig, EnvConfig, ModelConfig, TrainConfig, TrainerConfig


def _simple_spread_mappo() -> TrainConfig:
    # MPE2 simple_spread: 3 agents cover 3 landmarks in 25-step episodes, discrete actions. MAPPO-style settings
    # (lr 7e-4, 10 epochs, clip 0.2, entropy 0.01, 64x64 networks, shared parameters) at a CPU budget: 8 envs and
    # 50k env steps (2,000 episodes) instead of the millions of steps a converged result takes.
    return TrainConfig(
        recipe="simple-spread-mappo",
        algo=MAPPOConfig(lr=7e-4, epochs=10, minibatch_size=1200, ent_coef=0.01, value_clip=0.2),
        env=EnvConfig(
            id="mpe2:simple_spread_v3", num_envs=8, eval_envs=4,
            kwargs={"N": 3, "local_ratio": 0.5, "max_cycles": 25, "continuous_actions": False},
        ),
        model=ModelConfig(hidden=(64, 64), activation="tanh"),
        collector=CollectorConfig(steps=800),
        trainer=TrainerConfig(total_steps=50_000, eval_every=10_000, eval_episodes=20),
    )  # fmt: skip


def _simple_spread_ippo() -> TrainConfig:
    # the same settings with each agent's critic on its own observation
    cfg = _simple_spread_mappo()
    a = cfg.algo
    cfg.recipe = "simple-spread-ippo"
    cfg.algo = IPPOConfig(lr=a.lr, epochs=a.epochs, minibatch_size=a.minibatch_size, ent_coef=a.ent_coef,
                          value_clip=a.value_clip)  # fmt: skip
    return cfg


def _simple_spread_idqn() -> TrainConfig:
    # independent double DQN with a shared Q-network (agent id appended) on the same env and budget
    cfg = _simple_spread_mappo()
    cfg.recipe = "simple-spread-idqn"
    cfg.algo = IDQNConfig(lr=5e-4, buffer_size=150_000, batch_size=256, learning_starts=2_400, gradient_steps=32,
                          target_update_every=200, eps_fraction=0.3)  # fmt: skip
    cfg.model = ModelConfig(hidden=(64, 64), activation="relu")
    return cfg


def _simple_spread_mappo_continuous() -> TrainConfig:
    # the MAPPO recipe with MPE2's continuous actions: each agent a Box(0, 1, (5,)) of (no-op and four directional)
    # magnitudes, taken by a Gaussian actor (its samples clipped to the bounds when sent); settings otherwise the same
    cfg = _simple_spread_mappo()
    cfg.recipe = "simple-spread-mappo-continuous"
    cfg.env.kwargs["continuous_actions"] = True
    return cfg


def _simple_adversary_mappo() -> TrainConfig:
    # a mixed game: one adversary (who does not see the target landmark) against two cooperating agents (who do);
    # observations of 8 (adversary) and 10 numbers, zero-padded to 10; per-agent returns tell the sides apart
    cfg = _simple_spread_mappo()
    cfg.recipe = "simple-adversary-mappo"
    cfg.env = EnvConfig(
        id="mpe2:simple_adversary_v3", num_envs=8, eval_envs=4,
        kwargs={"N": 2, "max_cycles": 25, "continuous_actions": False},
    )  # fmt: skip
    return cfg


MULTIAGENT_RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "simple-spread-mappo",
            "MAPPO (centralised critic on the global state, shared parameters) on MPE2 simple_spread, 3 agents",
            _simple_spread_mappo,
        ),
        Recipe(
            "simple-spread-mappo-continuous",
            "MAPPO with a Gaussian actor on MPE2 simple_spread's continuous actions (Box(0, 1, (5,))), 3 agents",
            _simple_spread_mappo_continuous,
        ),
        Recipe(
            "simple-spread-ippo",
            "IPPO (each agent's critic on its own observation, shared parameters) on MPE2 simple_spread, 3 agents",
            _simple_spread_ippo,
        ),
        Recipe(
            "simple-spread-idqn",
            "independent double DQN (shared Q-network with the agent's id) on MPE2 simple_spread, 3 agents",
            _simple_spread_idqn,
        ),
        Recipe(
            "simple-adversary-mappo",
            "MAPPO on MPE2 simple_adversary: one adversary against two cooperating agents (a mixed game)",
            _simple_adversary_mappo,
        ),
    )
}
