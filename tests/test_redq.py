"""REDQ: its target is the min over the drawn subset of target critics, the actor's loss the ensemble's mean, the
subsets are distinct indices from a checkpointed generator, the actor steps once per ``actor_delay`` critic steps,
exact resume, Pendulum solved (slow), and bad values refused in one line."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from pickaxe.algos.extra_configs import REDQConfig
from pickaxe.algos.redq import REDQ, build_redq, random_subset, redq_actor_loss, redq_target
from pickaxe.cli import main
from pickaxe.errors import ConfigError
from pickaxe.recipes import get_recipe
from pickaxe.train.build import build_trainer
from pickaxe.train.config import ModelConfig


def test_target_is_the_min_over_the_chosen_subset_only() -> None:
    next_q = torch.tensor([[5.0, 1.0], [3.0, 4.0], [-9.0, -9.0], [4.0, 2.0]])  # 4 critics, 2 transitions
    reward = torch.tensor([1.0, 0.5])
    logp = torch.tensor([0.2, -0.4])
    terminated = torch.tensor([False, True])
    y = redq_target(reward, next_q, logp, terminated, 0.9, 0.5, torch.tensor([0, 3]))
    # critics 0 and 3: min(5, 4) = 4 and min(1, 2) = 1 (critic 2's -9 is not drawn); the second one terminated
    torch.testing.assert_close(y, torch.tensor([1.0 + 0.9 * (4.0 - 0.5 * 0.2), 0.5]))
    y_all = redq_target(reward, next_q, logp, terminated, 0.9, 0.5, torch.arange(4))  # M = N: the full min
    torch.testing.assert_close(y_all[0], torch.tensor(1.0 + 0.9 * (-9.0 - 0.1)))


def test_actor_loss_is_on_the_ensemble_mean() -> None:
    q = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    loss = redq_actor_loss(torch.tensor([0.5, -0.5]), q, 0.2)
    assert loss.item() == pytest.approx(((0.1 - 2.0) + (-0.1 - 4.0)) / 2)


def test_subsets_are_distinct_indices_drawn_uniformly() -> None:
    g = torch.Generator().manual_seed(0)
    counts = np.zeros(10)
    for _ in range(2000):
        s = random_subset(10, 2, g)
        assert len(set(s.tolist())) == 2 and all(0 <= i < 10 for i in s.tolist())
        counts[s.numpy()] += 1
    assert counts.min() > 300 and counts.max() < 500  # 400 each expected


def _batch(n: int = 64, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "obs": torch.randn(n, 1, 3, generator=g),
            "action": torch.rand(n, 1, 1, generator=g) * 4 - 2,
            "reward": torch.randn(n, 1, generator=g),
            "terminated": torch.zeros(n, 1, dtype=torch.bool),
            "truncated": torch.zeros(n, 1, dtype=torch.bool),
            "next_obs": torch.randn(n, 1, 3, generator=g),
        },
        batch_size=[n, 1],
    )


def _algo(**kw) -> REDQ:
    torch.manual_seed(0)
    env = gym.make("Pendulum-v1")
    cfg = REDQConfig(batch_size=16, learning_starts=0, ensemble_size=5, subset_size=2, **kw)
    return build_redq(cfg, env, ModelConfig(hidden=(16,), activation="relu"), torch.device("cpu"), seed=3)


def test_actor_steps_once_per_actor_delay_critic_steps() -> None:
    algo = _algo(gradient_steps=3, actor_delay=4)
    assert algo.critic.n == 5
    actor = [p.detach().clone() for p in algo.actor.parameters()]
    metrics = algo.update(_batch())  # steps 0, 1, 2: the actor steps at 0 only
    assert metrics["redq/actor_steps"] == 1.0 and "loss/actor" in metrics
    moved = [p.detach().clone() for p in algo.actor.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(actor, moved, strict=True))
    critic = [p.detach().clone() for p in algo.critic.parameters()]
    metrics = algo.update(_batch(seed=1))  # steps 3, 4, 5: the actor steps at 4
    assert metrics["redq/actor_steps"] == 1.0
    metrics = algo.update(_batch(seed=2))  # steps 6, 7, 8: the actor steps at 8
    metrics = algo.update(_batch(seed=3))  # steps 9, 10, 11: none; the critics still learn
    assert metrics["redq/actor_steps"] == 0.0 and "loss/actor" not in metrics and "loss/critic" in metrics
    assert any(not torch.equal(a, b) for a, b in zip(critic, algo.critic.parameters(), strict=True))


def test_subset_generator_is_in_the_checkpoint_state() -> None:
    a, b = _algo(gradient_steps=2), _algo(gradient_steps=2)
    a.update(_batch())
    b.load_state_dict(a.state_dict())
    assert torch.equal(random_subset(10, 2, a.subset_generator), random_subset(10, 2, b.subset_generator))


def test_subset_larger_than_the_ensemble_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="subset-size 3"):
        REDQConfig(ensemble_size=3, subset_size=4)


def test_bad_value_on_the_command_line_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "pendulum-redq", "--algo.ensemble-size", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ensemble" in err and ">= 2" in err


def _cfg(steps: int, **trainer):
    cfg = get_recipe("pendulum-redq")
    cfg.env = replace(cfg.env, eval_envs=2)
    cfg.trainer = replace(cfg.trainer, total_steps=steps, eval_episodes=2, **trainer)
    return cfg


def test_redq_resume_is_exact(tmp_path: Path) -> None:
    from classic_runs import assert_classic_resume_is_exact

    cfg = _cfg(512, eval_every=256, target_return=None)
    cfg.algo = replace(cfg.algo, learning_starts=128, gradient_steps=4, actor_delay=3, ensemble_size=4)
    records = assert_classic_resume_is_exact(cfg, tmp_path, cut=256)
    assert any("loss/critic" in r for r in records)


@pytest.mark.slow
def test_pendulum_redq_recipe_solves_pendulum() -> None:
    # ~15-30 s on 2 busy cores: seeds 0 and 1 reach -250 by their second or third evaluation (2-3k env steps)
    cfg = get_recipe("pendulum-redq")
    cfg.trainer = replace(cfg.trainer, total_steps=6_000, save_at_eval=False, keep_policies=False)
    result = build_trainer(cfg).fit()
    assert result.solved_step is not None and result.eval_return >= -250, result.eval_return
