"""Generation from a run's checkpoints (playground and arena): the chosen weights are the ones loaded, the
reported log-probs are the model's, sampling is seeded, and `pickaxe arena` stores every checkpoint's response
once (reruns generate nothing) with one-line errors for bad input."""

import copy
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch

from pickaxe.errors import PickaxeError
from pickaxe.eval.arena import ArenaStore
from pickaxe.models.lm import completion_logprobs
from pickaxe.models.tokenizer import render_prompt
from pickaxe.recipes import get_recipe
from pickaxe.recipes.llm import LLM_RECIPES
from pickaxe.rollout.text_collector import pack
from pickaxe.train.build import train
from pickaxe.train.config import TrainerConfig
from pickaxe.train.generate import (
    available_checkpoints,
    generate,
    heldout_prompts,
    load_run_policy,
    prepare_arena,
)
from pickaxe.train.llm_config import LLMEvalConfig, LLMTrainConfig, LMConfig, TextCollectorConfig
from pickaxe.ui.arena_command import main as arena_main


def _cfg() -> LLMTrainConfig:
    cfg = LLM_RECIPES["arith-sft"].make()
    cfg.model = LMConfig(hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64)
    cfg.collector = TextCollectorConfig(prompts=16)
    cfg.eval = LLMEvalConfig(prompts=4, samples=0, before=False)
    cfg.trainer = TrainerConfig(total_steps=64, eval_every=32, keep_last=1)
    cfg.algo.lr = 3e-3
    cfg.device = "cpu"
    return cfg


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny SFT run: the final model, a checkpoint at env step 64, and kept policies at 32 and 64 (the
    checkpoint of step 32 was pruned: its weights load from ``RUN/policies``)."""
    path = tmp_path_factory.mktemp("runs") / "sft"
    train(_cfg(), run_dir=path)
    return path


def test_the_chosen_checkpoint_is_the_one_generating(run_dir: Path) -> None:
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")) == ["step-000000000064"]
    assert available_checkpoints(run_dir) == [32, 64, "final"]
    early, final = load_run_policy(run_dir, 32), load_run_policy(run_dir, "final")
    assert early.label == "step 32" and final.label == "final"
    prompts = ["12+34=", "7+8="]
    a, b = generate(early, prompts, logprobs=True), generate(final, prompts, logprobs=True)
    assert [g.logprobs for g in a] != [g.logprobs for g in b]
    # the log-probs reported are the model's own (teacher-forced) log-probs of the tokens it produced
    tok = final.tokenizer
    for g in b:
        batch = pack([render_prompt(tok, g.prompt)], [g.token_ids], tok.pad_token_id)
        with torch.no_grad():
            ref = completion_logprobs(final.model, batch["input_ids"], batch["attention_mask"], batch["loss_mask"])
        assert g.logprobs == pytest.approx(ref[0][batch["loss_mask"][0].bool()].tolist(), abs=1e-4)
        assert len(g.tokens) == len(g.token_ids) and "".join(g.tokens).startswith(g.text)
    assert generate(final, prompts)[0].logprobs is None


def test_sampling_is_seeded_and_length_is_bounded(run_dir: Path) -> None:
    policy = load_run_policy(run_dir, 64)
    one = generate(policy, ["1+1="] * 4, max_new_tokens=5, temperature=1.0, seed=7)
    two = generate(policy, ["1+1="] * 4, max_new_tokens=5, temperature=1.0, seed=7)
    assert [g.token_ids for g in one] == [g.token_ids for g in two]
    assert all(len(g.token_ids) <= 5 for g in one)
    with pytest.raises(ValueError, match="positions"):
        generate(policy, ["9" * 200], max_new_tokens=5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(policy, ["1+1="], max_new_tokens=0)


def test_a_vllm_runs_policy_generates_through_its_own_engine(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pickaxe.load`` of a run trained with ``--engine.name vllm`` generates through a VLLMEngine built once from the
    folder the run's engine loaded and given the loaded weights, reseeded per call (its wiring, with a fake engine
    class here: vLLM runs only on a GPU); the playground's ``generate`` stays on HF."""
    from pickaxe.rollout.engines import HFEngine, vllm

    built: list[tuple] = []

    class FakeVLLM:  # vLLM's interface, generating with HF from the weights it was given
        def __init__(self, path: str, eos: int, seed: int, memory: float, dtype: str) -> None:
            built.append((path, eos, seed))
            self.seed, self.version, self.calls, self.model = seed, 0, 0, None

        def load_weights(self, state: dict, version: int) -> None:
            self.model = copy.deepcopy(policy.model)
            self.model.load_state_dict(state)
            self.version = version

        def load_state_dict(self, state: dict) -> None:
            self.calls, self.version = state["calls"], state["version"]

        def generate(self, ids: list, params: Any) -> list:
            tok = policy.tokenizer
            return HFEngine(self.model, tok.eos_token_id, tok.pad_token_id, 64, self.seed).generate(ids, params)

    monkeypatch.setattr(vllm, "VLLMEngine", FakeVLLM)
    policy = load_run_policy(run_dir, 64)
    prompts = ["12+34=", "7+8="]
    hf = [g.token_ids for g in generate(policy, prompts, max_new_tokens=5, temperature=1.0, seed=3)]
    policy.config.engine.name = "vllm"  # as a vLLM run's config says
    out = [g.token_ids for g in policy.generate(prompts, max_new_tokens=5, temperature=1.0, seed=3)]
    again = [g.token_ids for g in policy.generate(prompts, max_new_tokens=5, temperature=1.0, seed=3)]
    assert built == [(str(run_dir / "engine_model"), policy.tokenizer.eos_token_id, 3)]  # built once
    assert out == again == hf  # the loaded weights, sampled from the seed of each call
    assert policy.engine.version == 64
    assert [g.token_ids for g in generate(policy, prompts, max_new_tokens=5, temperature=1.0, seed=3)] == hf
    assert len(built) == 1  # generate() without engine= (playground, arena) stays on HF


