"""Train PPO on CartPole from the library's parts: the same run `pickaxe train cartpole-ppo` builds."""

import sys

import pickaxe as px

total_steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
px.seed_everything(0)
envs = px.envs.make("CartPole-v1", n=8, seed=0)
# normalize_obs learns from observations through the policy's own running statistics
policy = px.models.ObsNormalized(px.models.ActorCritic.for_env(envs), obs_shape=(4,))
config = px.algos.PPOConfig(lr=3e-3, epochs=10, minibatch_size=256, normalize_obs=True, normalize_reward=True)
algo = px.algos.PPO(policy, config)
collector = px.Collector(envs, policy, steps=256)
trainer = px.Trainer(
    algo,
    collector,
    eval_envs=px.envs.make("CartPole-v1", n=10, seed=1000),
    run=px.Run("runs/example-cartpole-ppo", overwrite=True),  # a rerun moves the previous run aside
    config=px.TrainerConfig(eval_every=6_000, target_return=475),
    progress=True,
)
result = trainer.fit(total_steps)
print(f"eval return {result.eval_return:.1f} after {result.steps} env steps")
