"""Load a trained policy from its run folder and act with it: one observation, a batch, a gymnasium env.

    python examples/load_and_act.py [TOTAL_STEPS]

`px.load(RUN_DIR, checkpoint=...)` takes "best" (the run's selected step), "final", "latest" or an env step; the
weights are checked against their recorded sha256 first and the run's observation normalisation comes with them.
"""

import sys

import gymnasium as gym
import numpy as np

import pickaxe as px

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
px.train("cartpole-ppo", "runs/example-load", overwrite=True, trainer={"total_steps": steps, "eval_every": 2048})

policy = px.load("runs/example-load", checkpoint="best")
env = gym.make("CartPole-v1")
obs, _ = env.reset(seed=0)
print("one observation ->", policy.act(obs))  # deterministic=True by default
batch = np.stack([env.observation_space.sample() for _ in range(4)])
print("a batch of 4 ->", policy.act(batch))
episodes = policy.play(env, episodes=3, seed=0)  # episode k starts from env.reset(seed=0 + k)
print(f"played: returns {episodes.returns.tolist()}")
own = policy.evaluate()  # the run's own eval envs and seed: what it logged for these weights
print(f"the run's own evaluation: mean return {own.mean_return:.1f} over {len(own.returns)} episodes")
