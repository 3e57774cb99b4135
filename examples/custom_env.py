"""Train on your own gymnasium env: register it, name it in a recipe's config, load the trained policy and play.

    python examples/custom_env.py [TOTAL_STEPS]

Registered in this script, the env exists in this process only; for `pickaxe eval` or a resume from the command
line, put it in an importable module and name it `my_pkg.envs:SignGame-v0` (the module is imported first).
"""

import sys

import gymnasium as gym
import numpy as np

import pickaxe as px


class SignGame(gym.Env):
    """Each step shows a number in [-1, 1]; action 1 says "positive", 0 "negative"; +1 for a right answer. An
    episode is ``length`` steps, so a perfect policy scores ``length``."""

    def __init__(self, length: int = 20) -> None:
        self.length = length
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t, self.x = 0, np.zeros(1, dtype=np.float32)

    def _draw(self) -> np.ndarray:
        self.x = self.np_random.uniform(-1.0, 1.0, size=1).astype(np.float32)
        return self.x

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(int(action) == int(self.x[0] > 0))
        self.t += 1
        return self._draw(), reward, self.t >= self.length, False, {}


gym.register("examples/SignGame-v0", entry_point=SignGame)

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
run = px.train(
    "cartpole-ppo",  # PPO's settings of this recipe, on the env below
    "runs/example-signgame",
    overwrite=True,  # a rerun moves the previous run aside
    env={"id": "examples/SignGame-v0", "kwargs": {"length": 20}},
    trainer={"total_steps": steps, "eval_every": max(steps // 4, 2048), "target_return": 19.5},
)
print(f"trained {run.steps} env steps; final eval return {run.eval_return:.1f} of 20; best step {run.best['step']}")
policy = run.load("best")
episodes = policy.play(gym.make("examples/SignGame-v0", length=20), episodes=3)
print(f"played 3 episodes: returns {episodes.returns.round(2).tolist()}, lengths {episodes.lengths.tolist()}")
