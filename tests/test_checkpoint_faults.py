"""Damaged checkpoints never stop a resume while an older good one exists, and a run SIGKILLed at any write of the
checkpoint protocol resumes from a good checkpoint and ends exactly like a run that was never stopped."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pickaxe.errors import CheckpointError, PickaxeError
from pickaxe.faults import CHECKPOINT_POINTS
from pickaxe.recipes import get_recipe
from pickaxe.runs.checkpoint import CheckpointManager
from pickaxe.runs.run import Run, read_metrics
from pickaxe.train.build import build_trainer, resume, train

GOOD = "step-000000000512"


def _config(total: int = 1024):
    cfg = get_recipe("cartpole-ppo")
    cfg.trainer.total_steps, cfg.trainer.eval_every, cfg.trainer.save_every = total, 512, 256
    cfg.trainer.keep_last, cfg.trainer.stop_at_target = 10, False
    return cfg


def _run_with_checkpoints(tmp_path: Path) -> tuple[Path, dict]:
    """A run with checkpoints at 256 and 512 (and its state at 512); it stopped there."""
    cfg = _config(512)
    train(cfg, run_dir=tmp_path / "r")
    state, _ = CheckpointManager(tmp_path / "r").load(GOOD)
    return tmp_path / "r", state


def _plant(run_dir: Path, state: dict, meta: dict | None = None) -> Path:
    """A newer checkpoint whose files verify (digests match) but whose content is what the test says."""
    return CheckpointManager(run_dir, keep_last=10).save(768, state, meta=meta or {"env_state": "exact"})


def _resume_trainer(run_dir: Path):
    run = Run.open(run_dir, tensorboard=False)
    return build_trainer(_config(), run=run), run


def _foreign_shapes(state: dict) -> dict:
    policy = state["algo"]["policy"]
    key = next(iter(policy))
    policy[key] = torch.zeros(3, 3)  # another network's shape
    return state


def _another_algorithm(state: dict) -> dict:
    state["algo"] = {"q": state["algo"]["policy"], "q_target": {}, "optimizer": {}, "buffer": {}}
    return state


@pytest.mark.parametrize("damage", [_foreign_shapes, _another_algorithm])
def test_checkpoint_whose_state_does_not_load_is_skipped(tmp_path: Path, damage, capfd) -> None:
    run_dir, state = _run_with_checkpoints(tmp_path)
    bad = _plant(run_dir, damage(state))
    capfd.readouterr()
    trainer, run = _resume_trainer(run_dir)
    info = trainer.resume()
    run.close()
    assert info.path.name == GOOD and trainer.step == 512
    err = capfd.readouterr().err
    assert err.count(f"skipping damaged checkpoint {bad.name}") == 1  # printed once
    events = (run_dir / "events.jsonl").read_text()
    assert events.count(f"skipping damaged checkpoint {bad.name}") == 1  # and recorded


def test_checkpoint_of_another_algorithm_is_named(tmp_path: Path, capfd) -> None:
    run_dir, state = _run_with_checkpoints(tmp_path)
    _plant(run_dir, state, meta={"env_state": "exact", "algo": "DQN"})
    trainer, run = _resume_trainer(run_dir)
    assert trainer.resume().path.name == GOOD
    run.close()
    assert "holds the state of a DQN run, this run trains PPO" in capfd.readouterr().err


def test_absurdly_nested_json_is_damage_not_a_crash(tmp_path: Path) -> None:
    run_dir, state = _run_with_checkpoints(tmp_path)
    bad = _plant(run_dir, state)
    meta = ("[" * 200_000 + "]" * 200_000).encode()  # valid JSON, nested beyond any recursion limit
    (bad / "meta.json").write_bytes(meta)
    manifest = json.loads((bad / "MANIFEST.json").read_text())
    manifest["files"]["meta.json"] = {"size": len(meta), "sha256": hashlib.sha256(meta).hexdigest()}
    (bad / "MANIFEST.json").write_text(json.dumps(manifest))
    assert [i.step for i in CheckpointManager(run_dir).list()] == [256, 512, 768]
    trainer, run = _resume_trainer(run_dir)
    assert trainer.resume().path.name == GOOD
    run.close()


def test_every_checkpoint_damaged_is_one_user_error_line(tmp_path: Path) -> None:
    run_dir, _ = _run_with_checkpoints(tmp_path)
    for p in (run_dir / "checkpoints").glob("step-*"):
        (p / "tensors.safetensors").write_bytes(b"garbage")
    trainer, run = _resume_trainer(run_dir)
    with pytest.raises(CheckpointError) as exc:
        trainer.resume()
    run.close()
    assert isinstance(exc.value, PickaxeError) and "\n" not in str(exc.value)
    assert "no good checkpoint" in str(exc.value)


# ----------------------------------------------------------------------------- SIGKILL at every write
ARGS = [
    "--trainer.total-steps", "2048", "--save-every", "512", "--trainer.eval-every", "1024",
    "--trainer.keep-last", "1", "--trainer.keep-best", "0", "--trainer.stop-at-target", "False", "--no-progress",
]  # fmt: skip
"""Checkpoints at 512, 1024, 1536; keep_last 1 makes every save after the first delete the previous one."""


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    cfg = get_recipe("cartpole-ppo")
    cfg.trainer.total_steps, cfg.trainer.save_every, cfg.trainer.eval_every = 2048, 512, 1024
    cfg.trainer.keep_last, cfg.trainer.keep_best, cfg.trainer.stop_at_target = 1, 0, False
    run_dir = tmp_path_factory.mktemp("reference") / "r"
    train(cfg, run_dir=run_dir)
    return read_metrics(run_dir, deterministic=True)


def _killed_at(point: str, run_dir: Path) -> None:
    # inside the second save (step 1024); retention deletes for the first time there
    env = {**os.environ, "PICKAXE_FAULT": f"{point}:{1 if point == 'checkpoint-retention' else 2}"}
    proc = subprocess.run(
        [sys.executable, "-m", "pickaxe.cli", "train", "cartpole-ppo", *ARGS, "--run-dir", str(run_dir)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def _fault_params() -> list:
    quick = {"latest-tmp", "checkpoint-retention"}
    return [p if p in quick else pytest.param(p, marks=pytest.mark.slow) for p in CHECKPOINT_POINTS]


@pytest.mark.parametrize("point", _fault_params())
def test_killed_at_each_checkpoint_write_resumes_exactly(tmp_path: Path, point: str, reference: list[dict]) -> None:
    run_dir = tmp_path / "r"
    _killed_at(point, run_dir)
    ckpts = run_dir / "checkpoints"
    latest = (ckpts / "latest").read_text()
    complete = sorted(p.name for p in ckpts.glob("step-*"))
    if point in CHECKPOINT_POINTS[: CHECKPOINT_POINTS.index("latest-tmp") + 1]:
        # until the new pointer is renamed over the old one, `latest` names the previous checkpoint, whole
        assert latest == "step-000000000512\n", latest
    else:
        assert latest == "step-000000001024\n", latest
    assert complete and all(p.startswith("step-") for p in complete)
    resume(run_dir)
    assert read_metrics(run_dir, deterministic=True) == reference
