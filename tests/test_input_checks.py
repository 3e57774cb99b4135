"""Every input is checked before any work, and a refused command writes nothing: broken preference files, folders
that are no reward model (or no causal LM), tiny-model shapes the attention cannot take, a ``--select.metric`` the
run never logs, a ``--pipeline-dir`` that is or lies inside a run's folder, and ``pickaxe arena`` on a classic run.

Each refusal is exit status 2 with one line on stderr, and the folder it was pointed at is as it was before. The
config-level checks are asserted through ``cfg.check()`` too (what ``train()``, the pipeline and its dry run call
before anything is built), so a check that only fired once a model was loaded would fail here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pickaxe.cli import main
from pickaxe.errors import PickaxeError
from pickaxe.exp.pipeline import RLHF_SYNTHETIC, plan
from pickaxe.recipes import get_recipe


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _refused(capsys: pytest.CaptureFixture[str], root: Path, argv: list[str]) -> str:
    """Run ``pickaxe ARGV``: exit 2, one stderr line, nothing under ``root`` changed; returns the line."""
    before = _listing(root)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    err = err.strip()
    assert err.startswith("pickaxe: error: ") and "\n" not in err, err
    assert "model:" not in out  # no model was built
    assert _listing(root) == before
    return err


def _fake_run(folder: Path, recipe: str = "cartpole-ppo") -> Path:
    """A run folder as far as its files go: config.json of ``recipe`` and a metrics line."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(get_recipe(recipe).to_dict()))
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n")
    return folder


