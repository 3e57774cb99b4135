"""Sharded learners at the run level (``--dist.shard fsdp``, two learners over gloo on this CPU): a sharded run logs
the numbers of the one-learner run; its checkpoints are written by both learners (one shard file each, in the
manifest) and resume with any learner count (2 -> 1 -> 2 here); a SIGKILLed sharded run resumes to exactly the
numbers of an uninterrupted one; a damaged shard file is named and the previous checkpoint used; the engine in
rank 0 and engine workers generate from the weights gathered from the shards. Flags that cannot work are one
line before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from pickaxe.runs.tracking import read_metrics
from test_llm_training import _tiny_cfg

TESTS = Path(__file__).parent
TINY = [
    "arith-grpo", "--seed", "3", "--device", "cpu", "--model.hidden", "32", "--model.layers", "2", "--model.heads", "4",
    "--model.kv-heads", "2", "--model.intermediate", "64", "--warm-start.updates", "4", "--warm-start.batch-size", "16",
    "--collector.prompts", "4", "--collector.group-size", "4", "--eval.prompts", "12", "--eval.samples", "4",
    "--eval.pass-k", "2", "--algo.micro-batch-size", "3", "--data.reward", "reward_fns:length_score", "--no-progress",
    "--trainer.total-steps", "32", "--trainer.eval-every", "16",
]  # fmt: skip


def _cfg(learners: int, shard: str = "none") -> Any:
    cfg = _tiny_cfg(seed=3)
    cfg.model.layers = 2  # two decoder layers: two units of sharding
    cfg.dist.learners, cfg.dist.shard = learners, shard
    cfg.algo.micro_batch_size = 3  # 16 sequences in 6 micro-batches: 3 on each learner
    cfg.data.reward = "reward_fns:length_score"  # a signal from the first update (the task's reward is 0 at first)
    return cfg


def _pickaxe(*args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    if fault:
        env["PICKAXE_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "pickaxe.cli", *args], env=env, capture_output=True, text=True)


def _close(one: list[dict], two: list[dict]) -> None:
    assert len(one) == len(two) and any(r.get("grad_norm", 0.0) > 0.1 for r in one)  # it learned something
    for a, b in zip(one, two, strict=True):
        for key, value in a.items():
            if key.startswith(("sync/", "time/", "perf/", "mem/")):
                continue
            assert b[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_a_sharded_run_logs_the_single_learner_numbers(tmp_path: Path) -> None:
    from pickaxe.train.build import train

    records = {}
    for learners, shard in ((1, "none"), (2, "fsdp")):
        result, run = train(_cfg(learners, shard), run_dir=tmp_path / shard)
        assert result.steps == 32
        assert json.loads((run.path / "status.json").read_text())["state"] == "finished"
        records[shard] = read_metrics(run.path, deterministic=True)
    _close(records["none"], records["fsdp"])
    latest = tmp_path / "fsdp" / "checkpoints" / (tmp_path / "fsdp" / "checkpoints" / "latest").read_text().strip()
    files = json.loads((latest / "MANIFEST.json").read_text())["files"]
    assert any("rank-1" in name for name in files)  # the second learner wrote its own shards, in the manifest
    # the final model is whole (gathered from the shards): the one-learner run's weights, up to float rounding
    from safetensors.torch import load_file

    whole, sharded = (load_file(tmp_path / s / "model.safetensors") for s in ("none", "fsdp"))
    assert whole.keys() == sharded.keys()
    for name, tensor in whole.items():
        assert sharded[name].shape == tensor.shape and (sharded[name] - tensor).abs().max() < 1e-4, name


def test_a_killed_sharded_run_resumes_exactly_also_from_a_background_checkpoint(tmp_path: Path) -> None:
    """SIGKILLed after its first update and checkpoint, a sharded run resumes to the uninterrupted numbers; with
    ``--trainer.async-checkpoint`` (both learners copy their shards and write them in the background) a kill while
    rank 0 writes step 32's leaves step 16's checkpoint, and that run too ends with the uninterrupted numbers."""
    args = [*TINY, "--dist.learners", "2", "--dist.shard", "fsdp", "--trainer.save-every", "16"]
    args += ["--trainer.total-steps", "48"]
    assert _pickaxe("train", *args, "--run-dir", str(tmp_path / "whole")).returncode == 0
    whole = read_metrics(tmp_path / "whole", deterministic=True)
    assert len(whole) > 3
    killed = _pickaxe("train", *args, "--run-dir", str(tmp_path / "killed"), fault="iteration:1")
    assert killed.returncode != 0  # SIGKILL after the first update and its checkpoint
    done = _pickaxe("resume", str(tmp_path / "killed"), "--no-progress")
    assert done.returncode == 0, done.stderr
    assert read_metrics(tmp_path / "killed", deterministic=True) == whole

    run = tmp_path / "background"
    killed = _pickaxe("train", *args, "--trainer.async-checkpoint", "--run-dir", str(run),
                      fault="checkpoint-manifest:2")  # fmt: skip
    assert killed.returncode != 0
    assert (run / "checkpoints" / "latest").read_text() == "step-000000000016\n"
    done = _pickaxe("resume", str(run), "--no-progress")
    assert done.returncode == 0, done.stderr
    latest = run / "checkpoints" / "step-000000000048"
    assert any("rank-1" in name for name in json.loads((latest / "MANIFEST.json").read_text())["files"])
    assert not list(latest.glob(".receipt-*"))  # the learners' receipts are not part of the checkpoint
    assert read_metrics(run, deterministic=True) == whole  # saving in the background changes no number


def test_a_sharded_checkpoint_resumes_on_one_learner_and_back_on_two(tmp_path: Path) -> None:
    args = [*TINY, "--dist.learners", "2", "--dist.shard", "fsdp", "--trainer.save-every", "16"]
    args += ["--trainer.total-steps", "64"]  # 4 updates: one on two sharded learners, one on one, two on two again
    assert _pickaxe("train", *args, "--run-dir", str(tmp_path / "whole")).returncode == 0
    run = tmp_path / "moved"
    assert _pickaxe("train", *args, "--run-dir", str(run), fault="iteration:1").returncode != 0
    one = _pickaxe("resume", str(run), "--no-progress", "--learners", "1", fault="iteration:1")
    assert one.returncode != 0  # killed again, after a checkpoint written by one unsharded learner
    assert json.loads((run / "config.json").read_text())["dist"]["shard"] == "none"
    two = _pickaxe("resume", str(run), "--no-progress", "--learners", "2", "--shard", "fsdp")
    assert two.returncode == 0, two.stderr
    assert json.loads((run / "config.json").read_text())["dist"]["learners"] == 2
    events = (run / "events.jsonl").read_text()
    assert "resumed on 1 learner(s)" in events and "resumed on 2 learner(s)" in events
    _close(read_metrics(tmp_path / "whole", deterministic=True), read_metrics(run, deterministic=True))


def test_a_damaged_shard_file_is_named_and_the_previous_checkpoint_used(tmp_path: Path) -> None:
    args = [*TINY, "--dist.learners", "2", "--dist.shard", "fsdp", "--trainer.save-every", "16"]
    args += ["--trainer.total-steps", "48"]
    run = tmp_path / "run"
    assert _pickaxe("train", *args, "--run-dir", str(run), fault="iteration:2").returncode != 0
    checkpoints = run / "checkpoints"
    latest = checkpoints / (checkpoints / "latest").read_text().strip()
    shard = next(p for p in latest.iterdir() if "rank-1" in p.name)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    done = _pickaxe("resume", str(run), "--no-progress")
    assert done.returncode == 0, done.stderr
    assert shard.name in done.stderr and latest.name in done.stderr  # named, then skipped


def test_engine_workers_generate_from_the_weights_gathered_from_the_shards(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from pickaxe.train.build import train

    records = {}
    for placement in ("colocated", "separate"):
        cfg = _cfg(2, "fsdp")
        cfg.trainer.total_steps = 16
        cfg.dist.placement = placement
        train(cfg, run_dir=tmp_path / placement)
        records[placement] = read_metrics(tmp_path / placement, deterministic=True)
    rewards = {p: [r.get("rollout/reward_mean") for r in recs] for p, recs in records.items()}
    assert rewards["colocated"] == rewards["separate"]  # the same completions, so the same rewards
    _close(records["colocated"], records["separate"])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dist.shard", "fsdp"], "--dist.shard fsdp shards across learners: add --dist.learners 2"),
        (["--dist.offload", "params"], "--dist.offload params offloads sharded state: add --dist.shard fsdp"),
        (["--dist.shard", "zero9"], "--dist.shard"),
    ],
)
def test_sharding_flags_that_cannot_work_are_one_line_before_anything_starts(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    done = _pickaxe("train", *TINY, *flags, "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_best_of_n_with_sharded_learners_is_refused_in_one_line(tmp_path: Path) -> None:
    # every LLM trainer shards; best-of-n has no update to split, so --dist.learners refuses it first
    done = _pickaxe("train", "synthetic-bon", "--dist.learners", "2", "--dist.shard", "fsdp", "--run-dir",
                    str(tmp_path / "run"))  # fmt: skip
    assert done.returncode == 2 and "does not split its update among learners" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