def test_prepare_arena_stores_each_response_once(run_dir: Path, tmp_path: Path) -> None:
    store = ArenaStore(tmp_path / "arena.sqlite")
    made = prepare_arena(store, "sft", run_dir, "all", n_prompts=3)
    # final and step 64 are the same weights: `all` keeps one of them
    assert made == 6 and store.labels("sft") == ["step 32", "step 64"]
    assert list(store.prompts("sft").values()) == heldout_prompts(_cfg(), 3)
    assert prepare_arena(store, "sft", run_dir, "all", n_prompts=3) == 0
    assert prepare_arena(store, "sft", run_dir, ["final"], n_prompts=3) == 3
    assert store.labels("sft") == ["step 32", "step 64", "final"]
    policy = load_run_policy(run_dir, 32)
    expected = generate(policy, heldout_prompts(_cfg(), 3))
    with sqlite3.connect(store.path) as db:
        rows = db.execute("SELECT response FROM responses WHERE label = 'step 32' ORDER BY prompt_id").fetchall()
    assert [r[0] for r in rows] == [g.text for g in expected]
    with pytest.raises(PickaxeError, match="at least two checkpoints"):
        prepare_arena(store, "other", run_dir, [32], n_prompts=3)
    with pytest.raises(PickaxeError, match="already holds other prompts"):
        prepare_arena(store, "sft", run_dir, [32, 64], prompts=["a different prompt"])


def test_arena_command_writes_the_run_arena_file(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert arena_main([str(run_dir), "--checkpoints", "32", "--checkpoints", "64", "--prompts", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 checkpoints (step 32, step 64) x 2 prompts" in out
    store = ArenaStore(run_dir / "arena.sqlite")
    assert store.arenas() == ["sft"] and store.source("sft")["settings"]["temperature"] == 0.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prompts", "0"], "prompts"),
        (["--checkpoints", "all", "32"], "`all` alone"),
        (["--checkpoints", "nope"], "env step"),
        (["--checkpoints", "32", "999"], "no checkpoint at env step 999"),
        (["--promts", "3"], "did you mean --prompts"),
    ],
)
def test_arena_command_bad_input_is_one_line(run_dir: Path, tmp_path: Path, argv: list[str], message: str) -> None:
    with pytest.raises(PickaxeError, match=message) as e:
        arena_main([str(run_dir), "--db", str(tmp_path / "a.sqlite"), *argv])
    assert "\n" not in str(e.value)


def test_arena_command_refuses_runs_without_a_policy(tmp_path: Path) -> None:
    with pytest.raises(PickaxeError, match="needs a run directory first"):
        arena_main(["--prompts", "3"])
    with pytest.raises(PickaxeError, match="not a run directory"):
        arena_main([str(tmp_path)])
    classic = tmp_path / "classic"
    classic.mkdir()
    (classic / "config.json").write_text(json.dumps(get_recipe("cartpole-ppo").to_dict()))
    with pytest.raises(PickaxeError, match="classic RL run"):
        arena_main([str(classic)])
