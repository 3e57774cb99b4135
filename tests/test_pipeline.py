"""Pipelines: the rlhf-synthetic stage graph and its commands, a failed stage blocking its dependents, resume of a
killed stage on rerun, and (slow) the whole pipeline end to end through the CLI with its worker killed mid-stage.

Stages train a 1-layer width-32 model for a few updates; most of a stage's time is starting Python and torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pickaxe.cli import main
from pickaxe.exp.pipeline import (
    RLHF_SYNTHETIC,
    PipelineOptions,
    Stage,
    default_pipeline_dir,
    headline,
    plan,
    run_pipeline,
)
from pickaxe.exp.queue_store import JobQueue

TINY = ["--model.hidden", "32", "--model.layers", "1", "--eval.prompts", "16", "--preferences.prompts", "32"]


def _config(run_dir: Path) -> dict:
    return json.loads((run_dir / "config.json").read_text())


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _records(*run_dirs: Path) -> dict[str, str]:
    """What each stage's runs have written to their append-only records (events, metrics, the job log): a stage
    that starts again adds to them."""
    return {
        str(path): path.read_text()
        for run_dir in run_dirs
        for path in (run_dir / "events.jsonl", run_dir / "metrics.jsonl", run_dir / "job.log")
        if path.exists()
    }


def test_rlhf_synthetic_graph_and_commands(tmp_path: Path) -> None:
    folder, spec, entries = plan(RLHF_SYNTHETIC, tmp_path / "p", 7, ["--model.hidden", "32"])
    by_name = {e["name"]: e for e in entries}
    assert list(by_name) == ["sft", "rm", "ppo", "rloo", "dpo", "bon"]
    root = (tmp_path / "p").absolute()
    sft, rm = root / "sft", root / "rm"
    deps = {"sft": [], "rm": ["sft"], "ppo": ["sft", "rm"], "rloo": ["sft", "rm"], "dpo": ["sft", "rm"]}
    for name, e in by_name.items():
        assert e["depends_on"] == deps.get(name, ["sft", "rm"])
        command = e["command"]
        assert command[1:5] == ["-m", "pickaxe.cli", "train", f"synthetic-{name}"]
        assert command[5:7] == ["--model.hidden", "32"]  # extra flags reach every stage
        assert command[-5:] == ["--seed", "7", "--run-dir", str(root / name), "--no-progress"]
        assert e["export"] == str(root / name / "export")
        flags = dict(zip(command[7:-5:2], command[8:-5:2], strict=True))
        if name == "sft":
            assert flags == {}
            continue
        assert flags["--model.path"] == str(sft / "export") and flags["--warm-start.updates"] == "0"
        if name != "rm":
            assert flags["--data.reward-model"] == str(rm / "export")
        if name == "dpo":
            assert flags["--preferences.path"] == str(rm / "preferences" / "train.jsonl")
            assert flags["--preferences.heldout-path"] == str(rm / "preferences" / "heldout.jsonl")
    # the default folder depends on what decides the runs, so the same command finds it again
    assert plan(RLHF_SYNTHETIC, None, 7, ["--model.hidden", "32"])[0] == default_pipeline_dir(spec)
    assert plan(RLHF_SYNTHETIC, None, 8, ["--model.hidden", "32"])[0] != default_pipeline_dir(spec)
    assert folder == tmp_path / "p"


def test_bad_input_exits_2_and_queues_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = str(tmp_path / "p")
    assert main(["pipeline", "rlhf-synthetc", "--pipeline-dir", p]) == 2
    assert "did you mean 'rlhf-synthetic'" in capsys.readouterr().err
    assert main(["pipeline", "rlhf-synthetic", "--pipeline-dir", p, "--", "--model.hiden", "32"]) == 2
    assert "--model.hidden" in capsys.readouterr().err  # checked as `pickaxe train` would, before queueing
    assert main(["pipeline", "rlhf-synthetic", "--pipeline-dir", p, "--", "--model.path", "x"]) == 2
    assert "--model.path is set by the pipeline for stage(s) rm" in capsys.readouterr().err
    assert main(["pipeline", "rlhf-synthetic", "--pipeline-dir", p, "--", "--seed", "1"]) == 2
    assert main(["pipeline", "rlhf-synthetic", "--workrs", "2"]) == 2
    assert "did you mean --workers?" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
    assert main(["pipeline", "rlhf-synthetic", "--pipeline-dir", p, "--dry-run"]) == 0
    assert "rm after sft:" in capsys.readouterr().out and not (tmp_path / "p").exists()


def test_headline_reads_the_last_values_and_best_of_n_groups(tmp_path: Path) -> None:
    rows = [
        {"step": 1, "eval/reward/gold": 0.1, "eval/kl": 0.5},
        {"step": 2, "eval/reward/gold": 0.25, "eval/reward/proxy": 1.5},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n{torn")
    stage = Stage("ppo", "synthetic-ppo", headline=("eval/reward/gold", "eval/reward/proxy", "eval/kl"))
    assert headline(stage, tmp_path) == "gold 0.25, proxy 1.5, kl 0.5"
    bon = [{"bon/n": n, "eval/reward/gold": g, "eval/reward/proxy": p} for n, g, p in ((1, 0.1, 0.2), (4, 0.3, 0.9))]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in bon) + "\n")
    stage = Stage("bon", "synthetic-bon", headline=("eval/reward/gold", "eval/reward/proxy"), per="bon/n")
    assert headline(stage, tmp_path) == "n=1: gold 0.1, proxy 0.2; n=4: gold 0.3, proxy 0.9"


def test_failed_stage_blocks_its_dependents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken_sft = Stage("sft", "synthetic-sft", flags=("--model.path", "{sft}/no-such-model"))
    broken = dataclasses.replace(RLHF_SYNTHETIC, stages=(broken_sft, *RLHF_SYNTHETIC.stages[1:]))
    folder = tmp_path / "p"
    assert run_pipeline(broken, PipelineOptions(pipeline_dir=str(folder), workers=2), TINY) == 1
    out, err = capsys.readouterr()
    assert f"stage sft failed (exit status 2); log: {folder.absolute() / 'sft' / 'job.log'}" in err
    table = dict(line.split(None, 1) for line in out.splitlines()[1:])
    assert table["sft"].startswith("failed")
    later = [name for name in table if name != "sft"]
    assert later and all(table[name] == "blocked  blocked: stage sft failed" for name in later)
    jobs = JobQueue(folder / "queue.db").list()
    assert {j.name: j.state for j in jobs} == {"sft": "failed", **dict.fromkeys(later, "blocked")}
    assert not any((folder / name).exists() for name in later)  # never started
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["rm"] == {"state": "blocked", "headline": "blocked: stage sft failed"}


def test_pipeline_resumes_a_killed_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    two = dataclasses.replace(RLHF_SYNTHETIC, stages=RLHF_SYNTHETIC.stages[:2])  # sft -> rm
    folder = tmp_path / "p"
    opts = PipelineOptions(pipeline_dir=str(folder), workers=2)
    extra = [*TINY, "--trainer.total-steps", "1280", "--save-every", "320"]  # sft: 20 updates, a checkpoint per 5
    monkeypatch.setenv("PICKAXE_FAULT", "iteration:8")  # SIGKILL the first stage mid-run, like an OOM kill
    monkeypatch.setenv("PICKAXE_FAULT_ONCE", str(tmp_path / "fired"))
    assert run_pipeline(two, opts, extra) == 1
    _, err = capsys.readouterr()
    assert "sft failed" in err and "killed by SIGKILL" in err
    sft, rm = folder.absolute() / "sft", folder.absolute() / "rm"
    assert not rm.exists()

    assert run_pipeline(two, opts, extra) == 0  # the same command again continues
    out, err = capsys.readouterr()
    assert "continuing: sft failed, retried (resumes its run), rm blocked (queued again)" in err
    assert "resumed from step-000000000320" in (sft / "events.jsonl").read_text()
    steps = _steps(sft)
    assert steps == sorted(set(steps)) and steps[-1] == 1280  # no step logged twice
    assert (sft / "job.log").read_text().count("### pickaxe job") == 2
    assert _config(rm)["model"]["path"] == str(sft / "export") and (rm / "export" / "config.json").is_file()
    assert _config(rm)["warm_start"]["updates"] == 0
    table = dict(line.split(None, 1) for line in out.splitlines()[1:])
    assert table["sft"].startswith("succeeded  accuracy") and table["rm"].startswith("succeeded  accuracy")

    stamps = [p.stat().st_mtime_ns for p in (sft / "model.safetensors", rm / "model.safetensors")]
    records = _records(sft, rm)
    assert run_pipeline(two, opts, extra) == 0  # everything done: nothing new is queued or run
    assert "sft succeeded (kept), rm succeeded (kept)" in capsys.readouterr().err
    assert [(j.name, j.attempts) for j in JobQueue(folder / "queue.db").list()] == [("sft", 2), ("rm", 1)]
    assert [p.stat().st_mtime_ns for p in (sft / "model.safetensors", rm / "model.safetensors")] == stamps
    assert _records(sft, rm) == records  # no stage started again: not a line more in its events or job log


def test_a_stage_killed_before_its_first_checkpoint_starts_again_on_rerun(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    one = dataclasses.replace(RLHF_SYNTHETIC, stages=RLHF_SYNTHETIC.stages[:1])  # sft
    folder = tmp_path / "p"
    opts = PipelineOptions(pipeline_dir=str(folder), workers=1)
    extra = [*TINY, "--trainer.total-steps", "640"]  # no checkpoint before the last one
    monkeypatch.setenv("PICKAXE_FAULT", "iteration:1")  # SIGKILL after the first update
    monkeypatch.setenv("PICKAXE_FAULT_ONCE", str(tmp_path / "fired"))
    assert run_pipeline(one, opts, extra) == 1
    assert "rerun the same command to retry it" in capsys.readouterr().err
    sft = folder.absolute() / "sft"
    assert _steps(sft) and not (sft / "checkpoints").exists()

    assert run_pipeline(one, opts, extra) == 0  # the retry starts the stage's run again instead of failing
    _, err = capsys.readouterr()
    assert "continuing: sft failed, retried (starts its run again: no checkpoint yet)" in err
    assert "has no checkpoint to resume from: starting the run again from step 0" in (sft / "events.jsonl").read_text()
    steps = _steps(sft)
    assert steps == sorted(set(steps)) and steps[-1] == 640


@pytest.mark.slow
def test_rlhf_synthetic_end_to_end_survives_a_killed_worker(tmp_path: Path) -> None:
    folder = tmp_path / "p"
    command = [
        sys.executable, "-m", "pickaxe.cli", "pipeline", "rlhf-synthetic", "--pipeline-dir", str(folder),
        "--workers", "2", "--", *TINY, "--trainer.total-steps", "2560", "--save-every", "320",
    ]  # fmt: skip
    sft = folder.absolute() / "sft"
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not (sft / "checkpoints" / "latest").exists():
            assert first.poll() is None and time.monotonic() < deadline, "no sft checkpoint"
            time.sleep(0.05)
    finally:
        os.kill(first.pid, signal.SIGKILL)  # the pipeline and its in-process worker; the stage dies with it
        first.wait()
    assert JobQueue(folder / "queue.db").list()[0].state == "running"  # left behind by the dead worker

    second = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert second.returncode == 0, second.stderr
    assert "sft killed while running (resumes its run)" in second.stderr
    assert "resumed from" in (sft / "events.jsonl").read_text()
    steps = _steps(sft)
    assert steps == sorted(set(steps)) and steps[-1] == 2560
    stages = [e["name"] for e in json.loads((folder / "pipeline.json").read_text())["stages"]]
    assert stages[:2] == ["sft", "rm"] and {"dpo", "bon"} <= set(stages)
    rm = folder.absolute() / "rm"
    for name in stages[1:]:
        cfg = _config(folder.absolute() / name)
        assert cfg["model"]["path"] == str(sft / "export")
        if name != "rm":
            assert cfg["data"]["reward_model"] == str(rm / "export")
    assert _config(folder.absolute() / "dpo")["preferences"]["path"] == str(rm / "preferences" / "train.jsonl")
    summary = json.loads((folder / "summary.json").read_text())
    assert all(s["state"] == "succeeded" for s in summary.values())
    assert "gold" in summary["dpo"]["headline"] and "n=16" in summary["bon"]["headline"]

    records = _records(*(folder.absolute() / name for name in stages))
    attempts = [(j.name, j.attempts) for j in JobQueue(folder / "queue.db").list()]
    third = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert third.returncode == 0, third.stderr
    assert "[1/" not in third.stderr  # no stage ran again: none was queued, none wrote a line
    assert [(j.name, j.attempts) for j in JobQueue(folder / "queue.db").list()] == attempts
    assert _records(*(folder.absolute() / name for name in stages)) == records


def test_a_stage_may_depend_only_on_earlier_stages(tmp_path: Path) -> None:
    """A stage listed before one it depends on (or depending on itself, or on no stage at all) is refused by name
    before anything is planned or queued; a placeholder naming a stage that is not a dependency likewise."""
    from pickaxe.errors import ConfigError

    sft, rm = RLHF_SYNTHETIC.stages[:2]
    for stages, missing in (((rm, sft), "sft"), ((dataclasses.replace(sft, depends_on=("sft",)),), "sft"),
                            ((sft, dataclasses.replace(rm, depends_on=("sfft",))), "sfft")):  # fmt: skip
        pipeline = dataclasses.replace(RLHF_SYNTHETIC, stages=stages)
        with pytest.raises(ConfigError, match=f"stage {stages[-1 if missing == 'sfft' else 0].name} depends on "
                                              f"{missing}, which is not an earlier stage"):  # fmt: skip
            plan(pipeline, tmp_path / "p", 0, [])
    undeclared = dataclasses.replace(rm, depends_on=())
    with pytest.raises(ConfigError, match=r"stage rm: flag placeholder \{sft\} is not one of its dependencies"):
        plan(dataclasses.replace(RLHF_SYNTHETIC, stages=(sft, undeclared)), tmp_path / "p", 0, [])
    assert not (tmp_path / "p").exists()


def test_extra_flags_name_the_default_folder_and_the_pipeline_sets_run_folders(tmp_path: Path) -> None:
    from pickaxe.errors import ConfigError

    extras = ([], ["--model.hidden", "32"], ["--model.hidden", "64"])
    folders = {plan(RLHF_SYNTHETIC, None, 0, extra)[0] for extra in extras}
    assert len(folders) == 3  # other train flags: other runs, another folder
    with pytest.raises(ConfigError, match="--run-dir is set by the pipeline"):
        plan(RLHF_SYNTHETIC, tmp_path / "p", 0, ["--run-dir", "x"])


def test_the_summary_fails_unless_every_stage_succeeded_and_names_the_root_cause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """sft succeeded, rm failed, ppo (after rm) is blocked, and dpo (after ppo here) is blocked by rm's failure
    through ppo: exit status 1, and each blocked stage names the stage that failed."""
    from types import SimpleNamespace

    from pickaxe.exp import pipeline

    jobs = {
        1: SimpleNamespace(name="sft", state="succeeded", depends_on=[], run_dir=str(tmp_path / "sft"), reason=None),
        2: SimpleNamespace(name="rm", state="failed", depends_on=[1], run_dir="", reason="exit status 1",
                           log_path="rm/job.log"),
        3: SimpleNamespace(name="ppo", state="blocked", depends_on=[1, 2], run_dir="", reason=None),
        4: SimpleNamespace(name="dpo", state="blocked", depends_on=[3], run_dir="", reason=None),
    }  # fmt: skip
    queue = SimpleNamespace(get=jobs.__getitem__)
    ids = {j.name: i for i, j in jobs.items()}
    stages = {s.name: s for s in RLHF_SYNTHETIC.stages}
    assert pipeline._summarize(queue, ids, {i: n for n, i in ids.items()}, stages, tmp_path) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ppo"]["headline"] == summary["dpo"]["headline"] == "blocked: stage rm failed"
    assert summary["sft"]["state"] == "succeeded" and "rerun the same command" in capsys.readouterr().err
