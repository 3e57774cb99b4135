"""pickaxe: reinforcement-learning infrastructure. One loop for classic RL and LLM post-training.

import pickaxe as px
envs = px.envs.make("CartPole-v1", n=8, seed=0)
policy = px.models.ActorCritic.for_env(envs)
algo = px.algos.PPO(policy, px.algos.PPOConfig(lr=3e-4))
collector = px.Collector(envs, policy, steps=1024)
px.Trainer(algo, collector, eval_envs=px.envs.make("CartPole-v1", n=10, seed=1000),
           run=px.Run("runs/cartpole-ppo")).fit(total_steps=100_000)
"""

from __future__ import annotations

import importlib
import types
from typing import TYPE_CHECKING, Any

from pickaxe.lazy import lazy_getattr

__version__ = "0.1.0"

# Names resolve on first use (PEP 562), so `pickaxe queue list` or `pickaxe compare` start without
# importing torch and gymnasium; `import pickaxe as px; px.Trainer` works as usual.
_LAZY = {
    "TrainedRun": "pickaxe.api",
    "load": "pickaxe.api",
    "resume": "pickaxe.api",
    "Batch": "pickaxe.data.batch",
    "Collector": "pickaxe.rollout.collector",
    "Run": "pickaxe.runs.run",
    "Trainer": "pickaxe.train.trainer",
    "TrainerConfig": "pickaxe.train.config",
    "seed_everything": "pickaxe.utils",
}
_SUBMODULES = ("api", "algos", "data", "envs", "eval", "exp", "models", "recipes", "rollout", "runs", "train")
__all__ = [*_LAZY, *_SUBMODULES]

if TYPE_CHECKING:
    from pickaxe import algos, api, data, envs, eval, exp, models, recipes, rollout, runs, train  # noqa: F401
    from pickaxe.api import TrainedRun, load, resume  # noqa: F401
    from pickaxe.data.batch import Batch  # noqa: F401
    from pickaxe.rollout.collector import Collector  # noqa: F401
    from pickaxe.runs.run import Run  # noqa: F401
    from pickaxe.train.config import TrainerConfig  # noqa: F401
    from pickaxe.train.trainer import Trainer  # noqa: F401
    from pickaxe.utils import seed_everything  # noqa: F401


__getattr__ = lazy_getattr("pickaxe", _LAZY, globals(), _SUBMODULES)


class _CallablePackage(types.ModuleType):
    """``pickaxe.train`` is the package of the training code and, called, ``pickaxe.api.train``: a function named
    ``train`` beside the package would be replaced by it as soon as any of its modules is imported."""

    def __call__(self, recipe_or_config: Any, /, *args: Any, **kwargs: Any) -> Any:
        """``pickaxe.train("cartpole-ppo", run_dir=..., **overrides)``: see :func:`pickaxe.api.train`."""
        from pickaxe.api import train as train_run

        return train_run(recipe_or_config, *args, **kwargs)


importlib.import_module("pickaxe.train").__class__ = _CallablePackage  # its names still load on first use
