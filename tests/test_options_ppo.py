"""Every PPOConfig field takes effect: each test fails when its option is ignored or inverted.

Loss tests use a tiny actor-critic with zeroed weights (uniform policy over 2 actions, V = critic bias), so
each number is computable by hand. Update tests check the first Adam step exactly: for a fresh Adam,
``p1 = p0 - lr * g / (|g| + eps)`` with ``g`` the clipped gradient (left in ``p.grad`` by the step).
"""

import math

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict

from pickaxe.algos.configs import PPOConfig
from pickaxe.algos.core import explained_variance
from pickaxe.algos.ppo import PPO, compute_targets, ppo_loss
from pickaxe.errors import NonFiniteError
from pickaxe.models.actor_critic import ActorCritic

LOG_HALF = math.log(0.5)


def _zero_policy(value: float = 1.0) -> ActorCritic:
    """Uniform over 2 actions everywhere (logprob log 0.5, entropy log 2) and V(s) = ``value``."""
    policy = ActorCritic(1, gym.spaces.Discrete(2), hidden=(2,))
    with torch.no_grad():
        for p in policy.parameters():
            p.zero_()
        policy.critic[-1].bias.fill_(value)
    return policy


def _minibatch(ratio: float = 1.0) -> TensorDict:
    """4 samples with advantages 1, 2, 3, 6 (mean 3), old values 0, returns 3; ``ratio`` = new/old prob."""
    n = 4
    return TensorDict(
        {
            "obs": torch.zeros(n, 1),
            "action": torch.tensor([0, 1, 0, 1]),
            "logprob": torch.full((n,), LOG_HALF - math.log(ratio)),
            "value": torch.zeros(n),
            "advantage": torch.tensor([1.0, 2.0, 3.0, 6.0]),
            "return": torch.full((n,), 3.0),
        },
        batch_size=[n],
    )


def _loss(cfg: PPOConfig, clip: float = 0.2, ratio: float = 1.0) -> tuple[float, dict[str, float]]:
    loss, stats = ppo_loss(_zero_policy(), _minibatch(ratio), cfg, clip)
    return float(loss.detach()), {k: float(v) for k, v in stats.items()}


def test_normalize_advantage_takes_effect() -> None:
    # ratio 1: the policy loss is -mean(A); normalised advantages have mean 0.
    _, raw = _loss(PPOConfig(normalize_advantage=False))
    _, norm = _loss(PPOConfig(normalize_advantage=True))
    assert raw["loss/policy"] == pytest.approx(-3.0)
    assert norm["loss/policy"] == pytest.approx(0.0, abs=1e-6)


def test_value_clip_reaches_the_value_loss() -> None:
    # V = 1, old V = 0, return 3: unclipped 0.5 * (1 - 3)^2 = 2; clipped V = 0.5 -> 0.5 * 2.5^2 = 3.125.
    _, plain = _loss(PPOConfig(value_clip=None))
    _, clipped = _loss(PPOConfig(value_clip=0.5))
    assert plain["loss/value"] == pytest.approx(2.0)
    assert clipped["loss/value"] == pytest.approx(3.125)


def test_vf_coef_and_ent_coef_weigh_the_total_loss() -> None:
    # loss = policy + vf_coef * value - ent_coef * entropy = -3 + 0.25 * 2 - 0.1 * log 2
    loss, stats = _loss(PPOConfig(normalize_advantage=False, vf_coef=0.25, ent_coef=0.1))
    assert stats["loss/entropy"] == pytest.approx(math.log(2))
    assert loss == pytest.approx(-3.0 + 0.5 - 0.1 * math.log(2))
    loss2, _ = _loss(PPOConfig(normalize_advantage=False, vf_coef=2.0, ent_coef=0.0))
    assert loss2 == pytest.approx(-3.0 + 4.0)


def test_clip_argument_bounds_the_ratio() -> None:
    # ratio 1.5 > 1 + clip with positive advantages: loss = -(1 + clip) * mean(A), every sample clipped.
    _, stats = _loss(PPOConfig(normalize_advantage=False), clip=0.1, ratio=1.5)
    assert stats["loss/policy"] == pytest.approx(-1.1 * 3.0)
    assert stats["ppo/clip_fraction"] == 1.0
    _, wide = _loss(PPOConfig(normalize_advantage=False), clip=0.6, ratio=1.5)
    assert wide["loss/policy"] == pytest.approx(-1.5 * 3.0) and wide["ppo/clip_fraction"] == 0.0


