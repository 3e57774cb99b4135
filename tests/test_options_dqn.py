"""Every DQNConfig field takes effect: each test fails when its option is ignored or inverted.

Target and loss tests use one-layer Q-networks with hand-set weights (``Q(s) = W s + b``); update tests check
the first Adam step exactly (``p1 = p0 - lr * g / (|g| + 1e-8)``, ``g`` left in ``p.grad`` by the step).
"""

import pytest
import torch
from tensordict import TensorDict

from pickaxe.algos.configs import DQNConfig
from pickaxe.algos.dqn import DQN, dqn_loss, dqn_target
from pickaxe.errors import NonFiniteError
from pickaxe.models.q_network import QNetwork


def _linear_q(w: list[float], b: list[float] | None = None) -> QNetwork:
    q = QNetwork(1, 2, hidden=())
    with torch.no_grad():
        q.net[0].weight.copy_(torch.tensor(w).view(2, 1))
        q.net[0].bias.copy_(torch.tensor(b or [0.0, 0.0]))
    return q


# Online Q(s) = [s, 0], target Q(s) = [2s, 5s]. At s' = 1 the online net's argmax is 0, the target net's 1.
ONLINE, TARGET = _linear_q([1.0, 0.0]), _linear_q([2.0, 5.0])
MB = TensorDict(
    {
        "obs": torch.tensor([[1.0], [2.0]]),
        "action": torch.tensor([0, 0]),
        "reward": torch.tensor([4.0, 1.0]),
        "terminated": torch.tensor([False, True]),
        "next_obs": torch.ones(2, 1),
    },
    batch_size=[2],
)


@pytest.mark.parametrize(("double", "expected"), [(True, [4.0 + 0.5 * 2.0, 1.0]), (False, [4.0 + 0.5 * 5.0, 1.0])])
def test_double_dqn_takes_the_argmax_from_the_online_network(double: bool, expected: list[float]) -> None:
    # double: the online net picks action 0, the target net scores it 2; vanilla: max of the target net, 5.
    # The second sample terminated: its target is the reward alone.
    y = dqn_target(ONLINE, TARGET, MB, DQNConfig(double=double, gamma=0.5))
    torch.testing.assert_close(y, torch.tensor(expected))


def test_gamma_discounts_the_bootstrap() -> None:
    y = dqn_target(ONLINE, TARGET, MB, DQNConfig(double=True, gamma=0.9))
    torch.testing.assert_close(y, torch.tensor([4.0 + 0.9 * 2.0, 1.0]))


@pytest.mark.parametrize(("loss", "expected"), [("huber", (3.5 + 0.5) / 2), ("mse", (16.0 + 1.0) / 2)])
def test_loss_option_picks_huber_or_mse(loss: str, expected: float) -> None:
    # q = Q(s)[a] = [1, 2], y = [5, 1]: errors 4 and 1; Huber (delta 1) = |e| - 0.5 beyond 1, 0.5 e^2 within.
    value, stats = dqn_loss(ONLINE, TARGET, MB, DQNConfig(double=True, gamma=0.5, loss=loss))
    assert float(value.detach()) == pytest.approx(expected)
    assert float(stats["dqn/q_mean"]) == pytest.approx(1.5)


@pytest.mark.parametrize(("step", "epsilon"), [(0, 0.9), (250, 0.5), (500, 0.1), (900, 0.1)])
def test_epsilon_decays_over_eps_fraction_of_training(step: int, epsilon: float) -> None:
    algo = DQN(_linear_q([1.0, 0.0]), DQNConfig(eps_start=0.9, eps_end=0.1, eps_fraction=0.5))
    assert algo.policy.epsilon == 0.9  # before the first set_progress
    algo.set_progress(step, 1000)
    assert algo.policy.epsilon == pytest.approx(epsilon)


# ------------------------------------------------------------------------------------------ update


def _transitions(n: int = 16, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "obs": torch.randn(n, 3, generator=g),
            "action": torch.randint(2, (n,), generator=g),
            "reward": torch.randn(n, generator=g),
            "terminated": torch.rand(n, generator=g) < 0.2,
            "truncated": torch.zeros(n, dtype=torch.bool),
            "next_obs": torch.randn(n, 3, generator=g),
        },
        batch_size=[n],
    )


def _algo(**overrides) -> DQN:
    torch.manual_seed(0)
    cfg = {"learning_starts": 0, "batch_size": 8, "target_update_every": 1000, **overrides}
    return DQN(QNetwork(3, 2, hidden=(8,)), DQNConfig(**cfg), seed=0)


