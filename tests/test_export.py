"""Exporting a model between stages: ``export_model`` / ``export_run`` / ``pickaxe export`` write a standard
transformers folder that loads by path with the run's exact log-probs, records where it came from, and is written
completely or not at all."""

import hashlib
import json
from pathlib import Path

import pytest
import torch

from pickaxe.cli import main
from pickaxe.errors import PickaxeError
from pickaxe.models.export import SOURCE_FILE, export_model, read_export_source, verify_export
from pickaxe.models.lm import completion_logprobs, load_lm, tiny_lm
from pickaxe.models.reward import RewardModel, tiny_reward_model
from pickaxe.models.tokenizer import SIMPLE_CHAT_TEMPLATE, char_tokenizer, load_tokenizer, render_prompt
from pickaxe.recipes.llm import LLM_RECIPES
from pickaxe.rollout.text_collector import pack
from pickaxe.runs.model import load_model
from pickaxe.train.build import train
from pickaxe.train.config import TrainerConfig
from pickaxe.train.export import export_run
from pickaxe.train.llm import build_model, derive_llm_seeds
from pickaxe.train.llm_config import LLMEvalConfig, LLMTrainConfig, LMConfig, TextCollectorConfig

TOK = char_tokenizer()


def _cfg() -> LLMTrainConfig:
    cfg = LLM_RECIPES["arith-sft"].make()
    cfg.model = LMConfig(hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64)
    cfg.collector = TextCollectorConfig(prompts=16)
    cfg.eval = LLMEvalConfig(prompts=4, samples=0, before=False)
    cfg.trainer = TrainerConfig(total_steps=64, eval_every=32)
    cfg.algo.lr = 3e-3
    cfg.device = "cpu"
    return cfg


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny SFT run: final model at step 64, checkpoints at 32 and 64."""
    path = tmp_path_factory.mktemp("runs") / "sft"
    train(_cfg(), run_dir=path)
    return path


def _batch(tokenizer) -> dict[str, torch.Tensor]:
    prompts = [render_prompt(tokenizer, p) for p in ("12+34=", "7+8=", "99+1=")]
    answers = [tokenizer("46", add_special_tokens=False)["input_ids"], [5, 6, 1], [4]]
    return pack(prompts, answers, tokenizer.pad_token_id)


def _logprobs(model, tokenizer) -> torch.Tensor:
    b = _batch(tokenizer)
    with torch.no_grad():
        return completion_logprobs(model, b["input_ids"], b["attention_mask"], b["loss_mask"])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run_model(run_dir: Path, checkpoint: str | int = "final"):
    cfg = _cfg()
    model, tokenizer = build_model(cfg, torch.device("cpu"), derive_llm_seeds(cfg.seed)["model"])
    load_model(run_dir, {"policy": model}, checkpoint=checkpoint)
    return model.eval(), tokenizer


def test_exported_run_loads_by_path_with_the_runs_exact_logprobs(run_dir: Path, tmp_path: Path) -> None:
    out = export_run(run_dir, tmp_path / "sft-export")
    assert {"config.json", "model.safetensors", "tokenizer.json", SOURCE_FILE} <= {p.name for p in out.iterdir()}
    model, tokenizer = _run_model(run_dir)
    loaded, loaded_tok = load_lm(out, "cpu"), load_tokenizer(out)
    assert loaded_tok.get_vocab() == tokenizer.get_vocab() and loaded_tok.eos_token_id == tokenizer.eos_token_id
    expected = _logprobs(model, tokenizer)
    assert expected.abs().sum() > 0
    assert torch.equal(_logprobs(loaded, loaded_tok), expected)
    # a different checkpoint exports different weights, and says which
    older = export_run(run_dir, tmp_path / "at-32", checkpoint=32)
    assert not torch.equal(_logprobs(load_lm(older, "cpu"), loaded_tok), expected)
    assert torch.equal(_logprobs(load_lm(older, "cpu"), loaded_tok), _logprobs(_run_model(run_dir, 32)[0], tokenizer))
    assert read_export_source(older)["step"] == 32 and read_export_source(older)["checkpoint"] == 32


def test_export_records_which_run_it_came_from(run_dir: Path, tmp_path: Path) -> None:
    source = read_export_source(export_run(run_dir, tmp_path / "e"))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    digest = json.loads((run_dir / "model.json").read_text())
    assert source["run_dir"] == str(run_dir.resolve()) and source["run_name"] == "sft"
    assert (source["recipe"], source["algo_name"], source["kind"], source["seed"]) == ("arith-sft", "sft", "llm", 0)
    assert source["config_hash"] == manifest["config_hash"] is not None
    assert source["checkpoint"] == "final" and source["step"] == 64
    assert source["weights_sha256"] == _sha256(tmp_path / "e" / "model.safetensors") != digest["sha256"]
    assert source["format"] == "transformers-causal-lm" and source["lora_merged"] is False
    assert source["started_from"] is None  # the run started from the tiny model, not a folder
    latest = read_export_source(export_run(run_dir, tmp_path / "l", checkpoint="latest"))
    assert latest["step"] == 64 and latest["weights_sha256"] == _sha256(tmp_path / "l" / "model.safetensors")
    assert read_export_source(tmp_path) is None  # not an export


def test_cli_export_default_folder_overwrite_and_errors(run_dir: Path, tmp_path: Path, capsys) -> None:
    # the default folder is the run's own export (the trainer wrote one): replaced
    assert main(["export", str(run_dir), "--checkpoint", "latest"]) == 0
    summary = json.loads(capsys.readouterr().out.strip())
    out = run_dir / "export"
    assert summary == {
        "run_dir": str(run_dir),
        "out": str(out),
        "checkpoint": "latest",
        "step": 64,
        "lora_merged": False,
    }
    assert (out / "model.safetensors").is_file() and read_export_source(out)["checkpoint"] == "latest"
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".export")]  # no temporary left behind
    # another folder holding an export is replaced only with --overwrite; until then it stays intact
    mine = tmp_path / "sft-model"
    assert main(["export", str(run_dir), "--out", str(mine), "--checkpoint", "32"]) == 0
    assert main(["export", str(run_dir), "--out", str(mine)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("pickaxe: error: ") and "already holds an export" in err
    assert read_export_source(mine)["step"] == 32
    assert main(["export", str(run_dir), "--out", str(mine), "--overwrite"]) == 0
    assert read_export_source(mine)["step"] == 64 and sorted(p.name for p in tmp_path.iterdir()) == ["sft-model"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["export"], "pickaxe export needs a run directory first"),
        (["export", "{run}", "--checkpoint", "newest"], "--checkpoint must be final, best, latest or an env step"),
        (["export", "{run}", "--checkpoint", "40"], "no checkpoint at env step 40; kept checkpoints: 32, 64"),
        (["export", "{tmp}/nowhere"], "is not a run directory (no config.json)"),
        (["export", "{run}", "--ovewrite"], "did you mean --overwrite"),
        (["export", "{run}", "--device", "tpu:x"], "--device 'tpu:x' is not a device"),
        (["export", "{run}", "--out", "{tmp}/file.txt"], "is a file; choose a folder path"),
        (["export", "{run}", "--out", "{tmp}/busy", "--overwrite"], "not a pickaxe export; choose another folder"),
        (["export", "{classic}"], "is a classic RL run; export writes transformers folders of LLM runs only"),
    ],
)
def test_cli_export_bad_input_is_one_line(
    run_dir: Path, tmp_path: Path, capsys, argv: list[str], expected: str
) -> None:
    from pickaxe.recipes import get_recipe

    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    classic = tmp_path / "classic"
    classic.mkdir()
    (classic / "config.json").write_text(json.dumps(get_recipe("cartpole-ppo").to_dict()))
    argv = [a.format(run=run_dir, tmp=tmp_path, classic=classic) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pickaxe: error: ") and "\n" not in err and "Traceback" not in err
    assert expected in err
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("kind", ["OSError", "SafetensorError"])
def test_cli_export_onto_a_full_disk_is_one_line(
    run_dir: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    import errno

    import transformers

    class SafetensorError(Exception):
        """What safetensors raises for an I/O error (it is no OSError)."""

    def full_disk(self, path: str, *args, **kwargs) -> None:
        (Path(path) / "model.safetensors").write_bytes(b"half a model")
        if kind == "OSError":
            raise OSError(errno.ENOSPC, "No space left on device", str(Path(path) / "model.safetensors"))
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", full_disk)
    out = tmp_path / "m"
    assert main(["export", str(run_dir), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == (
        f"pickaxe: error: no space left on device writing {out}; nothing was exported: free space and run the "
        "command again"
    )
    assert captured.out == "" and list(tmp_path.iterdir()) == []  # no half export, no temporary folder


def test_export_and_load_print_no_transformers_progress_bars(run_dir: Path, tmp_path: Path, capfd) -> None:
    from transformers.utils import logging as hf_logging

    capfd.readouterr()
    assert main(["export", str(run_dir), "--out", str(tmp_path / "m")]) == 0
    load_lm(tmp_path / "m", "cpu")
    err = capfd.readouterr().err
    assert "Writing model shards" not in err and "Loading weights" not in err and "it/s]" not in err
    assert hf_logging.is_progress_bar_enabled()  # a program using transformers keeps its bars outside pickaxe


def test_cli_export_help(capsys) -> None:
    assert main(["export", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--checkpoint" in text and "--out" in text and "RUN_DIR/export" in text
    assert main(["--help"]) == 0
    assert "export RUN_DIR [--out DIR]" in capsys.readouterr().out


def test_a_failed_export_leaves_nothing_and_keeps_the_previous_one(tmp_path: Path) -> None:
    model = tiny_lm(len(TOK), hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32)
    out = export_model(model, TOK, tmp_path / "m", {"note": "first"})

    class Broken:
        def save_pretrained(self, path: str) -> None:
            (Path(path) / "tokenizer.json").write_text("{half")
            raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space left"):
        export_model(model, Broken(), tmp_path / "new")
    with pytest.raises(OSError, match="No space left"):
        export_model(model, Broken(), out, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no new folder, no temporary left behind
    assert read_export_source(out)["note"] == "first" and load_tokenizer(out).get_vocab() == TOK.get_vocab()


def test_export_keeps_the_chat_template(tmp_path: Path) -> None:
    tok = char_tokenizer(chat_template=SIMPLE_CHAT_TEMPLATE)
    model = tiny_lm(len(tok), hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32)
    out = export_model(model, tok, tmp_path / "chat")
    loaded = load_tokenizer(out)
    assert loaded.chat_template == SIMPLE_CHAT_TEMPLATE
    assert render_prompt(loaded, "1+2=") == render_prompt(tok, "1+2=") != render_prompt(TOK, "1+2=")


def test_reward_model_exports_in_its_own_format(tmp_path: Path) -> None:
    rm = tiny_reward_model(len(TOK), hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, seed=3)
    out = export_model(rm, TOK, tmp_path / "rm", {"stage": "reward"})
    loaded = RewardModel.load(out, "cpu")
    b = _batch(TOK)
    assert torch.equal(loaded.score(b["input_ids"], b["attention_mask"]), rm.score(b["input_ids"], b["attention_mask"]))
    assert read_export_source(out)["format"] == "pickaxe-reward-model" and load_tokenizer(out).eos_token_id == 1


def test_export_model_refuses_what_it_cannot_save(tmp_path: Path) -> None:
    with pytest.raises(PickaxeError, match="takes a transformers causal LM"):
        export_model(torch.nn.Linear(2, 2), TOK, tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


def test_export_help_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys; from pickaxe.cli import main; main(['export', '--help']); assert 'torch' not in sys.modules"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_full_disk_during_the_final_export_leaves_the_run_crashed_not_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import errno

    import pickaxe.train.llm as llm
    from pickaxe.runs.listing import summarize_run
    from pickaxe.runs.status import read_status, run_state

    def no_space(model, tokenizer, out_dir, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(out_dir))

    monkeypatch.setattr(llm, "export_model", no_space)
    path = tmp_path / "sft"
    with pytest.raises(PickaxeError, match="no space left on device") as raised:
        train(_cfg(), run_dir=path)
    status = read_status(path)
    assert status["state"] == "crashed" and run_state(path) == "crashed"  # never "finished" without its export
    assert status["reason"] == str(raised.value) and str(path / "export") in status["reason"]
    assert summarize_run(path).state == "crashed"
    assert main(["resume", str(path), "--no-progress"]) == 2  # the disk is still full: the same line, exit 2
    assert "no space left on device" in capsys.readouterr().err and run_state(path) == "crashed"

    monkeypatch.undo()  # space freed: the resume exports and the run is finished
    assert main(["resume", str(path), "--no-progress"]) == 0
    assert run_state(path) == "finished" and read_export_source(path / "export")["step"] == 64


@pytest.mark.parametrize("checkpoint", ["final", "best", "latest", 32])
def test_an_export_records_the_size_and_sha256_of_every_file_it_wrote(
    run_dir: Path, tmp_path: Path, checkpoint: str | int
) -> None:
    out = export_run(run_dir, tmp_path / "e", checkpoint=checkpoint)
    source = read_export_source(out)
    written = sorted(p.name for p in out.iterdir() if p.name != SOURCE_FILE)
    assert sorted(source["files"]) == written and "model.safetensors" in written
    for name, entry in source["files"].items():
        assert entry == {"size": (out / name).stat().st_size, "sha256": _sha256(out / name)}, name
    assert source["weights_sha256"] == _sha256(out / "model.safetensors")  # the exported file's, for every checkpoint
    assert verify_export(out, "--model.path") == source


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0x04
    elif how == "truncate":
        del data[len(data) // 2 :]
    if how == "remove":
        path.unlink()
    else:
        path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("name", "how", "problem"),
    [
        ("model.safetensors", "truncate", "has {half} bytes but pickaxe_source.json records {size} (truncated"),
        ("model.safetensors", "flip", "does not match its sha256 in pickaxe_source.json (corrupted on disk)"),
        ("tokenizer.json", "flip", "does not match its sha256 in pickaxe_source.json"),
        ("tokenizer.json", "remove", "is missing but listed in pickaxe_source.json"),  # config.json: below
    ],
)
def test_a_stage_refuses_a_damaged_export_in_one_line_before_loading_it(
    run_dir: Path, tmp_path: Path, capsys, name: str, how: str, problem: str
) -> None:
    out = export_run(run_dir, tmp_path / "sft-export")
    size = (out / name).stat().st_size
    _damage(out / name, how)
    capsys.readouterr()  # what the export printed
    argv = ["train", "arith-sft", "--model.path", str(out), "--trainer.total-steps", "8", "--no-progress"]
    assert main([*argv, "--run-dir", str(tmp_path / "next")]) == 2
    out_text, err = capsys.readouterr()
    assert err.startswith("pickaxe: error: ") and "\n" not in err.strip() and "Traceback" not in err
    assert f"--model.path {out}: {name} {problem.format(half=size // 2, size=size)}" in err
    assert f"pickaxe export {run_dir.resolve()}" in err  # the fix: export it again from its run
    assert "model:" not in out_text and not (tmp_path / "next").exists()  # refused before the model was built


def test_an_export_missing_its_config_is_refused_in_one_line_by_the_folder_check(
    run_dir: Path, tmp_path: Path, capsys
) -> None:
    """Without config.json the folder is no model at all: the torch-free folder check refuses it first, naming the
    file, before the digests are read."""
    out = export_run(run_dir, tmp_path / "sft-export")
    (out / "config.json").unlink()
    capsys.readouterr()
    argv = ["train", "arith-sft", "--model.path", str(out), "--trainer.total-steps", "8", "--no-progress"]
    assert main([*argv, "--run-dir", str(tmp_path / "next")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pickaxe: error: ") and "\n" not in err.strip() and "config.json" in err
    assert not (tmp_path / "next").exists()


def test_an_export_without_digests_or_provenance_still_loads(run_dir: Path, tmp_path: Path) -> None:
    out = export_run(run_dir, tmp_path / "old")
    assert verify_export(tmp_path / "old", "--model.path") is not None
    record = read_export_source(out)
    del record["files"]  # an export from an older pickaxe: loaded, with a warning
    (out / SOURCE_FILE).write_text(json.dumps(record))
    with pytest.warns(UserWarning, match="records no file digests"):
        assert verify_export(out, "--model.path") == record
    (out / SOURCE_FILE).unlink()  # a model from elsewhere: nothing to check against
    assert verify_export(out, "--model.path") is None


def test_evaluating_or_exporting_a_run_whose_starting_export_is_damaged_is_one_line(
    run_dir: Path, tmp_path: Path, capsys
) -> None:
    start = export_run(run_dir, tmp_path / "start")
    cfg = _cfg()
    cfg.model.path, cfg.warm_start.updates, cfg.trainer.total_steps = str(start), 0, 16
    train(cfg, run_dir=tmp_path / "next")  # rebuilding it reads the export again: its architecture and tokenizer
    _damage(start / "model.safetensors", "truncate")
    capsys.readouterr()
    for argv in (["eval", str(tmp_path / "next")], ["export", str(tmp_path / "next"), "--out", str(tmp_path / "o")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("pickaxe: error: ") and "\n" not in err.strip() and "Traceback" not in err
        assert f"--model.path {start}: model.safetensors has" in err
    assert not (tmp_path / "o").exists()