# ------------------------------------------------------------------------------------------ targets


def test_compute_targets_use_gamma_and_gae_lambda() -> None:
    # One env, 3 steps, stored V(s_t) = 0.5, V(next_obs) = 1 (critic bias), no episode end.
    # delta_t = r_t + 0.5 * 1 - 0.5 = r_t; A_2 = 3, A_1 = 2 + 0.5*0.8*3 = 3.2, A_0 = 1 + 0.4*3.2 = 2.28.
    algo = PPO(_zero_policy(1.0), PPOConfig(gamma=0.5, gae_lambda=0.8))
    T = 3
    batch = TensorDict(
        {
            "reward": torch.tensor([[1.0], [2.0], [3.0]]),
            "value": torch.full((T, 1), 0.5),
            "next_obs": torch.zeros(T, 1, 1),
            "terminated": torch.zeros(T, 1, dtype=torch.bool),
            "truncated": torch.zeros(T, 1, dtype=torch.bool),
        },
        batch_size=[T, 1],
    )
    data = compute_targets(algo.policy, algo.rollout, batch)
    torch.testing.assert_close(data["advantage"], torch.tensor([2.28, 3.2, 3.0]))
    torch.testing.assert_close(data["return"], torch.tensor([2.78, 3.7, 3.5]))


# ------------------------------------------------------------------------------------------ update


