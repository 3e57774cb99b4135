"""Classic-RL recipes (gymnasium tasks); torch-free, like every config."""

from __future__ import annotations

from pickaxe.algos.configs import A2CConfig, DQNConfig, PPOConfig, RecurrentPPOConfig
from pickaxe.algos.control_configs import DDPGConfig, SACConfig, TD3Config
from pickaxe.recipes.recipe import Recipe
from pickaxe.train.config import CollectorConfig, EnvConfig, ModelConfig, TrainConfig, TrainerConfig


def _cartpole_ppo() -> TrainConfig:
    # PPO's defaults (gamma 0.99, lambda 0.95, tanh) with observations and rewards normalised, 10 full-batch epochs
    # of 256 steps at lr 3e-3: over 32 seeds the median is the first evaluation (6,144 steps) and every seed solved by
    # 30,208 on the two CPUs measured (which seeds need more differs with the CPU's rounding). Without
    # the normalisation, or with the RL-zoo family's gamma 0.98 / lambda 0.8, the median was 18k-30k with seeds past
    # 54k (benchmarks/README.md, cartpole.py).
    return TrainConfig(
        recipe="cartpole-ppo",
        algo=PPOConfig(lr=3e-3, epochs=10, minibatch_size=256, normalize_obs=True, normalize_reward=True),
        # auto: the numpy-vectorised CartPole (same numbers as sync, ~3x faster to step); sync for other --env.id
        env=EnvConfig(id="CartPole-v1", num_envs=8, vectorization="auto"),
        model=ModelConfig(hidden=(64, 64), activation="tanh"),
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


def _cartpole_rainbow() -> TrainConfig:
    # Rainbow's parts as DQN options (3-step returns, prioritized replay, dueling C51 head; epsilon-greedy
    # exploration rather than noisy nets) on the cartpole-dqn settings. The C51 support covers CartPole's discounted
    # returns (<= 100); 21 atoms solved in the same env steps as 51 at ~25% less CPU (docs/dqn.md).
    return TrainConfig(
        recipe="cartpole-rainbow",
        algo=DQNConfig(
            lr=5e-3, gamma=0.99, buffer_size=100_000, batch_size=64, learning_starts=1_000,
            gradient_steps=32, target_update_every=32, eps_start=1.0, eps_end=0.04, eps_fraction=0.075,
            n_step=3, prioritized=True, dueling=True, distributional="c51", atoms=21, v_min=0.0, v_max=100.0,
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


def _pong_dqn() -> TrainConfig:
    # Nature-CNN double DQN with the standard Atari settings (SB3 zoo / CleanRL: Adam 1e-4, batch 32, one gradient
    # step per 4 env steps, target sync every 1,000 env steps = 250 gradient steps, epsilon 1 -> 0.01 over 10% of
    # the run) on a short CPU budget: learning from 20k steps, a 30k-transition replay (frames are stored in full,
    # obs and next_obs: ~56 KB a transition, in memory and in every checkpoint); the full budget is in docs/envs.md.
    return TrainConfig(
        recipe="pong-dqn",
        algo=DQNConfig(
            lr=1e-4, gamma=0.99, buffer_size=30_000, batch_size=32, learning_starts=20_000, gradient_steps=8,
            target_update_every=250, eps_start=1.0, eps_end=0.01, eps_fraction=0.1, max_grad_norm=10.0,
        ),
        env=EnvConfig(id="ALE/Pong-v5", num_envs=8, eval_envs=4),
        model=ModelConfig(hidden=(), activation="relu"),
        collector=CollectorConfig(steps=32),
        trainer=TrainerConfig(
            total_steps=100_000, eval_every=50_000, eval_episodes=4, target_return=18.0, keep_last=1, keep_best=1,
        ),
    )  # fmt: skip


def _breakout_ppo() -> TrainConfig:
    # CleanRL's ppo_atari settings: 8 envs x 128 steps, 4 epochs of 4 minibatches, lr 2.5e-4 annealed, clip 0.1 on
    # the ratio and the value, entropy 0.01; Nature-CNN torso shared by linear actor and critic heads. Short CPU
    # budget; the full 10M-step budget is in docs/envs.md.
    return TrainConfig(
        recipe="breakout-ppo",
        algo=PPOConfig(
            lr=2.5e-4, lr_schedule="linear", gamma=0.99, gae_lambda=0.95, clip=0.1, value_clip=0.1, vf_coef=0.5,
            ent_coef=0.01, epochs=4, minibatch_size=256, max_grad_norm=0.5,
        ),
        env=EnvConfig(id="ALE/Breakout-v5", num_envs=8, eval_envs=4),
        model=ModelConfig(hidden=(), activation="relu"),
        collector=CollectorConfig(steps=1024),
        trainer=TrainerConfig(total_steps=100_000, eval_every=50_000, eval_episodes=4),
    )  # fmt: skip


def _pendulum_off_policy(recipe: str, algo: SACConfig | TD3Config) -> TrainConfig:
    """The Pendulum setting that pendulum-sac, -td3 and -ddpg share (4 envs, 32-step collects, small relu nets,
    an eval every 1,000 steps, stopping at -250) around the recipe's algorithm config."""
    return TrainConfig(
        recipe=recipe,
        algo=algo,
        env=EnvConfig(id="Pendulum-v1", num_envs=4),
        model=ModelConfig(hidden=(64, 64), activation="relu"),
        collector=CollectorConfig(steps=32),
        trainer=TrainerConfig(total_steps=20_000, eval_every=1_000, target_return=-250.0),
    )


def _pendulum_sac() -> TrainConfig:
    # Small relu nets, a high learning rate and half a gradient step per env step (16 after each collect of 32 steps,
    # 4 envs x 8): the fewest gradient steps to -250 of the settings tried (docs/continuous-control.md).
    return _pendulum_off_policy(
        "pendulum-sac",
        SACConfig(
            lr=3e-3, gamma=0.99, tau=0.02, buffer_size=100_000, batch_size=256, learning_starts=500,
            gradient_steps=16,
        ),
    )  # fmt: skip


def _pendulum_td3() -> TrainConfig:
    # As pendulum-sac, with target smoothing (0.2 clipped at 0.5); on this short budget exploration noise 0.2 and the
    # actor updated at every critic step reached -250 in about half the env steps of TD3's delay of 2 (seed 0).
    return _pendulum_off_policy(
        "pendulum-td3",
        TD3Config(
            lr=3e-3, gamma=0.99, tau=0.02, buffer_size=100_000, batch_size=256, learning_starts=500,
            gradient_steps=16, exploration_noise=0.2, policy_delay=1,
        ),
    )  # fmt: skip


def _pendulum_ddpg() -> TrainConfig:
    # pendulum-td3's settings with one critic and no target smoothing: DDPG as the TD3 paper re-implemented it.
    return _pendulum_off_policy(
        "pendulum-ddpg",
        DDPGConfig(
            lr=3e-3, gamma=0.99, tau=0.02, buffer_size=100_000, batch_size=256, learning_starts=500,
            gradient_steps=16, exploration_noise=0.2,
        ),
    )  # fmt: skip


def _halfcheetah_sac() -> TrainConfig:
    # The SAC paper's / SB3 zoo's MuJoCo settings (256x256 relu, lr 3e-4, batch 256, tau 0.005, 10k random steps,
    # one gradient step per env step); a short CPU budget here, --trainer.total-steps 1000000 for the paper's.
    return TrainConfig(
        recipe="halfcheetah-sac",
        algo=SACConfig(
            lr=3e-4, gamma=0.99, tau=0.005, buffer_size=1_000_000, batch_size=256, learning_starts=10_000,
            gradient_steps=8,
        ),
        env=EnvConfig(id="HalfCheetah-v5", num_envs=1, eval_envs=5),
        model=ModelConfig(hidden=(256, 256), activation="relu"),
        collector=CollectorConfig(steps=8),
        trainer=TrainerConfig(total_steps=100_000, eval_every=10_000, eval_episodes=5),
    )  # fmt: skip


def _cartpole_a2c() -> TrainConfig:
    # A2C with 16 steps per env per update and Adam at 3e-3 with normalised advantages: solves in 12k-16k steps on
    # seeds 0-2, where SB3's A2C settings (5 steps per env, RMSprop 7e-4; --algo.optimizer rmsprop) need ~500k.
    return TrainConfig(
        recipe="cartpole-a2c",
        algo=A2CConfig(lr=3e-3, gamma=0.99, gae_lambda=1.0, optimizer="adam", normalize_advantage=True),
        env=EnvConfig(id="CartPole-v1", num_envs=8),
        model=ModelConfig(hidden=(64, 64), activation="relu"),
        collector=CollectorConfig(steps=128),
        trainer=TrainerConfig(total_steps=100_000, eval_every=4_000, target_return=475.0),
    )


def _hopper_ppo() -> TrainConfig:
    # CleanRL's ppo_continuous_action settings (1 env x 2048 steps, 10 epochs of 64-step minibatches, lr 3e-4
    # annealed, value clipping 0.2, tanh 64x64) with observation and reward normalisation; 1M steps.
    return TrainConfig(
        recipe="hopper-ppo",
        algo=PPOConfig(
            lr=3e-4, lr_schedule="linear", gamma=0.99, gae_lambda=0.95, clip=0.2, value_clip=0.2, ent_coef=0.0,
            vf_coef=0.5, epochs=10, minibatch_size=64, max_grad_norm=0.5, normalize_obs=True, normalize_reward=True,
        ),
        env=EnvConfig(id="Hopper-v5", num_envs=1, eval_envs=5),
        model=ModelConfig(hidden=(64, 64), activation="tanh"),
        collector=CollectorConfig(steps=2048),
        trainer=TrainerConfig(total_steps=1_000_000, eval_every=20_480),
    )  # fmt: skip


def _memory_recurrent_ppo() -> TrainConfig:
    # Remember a cue for 4 steps: the LSTM policy solves it (every eval episode right) in ~4k-8k steps; feed-forward
    # PPO with the same settings stays at chance (tests/test_recurrent.py).
    return TrainConfig(
        recipe="memory-recurrent-ppo",
        algo=RecurrentPPOConfig(
            lr=3e-3, gamma=0.99, gae_lambda=0.95, epochs=4, ent_coef=0.01, lstm=32, seq_len=8, minibatch_size=128
        ),
        env=EnvConfig(id="pickaxe/RepeatFirst-v0", num_envs=16, kwargs={"delay": 4}),
        model=ModelConfig(hidden=(32,), activation="tanh"),
        collector=CollectorConfig(steps=256),
        trainer=TrainerConfig(total_steps=30_000, eval_every=2_048, eval_episodes=20, target_return=0.99),
    )


CLASSIC_RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "cartpole-ppo",
            "PPO on CartPole-v1, discrete actions; stops when solved (eval >= 475), in 6k-30k steps (median 6k)",
            _cartpole_ppo,
        ),
        Recipe(
            "cartpole-dqn",
            "Double DQN on CartPole-v1 with a target network and epsilon decay; stops when solved (eval >= 475)",
            _cartpole_dqn,
        ),
        Recipe(
            "cartpole-rainbow",
            "Rainbow DQN (n-step, prioritized replay, dueling, C51) on CartPole-v1; stops when solved (eval >= 475)",
            _cartpole_rainbow,
        ),
        Recipe("pendulum-ppo", "PPO with Gaussian actions on Pendulum-v1 (continuous control)", _pendulum_ppo),
        Recipe(
            "pendulum-sac",
            "SAC (twin critics, automatic temperature) on Pendulum-v1; stops when solved (eval >= -250)",
            _pendulum_sac,
        ),
        Recipe(
            "pendulum-td3",
            "TD3 (twin critics, delayed actor, target smoothing) on Pendulum-v1; stops when solved (eval >= -250)",
            _pendulum_td3,
        ),
        Recipe(
            "pendulum-ddpg",
            "DDPG (one critic, no delay, no target smoothing) on Pendulum-v1; stops when solved (eval >= -250)",
            _pendulum_ddpg,
        ),
        Recipe(
            "halfcheetah-sac",
            "SAC with the paper's MuJoCo settings on HalfCheetah-v5 (needs mujoco); a short CPU budget (100k steps)",
            _halfcheetah_sac,
        ),
        Recipe(
            "pong-dqn",
            "Double DQN with the Nature CNN on Atari Pong (standard wrappers); a short CPU budget (100k steps)",
            _pong_dqn,
        ),
        Recipe(
            "breakout-ppo",
            "PPO with CleanRL's Atari settings on Breakout (Nature CNN, standard wrappers); a short CPU budget",
            _breakout_ppo,
        ),
        Recipe(
            "cartpole-a2c",
            "A2C on CartPole-v1 (one Adam step per 128-step rollout); stops when solved (eval >= 475)",
            _cartpole_a2c,
        ),
        Recipe(
            "hopper-ppo",
            "PPO with CleanRL's MuJoCo settings and observation/reward normalisation on Hopper-v5 (needs mujoco)",
            _hopper_ppo,
        ),
        Recipe(
            "memory-recurrent-ppo",
            "Recurrent (LSTM) PPO on pickaxe/RepeatFirst-v0, a task that needs memory; stops when every eval is right",
            _memory_recurrent_ppo,
        ),
    )
}

from pickaxe.recipes.more_classic import MORE_CLASSIC_RECIPES  # noqa: E402 - REINFORCE, NPG, TRPO, REDQ, IQN, FQF, BDQ

CLASSIC_RECIPES.update(MORE_CLASSIC_RECIPES)
