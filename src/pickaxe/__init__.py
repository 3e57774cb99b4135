"""pickaxe: reinforcement-learning infrastructure. One loop for classic RL and LLM post-training.

import pickaxe as px
envs = px.envs.make("CartPole-v1", n=8, seed=0)
policy = px.models.ActorCritic.for_env(envs)
algo = px.algos.PPO(policy, px.algos.PPOConfig(lr=3e-4))
collector = px.Collector(envs, policy, steps=1024)
px.Trainer(algo, collector, eval_envs=px.envs.make("CartPole-v1", n=10, seed=1000),
           run=px.Run("runs/cartpole-ppo")).fit(total_steps=100_000)
"""

from pickaxe import algos, data, envs, models
from pickaxe.data.batch import Batch
from pickaxe.rollout.collector import Collector
from pickaxe.runs.run import Run
from pickaxe.train.trainer import Trainer, TrainerConfig
from pickaxe.utils import seed_everything

__version__ = "0.1.0"
__all__ = [
    "Batch",
    "Collector",
    "Run",
    "Trainer",
    "TrainerConfig",
    "algos",
    "data",
    "envs",
    "models",
    "seed_everything",
]
