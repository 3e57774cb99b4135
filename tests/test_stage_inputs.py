"""``inputs.json``: the size and sha256 of each file an LLM run reads from outside its folder, recorded when it starts;
a resume refuses, naming the file, when one changed (runs recorded by an older pickaxe, one digest per input, still
resume). Torch-light: the inputs are plain files, no model is built."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pickaxe.digests import file_digest
from pickaxe.errors import PickaxeError
from pickaxe.recipes import get_recipe
from pickaxe.train.inputs import INPUTS_FILE, check_inputs


def _setup(tmp_path: Path) -> tuple[object, SimpleNamespace]:
    rm = tmp_path / "rm"  # a reward-model folder from elsewhere (no pickaxe_source.json): recorded, not verified
    rm.mkdir()
    (rm / "config.json").write_text("{}")
    (rm / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    cfg = get_recipe("synthetic-dpo")
    cfg.data.reward_model, cfg.preferences.path = str(rm), str(tmp_path / "pairs.jsonl")
    run = SimpleNamespace(path=tmp_path / "run")
    run.path.mkdir()
    return cfg, run


def test_inputs_json_records_each_file_and_a_resume_names_the_one_that_changed(tmp_path: Path) -> None:
    cfg, run = _setup(tmp_path)
    check_inputs(cfg, run, resuming=False)
    record = json.loads((run.path / INPUTS_FILE).read_text())
    assert record["files"] == {
        "data.reward_model": {n: file_digest(tmp_path / "rm" / n) for n in ("config.json", "model.safetensors")},
        "preferences.path": {"pairs.jsonl": file_digest(tmp_path / "pairs.jsonl")},
    }
    check_inputs(cfg, run, resuming=True)  # unchanged: resumes
    (tmp_path / "rm" / "model.safetensors").write_bytes(b"weighty")  # retrained in place
    with pytest.raises(PickaxeError, match=r"--data.reward-model\) changed since .* \(model.safetensors diff"):
        check_inputs(cfg, run, resuming=True)
    (tmp_path / "rm" / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "rm" / "extra.safetensors").write_bytes(b"")
    with pytest.raises(PickaxeError, match=r"started \(extra.safetensors is new\)"):
        check_inputs(cfg, run, resuming=True)
    (tmp_path / "rm" / "extra.safetensors").unlink()
    (tmp_path / "pairs.jsonl").unlink()
    with pytest.raises(PickaxeError, match=r"\(--preferences.path\) changed since .* \(pairs.jsonl is gone\)"):
        check_inputs(cfg, run, resuming=True)


def test_a_run_recorded_by_an_older_pickaxe_still_resumes_and_is_still_checked(tmp_path: Path) -> None:
    cfg, run = _setup(tmp_path)
    # what inputs.json recorded before: one sha256 over a folder's sorted file names and contents, or a file's name
    # and contents
    legacy = {
        "data.reward_model": hashlib.sha256(b"config.json{}model.safetensorsweights").hexdigest(),
        "preferences.path": hashlib.sha256(b"pairs.jsonl" + (tmp_path / "pairs.jsonl").read_bytes()).hexdigest(),
    }
    (run.path / INPUTS_FILE).write_text(json.dumps({"digests": legacy, "sources": {}}))
    check_inputs(cfg, run, resuming=True)
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "p", "chosen": "b", "rejected": "a"}\n')
    with pytest.raises(PickaxeError, match=r"\(--preferences.path\) changed since"):
        check_inputs(cfg, run, resuming=True)