def _rollout(policy: ActorCritic, T: int = 8, N: int = 4, seed: int = 0) -> TensorDict:
    """A ``[T, N]`` rollout of random 3-d observations with the policy's own actions, logprobs and values."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T, N, 3, generator=g)
    torch.manual_seed(seed)
    with torch.no_grad():
        action, extras = policy.act(obs.flatten(0, 1))
    return TensorDict(
        {
            "obs": obs,
            "action": action.view(T, N),
            "logprob": extras["logprob"].view(T, N),
            "value": extras["value"].view(T, N),
            "reward": torch.randn(T, N, generator=g),
            "terminated": torch.zeros(T, N, dtype=torch.bool),
            "truncated": torch.zeros(T, N, dtype=torch.bool),
            "next_obs": torch.randn(T, N, 3, generator=g),
        },
        batch_size=[T, N],
    )


def _algo(**overrides) -> PPO:
    torch.manual_seed(0)
    return PPO(ActorCritic(3, gym.spaces.Discrete(2), hidden=(8,)), PPOConfig(**overrides))


def _params(algo: PPO) -> list[torch.Tensor]:
    return [p.detach().clone() for p in algo.policy.parameters()]


def _grad_norm(algo: PPO) -> float:
    return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in algo.policy.parameters()])))


@pytest.mark.parametrize("schedule", ["constant", "linear"])
def test_first_step_follows_lr_lr_schedule_and_adam_eps(schedule: str) -> None:
    # One epoch, one minibatch = one Adam step: p1 = p0 - lr_now * g / (|g| + adam_eps).
    algo = _algo(lr=0.01, lr_schedule=schedule, adam_eps=0.05, epochs=1, minibatch_size=32, max_grad_norm=1e6)
    algo.set_progress(25, 100)
    before = _params(algo)
    metrics = algo.update(_rollout(algo.policy))
    lr_now = 0.0075 if schedule == "linear" else 0.01
    assert metrics["ppo/lr"] == pytest.approx(lr_now)
    assert metrics["ppo/gradient_steps"] == 1
    for p0, p in zip(before, algo.policy.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), p0 - lr_now * p.grad / (p.grad.abs() + 0.05))


def test_max_grad_norm_clips_the_applied_gradient() -> None:
    algo = _algo(max_grad_norm=1e-3, epochs=1, minibatch_size=32)
    metrics = algo.update(_rollout(algo.policy))
    assert metrics["grad_norm"] > 0.01  # the norm before clipping
    assert _grad_norm(algo) == pytest.approx(1e-3, rel=1e-3)


@pytest.mark.parametrize("schedule", ["constant", "linear"])
def test_clip_schedule_reaches_the_loss(schedule: str) -> None:
    # At the end of a linear schedule the clip range is 0: every step after the first clips some samples.
    # A constant 0.2 with a small learning rate never leaves [0.8, 1.2].
    algo = _algo(lr=1e-3, clip=0.2, clip_schedule=schedule, epochs=2, minibatch_size=8)
    algo.set_progress(100, 100)
    metrics = algo.update(_rollout(algo.policy))
    if schedule == "linear":
        assert metrics["ppo/clip"] == 0.0 and metrics["ppo/clip_fraction"] > 0.2
    else:
        assert metrics["ppo/clip"] == 0.2 and metrics["ppo/clip_fraction"] == 0.0


def test_epochs_and_minibatch_size_set_the_number_of_steps() -> None:
    # 32 samples in minibatches of 10: 4 per epoch (the last one short), 3 epochs.
    algo = _algo(epochs=3, minibatch_size=10)
    before = _params(algo)
    metrics = algo.update(_rollout(algo.policy))
    assert metrics["ppo/epochs"] == 3 and metrics["ppo/gradient_steps"] == 12
    assert algo.optimizer.state[next(algo.policy.parameters())]["step"] == 12
    assert any(not torch.equal(a, b) for a, b in zip(before, algo.policy.parameters(), strict=True))


@pytest.mark.parametrize(
    ("target_kl", "minibatch_size", "epochs_run"), [(None, 8, 4), (1e6, 8, 4), (1e-12, 8, 1), (1e-12, 32, 2)]
)
def test_target_kl_stops_the_epochs_early(target_kl: float | None, minibatch_size: int, epochs_run: int) -> None:
    # The check runs after each epoch on the epoch's last minibatch's approx KL, measured before that
    # minibatch's step: > 0 once the policy moved. With one minibatch per epoch the first epoch's KL is 0
    # (nothing moved yet), so the stop comes after the second.
    algo = _algo(lr=1e-2, epochs=4, minibatch_size=minibatch_size, target_kl=target_kl)
    metrics = algo.update(_rollout(algo.policy))
    assert metrics["ppo/epochs"] == epochs_run
    assert metrics["ppo/gradient_steps"] == (32 // minibatch_size) * epochs_run


def test_schedules_start_at_full_value_and_end_at_zero() -> None:
    fresh = _algo(lr=0.01, lr_schedule="linear", clip_schedule="linear", epochs=1, minibatch_size=32)
    metrics = fresh.update(_rollout(fresh.policy))  # no set_progress yet: progress 0
    assert metrics["ppo/lr"] == 0.01 and metrics["ppo/clip"] == 0.2
    done = _algo(lr=0.01, lr_schedule="linear", epochs=1, minibatch_size=32)
    done.set_progress(1, 1)
    assert done.update(_rollout(done.policy))["ppo/lr"] == 0.0


def test_update_reports_explained_variance_and_names_a_nonfinite_loss() -> None:
    algo = _algo(epochs=1, minibatch_size=32)
    batch = _rollout(algo.policy)
    metrics = algo.update(batch)
    data = algo.rollout.data
    assert metrics["ppo/explained_variance"] == pytest.approx(explained_variance(data["value"], data["return"]))
    bad = _rollout(algo.policy)
    bad["value"][:] = float("nan")
    with pytest.raises(NonFiniteError, match="ppo loss"):
        algo.update(bad)


@pytest.mark.parametrize("shared", [False, True])
def test_model_shared_makes_the_value_loss_train_the_actors_torso(shared: bool) -> None:
    from pickaxe.algos.ppo import build_ppo
    from pickaxe.envs import make
    from pickaxe.train.config import ModelConfig

    envs = make("CartPole-v1", 2, seed=0)
    algo = build_ppo(PPOConfig(), envs, ModelConfig(hidden=(8, 8), shared=shared), torch.device("cpu"), 0)
    policy = algo.policy
    obs = torch.randn(16, 4)
    policy.value(obs).pow(2).mean().backward()  # a value loss alone
    actor_side = [p for n, p in policy.named_parameters() if not n.startswith("critic")]
    reached = [p.grad is not None and bool(p.grad.abs().sum() > 0) for p in actor_side]
    # shared: one torso under two linear heads, so the critic's gradient reaches what the actor reads
    assert any(reached) is shared
    assert len(policy.actor) == (1 if shared else 5)
