"""The non-finite guard: a NaN never reaches the weights; the run rolls back or stops as configured."""

import json
from pathlib import Path

import pytest
import torch

import pickaxe.algos.ppo as ppo_module
from pickaxe.recipes import get_recipe
from pickaxe.runs.run import Run
from pickaxe.train.build import build_trainer
from pickaxe.train.trainer import TrainingStopped


def _inject_nan(monkeypatch, at_call: int) -> list[int]:
    """Make ppo_loss return a NaN loss on its ``at_call``-th call (once)."""
    calls = [0]
    real = ppo_module.ppo_loss

    def loss_with_nan(*args, **kwargs):
        calls[0] += 1
        loss, stats = real(*args, **kwargs)
        return (loss * float("nan") if calls[0] == at_call else loss), stats

    monkeypatch.setattr(ppo_module, "ppo_loss", loss_with_nan)
    return calls


def _trainer(tmp_path: Path, on_nonfinite: str):
    cfg = get_recipe("cartpole-ppo")
    cfg.trainer.total_steps = 4096
    cfg.trainer.save_every = 1024
    cfg.trainer.eval_every = 2048
    cfg.trainer.on_nonfinite = on_nonfinite
    cfg.algo.epochs, cfg.algo.minibatch_size = 10, 256  # one minibatch per epoch: 10 loss calls per update
    run = Run(tmp_path / "run", config=cfg.to_dict(), seed=cfg.seed)
    return build_trainer(cfg, run=run), run


def test_nan_loss_rolls_back_to_last_checkpoint(tmp_path: Path, monkeypatch) -> None:
    # 10 loss calls per update: call 75 is in the 8th update (after env step 1792), past the checkpoint at 1024
    _inject_nan(monkeypatch, at_call=75)
    trainer, run = _trainer(tmp_path, "rollback")
    result = trainer.fit()
    run.close()
    assert result.steps == 4096
    events = [json.loads(line) for line in (run.path / "events.jsonl").read_text().splitlines()]
    rollback = next(e for e in events if "rolled back" in e["message"])
    assert "non-finite ppo loss" in rollback["message"] and rollback["step"] == 1024
    assert all(torch.isfinite(p).all() for p in trainer.algo.policy.parameters())
    steps = [json.loads(line)["step"] for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 4096  # nothing duplicated after the rollback


def test_nan_loss_stops_with_a_clear_message_and_untouched_weights(tmp_path: Path, monkeypatch) -> None:
    _inject_nan(monkeypatch, at_call=75)
    trainer, run = _trainer(tmp_path, "stop")
    before: list[torch.Tensor] = []

    real_update = trainer.algo.update

    def update(batch):
        before[:] = [p.detach().clone() for p in trainer.algo.policy.parameters()]
        return real_update(batch)

    trainer.algo.update = update
    with pytest.raises(
        TrainingStopped, match=r"non-finite ppo loss .* after env step 1792; that optimizer step was not applied"
    ):
        trainer.fit()
    run.close()
    after = list(trainer.algo.policy.parameters())
    # the update with the NaN stopped at its 5th minibatch: earlier minibatches applied, no NaN anywhere
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(b, a) for b, a in zip(before, after, strict=True))


def test_nan_parameter_is_named(tmp_path: Path) -> None:
    trainer, run = _trainer(tmp_path, "stop")
    with torch.no_grad():
        trainer.algo.policy.inner.critic[0].weight[0, 0] = float("inf")  # the recipe normalises observations
    with pytest.raises(TrainingStopped, match=r"parameter inner\.critic\.0\.weight"):
        trainer.fit()
    run.close()


def test_nan_loss_message_says_the_step_was_not_applied_and_advises_on_lr(tmp_path: Path, monkeypatch) -> None:
    _inject_nan(monkeypatch, at_call=75)
    trainer, run = _trainer(tmp_path, "stop")
    with pytest.raises(TrainingStopped) as exc:
        trainer.fit()
    run.close()
    message = str(exc.value)
    assert "that optimizer step was not applied" in message and "lower algo.lr" in message.lower()
    assert f"`pickaxe resume {run.path}`" in message and "\n" not in message


def test_nan_reward_is_caught_before_the_update_without_lr_advice(tmp_path: Path) -> None:
    trainer, run = _trainer(tmp_path, "stop")
    real_collect = trainer.collector.collect
    calls = [0]

    def collect():
        batch = real_collect()
        calls[0] += 1
        if calls[0] == 6:
            batch["reward"][0, 0] = float("nan")  # an env that returned a NaN reward
        return batch

    trainer.collector.collect = collect
    last: list[torch.Tensor] = []
    real_update = trainer.algo.update

    def update(batch):
        metrics = real_update(batch)
        last[:] = [p.detach().clone() for p in trainer.algo.policy.parameters()]  # weights after the last update
        return metrics

    trainer.algo.update = update
    with pytest.raises(TrainingStopped) as exc:
        trainer.fit()
    run.close()
    message = str(exc.value)
    assert "non-finite reward in the collected batch after env step 1280; no update was made from it" in message
    assert "learning rate" not in message and "algo.lr" not in message and "not applied" not in message
    assert "rewards and observations" in message
    after = list(trainer.algo.policy.parameters())
    assert all(torch.equal(b, a) for b, a in zip(last, after, strict=True))  # nothing learned from the NaN batch


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))


def test_first_nonfinite_names_the_parameter_or_its_gradient() -> None:
    from pickaxe.algos.base import first_nonfinite

    net = _net()
    assert first_nonfinite(net.named_parameters()) is None
    net(torch.ones(1, 2)).sum().backward()
    assert first_nonfinite(net.named_parameters(), grads=True) is None
    with torch.no_grad():
        net[1].bias[0] = float("inf")
    net[0].weight.grad[0, 1] = float("nan")
    assert first_nonfinite(net.named_parameters()) == "parameter 1.bias"
    assert first_nonfinite(net.named_parameters(), grads=True) == "gradient of 0.weight"


def test_guarded_step_refuses_a_bad_loss_or_gradient_before_stepping() -> None:
    from pickaxe.algos.base import guarded_step
    from pickaxe.errors import NonFiniteError

    net = _net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(NonFiniteError, match=r"^td loss = nan$"):
        guarded_step(net(torch.ones(1, 2)).sum() * float("nan"), net, optimizer, 1.0, "td loss")
    net[0].weight.register_hook(lambda g: g * float("inf"))  # a finite loss whose gradient overflows
    with pytest.raises(NonFiniteError, match=r"^gradient of 0\.weight$"):
        guarded_step(net(torch.ones(1, 2)).sum(), net, optimizer, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))  # nothing was applied
    net = _net()
    norm = guarded_step(net(torch.ones(1, 2)).sum() * 100, net, torch.optim.SGD(net.parameters(), lr=0.1), 1.0)
    assert norm > 1.0  # the norm before clipping is what it returns


def test_guarded_step_names_the_gradient_that_went_bad_not_the_first_one() -> None:
    from pickaxe.algos.base import guarded_step
    from pickaxe.errors import NonFiniteError

    net = _net()
    net[1].weight.register_hook(lambda g: g * float("nan"))  # only the second layer's gradient is bad
    # clipping by a NaN norm before the check used to turn every gradient NaN and blame 0.weight
    with pytest.raises(NonFiniteError, match=r"^gradient of 1\.weight$"):
        guarded_step(net(torch.ones(1, 2)).sum(), net, torch.optim.SGD(net.parameters(), lr=0.1), 1.0)