def _params(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _same(a: list[torch.Tensor], module: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, module.parameters(), strict=True))


def test_acting_policy_target_net_and_sampler_seed() -> None:
    algo = _algo()
    obs = torch.randn(5, 3)
    action, _ = algo.policy.act(obs, deterministic=True)
    assert torch.equal(action, algo.qnet(obs).argmax(-1))  # acts on the online network
    assert not any(p.requires_grad for p in algo.target.parameters())
    seeded = DQN(QNetwork(3, 2, hidden=(8,)), DQNConfig(), seed=7)
    assert seeded.buffer.generator.initial_seed() == 7


def test_update_metrics_name_epsilon_and_a_nonfinite_loss() -> None:
    algo = _algo(gradient_steps=1)
    algo.policy.epsilon = 0.3
    assert algo.update(_transitions())["dqn/epsilon"] == 0.3
    bad = _transitions()
    bad["reward"][:] = float("nan")
    nan_algo = _algo(gradient_steps=1, buffer_size=16)
    with pytest.raises(NonFiniteError, match="td loss"):
        nan_algo.update(bad)


def test_first_step_follows_lr() -> None:
    algo = _algo(lr=1e-4, gradient_steps=1, max_grad_norm=1e6)
    algo.config.lr = 0.02  # lr is read afresh each update (pickaxe set changes it on a running run)
    before = _params(algo.qnet)
    metrics = algo.update(_transitions())
    assert metrics["dqn/lr"] == 0.02
    for p0, p in zip(before, algo.qnet.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), p0 - 0.02 * p.grad / (p.grad.abs() + 1e-8))


def test_max_grad_norm_clips_the_applied_gradient() -> None:
    algo = _algo(gradient_steps=1, max_grad_norm=1e-3)
    algo.update(_transitions())
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in algo.qnet.parameters()]))
    assert float(norm) == pytest.approx(1e-3, rel=1e-3)


def test_gradient_steps_and_batch_size() -> None:
    algo = _algo(gradient_steps=5, batch_size=7)
    sizes: list[int] = []
    sample = algo.buffer.sample
    algo.buffer.sample = lambda n: sizes.append(n) or sample(n)  # type: ignore[method-assign]
    algo.update(_transitions())
    assert sizes == [7] * 5 and algo.num_updates == 5
    assert algo.optimizer.state[next(algo.qnet.parameters())]["step"] == 5


def test_buffer_size_bounds_the_replay_buffer() -> None:
    algo = _algo(buffer_size=10)
    algo.update(_transitions(16))
    assert len(algo.buffer) == 10 and algo.buffer.capacity == 10


def test_learning_starts_waits_for_enough_stored_steps() -> None:
    algo = _algo(learning_starts=32, gradient_steps=2)
    before = _params(algo.qnet)
    first = algo.update(_transitions(16, seed=0))  # 16 stored < 32: store only
    assert "loss/q" not in first and algo.num_updates == 0 and _same(before, algo.qnet)
    second = algo.update(_transitions(16, seed=1))  # 32 stored: learning starts
    assert "loss/q" in second and algo.num_updates == 2 and not _same(before, algo.qnet)


@pytest.mark.parametrize("every", [3, 4])
def test_target_update_every_counts_gradient_steps(every: int) -> None:
    algo = _algo(gradient_steps=3, target_update_every=every)
    initial = _params(algo.target)
    algo.update(_transitions())
    if every == 3:  # synced after the 3rd step: equal to the online net now
        assert _same(_params(algo.qnet), algo.target)
    else:
        assert _same(initial, algo.target)
        algo.update(_transitions(seed=1))  # synced at step 4 of 6
        assert not _same(initial, algo.target) and not _same(_params(algo.qnet), algo.target)


def test_polyak_update_moves_the_target_tau_of_the_way() -> None:
    algo = _algo(tau=0.25, target_update_every=1, gradient_steps=1)
    target0 = _params(algo.target)
    algo.update(_transitions())
    online = _params(algo.qnet)
    assert not _same(target0, algo.qnet)
    for t0, q, t in zip(target0, online, algo.target.parameters(), strict=True):
        torch.testing.assert_close(t.detach(), 0.75 * t0 + 0.25 * q)


def test_tau_one_copies_the_online_network() -> None:
    algo = _algo(tau=1.0, target_update_every=1, gradient_steps=1)
    initial = _params(algo.qnet)
    algo.update(_transitions())
    assert not _same(initial, algo.qnet) and _same(_params(algo.qnet), algo.target)
