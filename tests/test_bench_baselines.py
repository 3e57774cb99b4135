"""The Stable-Baselines3 baselines of benchmarks/ run exactly RL Baselines3 Zoo's settings, budget included.

SB3's schedules are fractions of ``learn(total_timesteps=...)``: training DQN for 150k steps instead of the zoo's
50k stretches its epsilon decay threefold, a different (slower) algorithm than the one the zoo tuned. These tests
build each baseline as its benchmark does, with ``learn`` replaced by a recorder (no training), and compare what
reached SB3 with the zoo's entries (hyperparams/dqn.yml, ppo.yml and sac.yml, quoted in benchmarks/).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from bench_modules import BENCH, load_benchmark


@pytest.fixture
def learned(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every SB3 ``learn`` call records its model and ``total_timesteps`` here instead of training."""
    sb3 = pytest.importorskip("stable_baselines3")
    calls: dict[str, Any] = {}

    def record(self: Any, total_timesteps: int, callback: Any = None, **kwargs: Any) -> Any:
        calls[type(self).__name__] = (self, total_timesteps)
        return self

    for cls in (sb3.DQN, sb3.PPO, sb3.SAC):
        monkeypatch.setattr(cls, "learn", record)
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.delitem(sys.modules, "baselines", raising=False)
    return calls


def test_dqn_baseline_trains_the_zoo_budget_so_epsilon_decays_over_its_first_8000_steps(learned: dict) -> None:
    cartpole = load_benchmark("cartpole")
    row = cartpole.run_sb3("dqn", 0)
    model, total = learned["DQN"]
    assert total == 50_000  # dqn.yml CartPole-v1: n_timesteps 5e4 (not pickaxe's 150k budget)
    assert row["budget"] == 50_000 and row["solved_step"] is None  # nothing trained, nothing solved
    # epsilon 1.0 -> 0.04 over exploration_fraction 0.16 of the budget: at its final value by env step 8,000
    assert model.exploration_schedule(1 - 8_000 / total) == pytest.approx(0.04)
    assert model.exploration_schedule(1 - 4_000 / total) == pytest.approx(0.52)
    assert model.learning_rate == 2.3e-3 and model.batch_size == 64 and model.buffer_size == 100_000
    assert model.learning_starts == 1000 and model.gamma == 0.99 and model.target_update_interval == 10
    assert model.train_freq.frequency == 256 and model.gradient_steps == 128
    assert model.exploration_fraction == 0.16 and model.exploration_final_eps == 0.04
    assert model.exploration_initial_eps == 1.0  # SB3's default; the zoo does not set it
    assert model.policy_kwargs["net_arch"] == [256, 256] and model.n_envs == 1


def test_ppo_baseline_trains_the_zoo_budget_with_linear_schedules_over_it(learned: dict) -> None:
    cartpole = load_benchmark("cartpole")
    cartpole.run_sb3("ppo", 0)
    model, total = learned["PPO"]
    assert total == 100_000  # ppo.yml CartPole-v1: n_timesteps 1e5
    assert model.n_envs == 8 and model.n_steps == 32 and model.batch_size == 256 and model.n_epochs == 20
    assert model.gae_lambda == 0.8 and model.gamma == 0.98 and model.ent_coef == 0.0
    # lin_0.001 and lin_0.2: the start value times the fraction of the budget remaining
    assert model.learning_rate(1.0) == pytest.approx(1e-3) and model.learning_rate(0.25) == pytest.approx(2.5e-4)
    assert model.clip_range(1.0) == pytest.approx(0.2) and model.clip_range(0.5) == pytest.approx(0.1)


def test_sac_baseline_trains_the_zoo_budget_with_sb3_defaults(learned: dict) -> None:
    pendulum = load_benchmark("pendulum")
    pendulum.run_sb3_sac(0)
    model, total = learned["SAC"]
    assert total == 20_000  # sac.yml Pendulum-v1: n_timesteps 20000, learning_rate 1e-3, the rest SB3's defaults
    assert model.learning_rate == 1e-3 and model.buffer_size == 1_000_000 and model.learning_starts == 100
    assert model.batch_size == 256 and model.tau == 0.005 and model.gamma == 0.99 and model.ent_coef == "auto"
    assert model.train_freq.frequency == 1 and model.gradient_steps == 1