# ------------------------------------------------------------------------------------------- preference files
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", bad\n', "line 2 is not valid JSON"),
        ('{"prompt": "a", "chosen": "b"}\n', "line 1 has no 'rejected' field"),
        ("", "holds no rows"),
        ('{"prompt": "a", "chosen": 3, "rejected": "c"}\n', "field 'chosen' must be a string"),
        ('{"prompt": "a", "chosen": "b", "rejected": "c"}\n\n{"prompt": "a", "chosen": "b"}\n', "line 3 has no"),
        ('{"prompt": "a", "chosen": "b", "rejected": "c"}\n', "has one prompt, so none can be held out"),
    ],
)
def test_a_broken_preference_file_is_refused_before_any_model(
    text: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text(text)
    cfg = get_recipe("synthetic-rm")
    cfg.preferences.path = str(prefs)
    with pytest.raises(PickaxeError, match=expected):
        cfg.check()
    err = _refused(capsys, tmp_path, ["train", "synthetic-rm", "--preferences.path", str(prefs),
                                      "--run-dir", str(tmp_path / "r")])  # fmt: skip
    assert "--preferences.path" in err and str(prefs) in err and expected in err


# -------------------------------------------------------------------------------------------- model folders
@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A causal LM's folder, a reward model's, a run folder and an empty folder."""
    from pickaxe.models.lm import tiny_lm
    from pickaxe.models.reward import RewardModel

    root = tmp_path_factory.mktemp("folders")
    lm = tiny_lm(16, hidden=32, layers=1, heads=4, kv_heads=2, intermediate=32, max_positions=16)
    lm.save_pretrained(root / "lm")
    RewardModel.from_lm(lm).save(root / "rm")
    _fake_run(root / "run", "synthetic-sft")
    (root / "empty").mkdir()
    return root


@pytest.mark.parametrize(
    ("folder", "expected"),
    [
        ("lm", "holds a causal LM, not a reward model"),
        ("run", "is no reward model's"),
        ("empty", "holds no config.json"),
        ("missing", "does not exist"),
    ],
)
def test_a_folder_that_is_no_reward_model_is_refused_before_loading(
    folders: Path, folder: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = get_recipe("synthetic-bon")
    cfg.data.reward_model = str(folders / folder)
    with pytest.raises(PickaxeError, match=expected):
        cfg.check()
    err = _refused(capsys, folders, ["train", "synthetic-bon", "--data.reward-model", str(folders / folder),
                                     "--run-dir", str(folders / "r")])  # fmt: skip
    assert err.startswith(f"pickaxe: error: --data.reward-model '{folders / folder}'") and expected in err


@pytest.mark.parametrize(
    ("folder", "expected"),
    [("rm", "holds a reward model, not a causal LM"), ("run", "names no model_type"), ("missing", "does not exist")],
)
def test_a_model_path_that_is_no_causal_lm_is_refused_before_loading(
    folders: Path, folder: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = get_recipe("synthetic-sft")
    cfg.model.path = str(folders / folder)
    with pytest.raises(PickaxeError, match=expected):
        cfg.check()
    err = _refused(capsys, folders, ["train", "synthetic-sft", "--model.path", str(folders / folder),
                                     "--run-dir", str(folders / "r")])  # fmt: skip
    assert "--model.path" in err and expected in err


def test_the_real_folders_pass(folders: Path) -> None:
    cfg = get_recipe("synthetic-bon")
    cfg.model.path, cfg.data.reward_model = str(folders / "lm"), str(folders / "rm")
    cfg.check()


# ---------------------------------------------------------------------------------------------- model shape
@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--model.hidden", "63"], "--model.hidden 63 does not split into --model.heads 4 heads"),
        (["--model.hidden", "36"], "heads of size 9, which rotary embeddings cannot take"),
        (["--model.kv-heads", "3"], "--model.heads 4 is not a multiple of --model.kv-heads 3"),
        (["--model.heads", "2", "--model.kv-heads", "4"], "--model.heads 2 is not a multiple of --model.kv-heads 4"),
    ],
)
def test_a_shape_the_architecture_cannot_take_is_one_line(
    flags: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(capsys, tmp_path, ["train", "synthetic-sft", *flags, "--run-dir", str(tmp_path / "r")])
    assert expected in err
    err = _refused(capsys, tmp_path, ["pipeline", "rlhf-synthetic", "--dry-run", "--pipeline-dir",
                                      str(tmp_path / "p"), "--", *flags])  # fmt: skip
    assert err.startswith("pickaxe: error: stage sft: ") and expected in err


# ------------------------------------------------------------------------------------------- select.metric
@pytest.mark.parametrize(
    ("recipe", "metric", "expected"),
    [
        ("cartpole-ppo", "eval/accuracy", "did you mean 'eval/return_mean'?"),
        ("synthetic-sft", "eval/nope", "eval/reward/gold"),
        ("synthetic-sft", "train/loss", "eval/accuracy"),
        ("synthetic-rm", "eval/kl", "eval/pairs"),
    ],
)
def test_a_select_metric_the_run_never_logs_is_refused(
    recipe: str, metric: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(capsys, tmp_path, ["train", recipe, "--select.metric", metric, "--run-dir", str(tmp_path / "r")])
    assert f"--select.metric {metric!r} is not a metric this run logs" in err and expected in err


@pytest.mark.parametrize(
    ("recipe", "metric"),
    [("cartpole-ppo", "eval/return_std"), ("synthetic-sft", "eval/reward/gold"), ("synthetic-sft", "eval/pass@4"),
     ("arith-grpo", "eval/sampled_length"), ("synthetic-rm", "eval/pairs")],
)  # fmt: skip
def test_a_select_metric_the_run_logs_is_accepted(recipe: str, metric: str) -> None:
    cfg = get_recipe(recipe)
    cfg.select.metric = metric
    cfg.check()


# ------------------------------------------------------------------------------------------- pipeline folder
def test_a_pipeline_dir_that_is_or_lies_inside_a_run_is_refused_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _fake_run(tmp_path / "run")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    for folder, expected in ((run / "p", f"lies inside {run}, which is a run's folder"), (run, "is a run's folder"),
                             (other, "holds other files and no pipeline.json")):  # fmt: skip
        with pytest.raises(PickaxeError, match=expected):
            plan(RLHF_SYNTHETIC, folder, 0, [])
        argv = ["pipeline", "rlhf-synthetic", "--pipeline-dir", str(folder)]
        assert expected in _refused(capsys, tmp_path, [*argv, "--dry-run"])
        assert expected in _refused(capsys, tmp_path, argv)


# --------------------------------------------------------------------------------------------------- arena
def test_arena_on_a_classic_run_writes_no_arena_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _fake_run(tmp_path / "run")
    err = _refused(capsys, tmp_path, ["arena", str(run)])
    assert "is a classic RL run" in err and not (run / "arena.sqlite").exists()


_NO_TORCH = """
import sys
from pickaxe.cli import main

root = sys.argv[1]
for argv in (["train", "synthetic-rm", "--preferences.path", root + "/bad.jsonl"],
             ["train", "synthetic-bon", "--data.reward-model", root],
             ["train", "synthetic-sft", "--model.hidden", "63"],
             ["train", "synthetic-sft", "--select.metric", "eval/nope"]):
    assert main([*argv, "--run-dir", root + "/r"]) == 2, argv
assert "torch" not in sys.modules, "imported torch"
print("ok")
"""


def test_train_refuses_bad_inputs_before_importing_torch(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "bad.jsonl").write_text("{not json\n")
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, str(tmp_path)], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
    assert _listing(tmp_path) == ["bad.jsonl"]
