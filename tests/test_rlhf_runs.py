"""The RLHF stages as runs: the synthetic task's gold score, gold-labelled preference pairs, the pair collector's
exact state, best-of-n, and SFT -> reward model -> DPO / best-of-n chained through exported folders."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pickaxe.envs.text.example import Example
from pickaxe.envs.text.preferences import PreferencePair, load_preferences, save_preferences
from pickaxe.envs.text.synthetic_preferences import sort_quality
from pickaxe.models.tokenizer import char_tokenizer
from pickaxe.recipes import get_recipe
from pickaxe.rollout.gold_preferences import gold_pairs
from pickaxe.rollout.pair_collector import PairCollector
from pickaxe.train.best_of_n import best_of_n_kl, pick_best
from pickaxe.train.build import config_from_dict, train
from pickaxe.train.eval_metrics import eval_metric_names


def test_sort_quality_scores_order_and_digits() -> None:
    assert sort_quality("sort 4821=", "1248") == 1.0
    assert sort_quality("sort 4821=", "8421") == 0.0  # every adjacent pair descends
    assert sort_quality("sort 4821=", "1284") == pytest.approx(2 / 3)  # 2 of 3 pairs in order, digits all right
    assert sort_quality("sort 4821=", "124") == pytest.approx(6 / 7)  # sorted; F1 of 3 right of 4 = 6/7
    assert sort_quality("sort 4821=", "0000") == 0.0  # sorted but none of the digits
    assert sort_quality("sort 4821=", "") == 0.0


def test_gold_pairs_label_by_gold_and_skip_ties_duplicates_and_empties() -> None:
    ex = Example("sort 312=", "123", {"digits": "312"})
    pairs = gold_pairs(ex, ["123", "321", "123", " ", "132", "213"], sort_quality, np.random.default_rng(0))
    # distinct non-empty: 123 (1.0), 321 (0.0), 132 (0.5), 213 (0.5); 132 vs 213 tie -> skipped
    got = {(p.chosen, p.rejected) for p in pairs}
    assert got == {("123", "321"), ("123", "132"), ("123", "213"), ("132", "321"), ("213", "321")}
    assert all(p.metadata["gold_chosen"] > p.metadata["gold_rejected"] for p in pairs)


def test_noisy_gold_labels_follow_bradley_terry() -> None:
    ex = Example("sort 312=", "123", {"digits": "312"})
    rng = np.random.default_rng(0)
    flips = sum(gold_pairs(ex, ["123", "132"], sort_quality, rng, label_temperature=0.5)[0].chosen == "132"
                for _ in range(4000))  # fmt: skip
    expected = 1 / (1 + math.exp((1.0 - 0.5) / 0.5))  # P(worse one chosen) = sigmoid(-gap / T)
    assert abs(flips / 4000 - expected) < 0.025


def test_saved_preferences_load_back_identically(tmp_path: Path) -> None:
    pairs = [PreferencePair("p1", "a", "b", metadata={"gold_chosen": 1.0}), PreferencePair("p2", "c", "d")]
    save_preferences(pairs, tmp_path / "prefs.jsonl")
    back = load_preferences(tmp_path / "prefs.jsonl")
    assert [(p.prompt, p.chosen, p.rejected, p.metadata) for p in back] == [
        ("p1", "a", "b", {"gold_chosen": 1.0}),
        ("p2", "c", "d", {}),
    ]


def test_pair_collector_resumes_exactly_and_covers_each_epoch() -> None:
    tok = char_tokenizer()
    pairs = [PreferencePair(f"sort {i}=", str(i), str(i) + "9", group=i) for i in range(10)]
    a = PairCollector(pairs, tok, 3, seed=1)
    first_epoch = [int(x) for _ in range(3) for x in a.collect()["pair"][::2]]
    assert len(set(first_epoch)) == 9  # no pair twice within an epoch
    state = a.state_dict()
    b = PairCollector(pairs, tok, 3, seed=99)
    b.load_state_dict(json.loads(json.dumps(state)))  # the checkpoint's JSON round trip
    for _ in range(5):
        x, y = a.collect(), b.collect()
        assert x["pair"].tolist() == y["pair"].tolist() and x["input_ids"].equal(y["input_ids"])


def test_best_of_n_picks_the_proxy_best_of_disjoint_groups() -> None:
    proxy = np.array([[0.1, 0.9, 0.5, 0.2]])
    gold = np.array([[1.0, 0.0, 0.7, 0.3]])
    p, g = pick_best(proxy, gold, 2)  # groups (0.1, 0.9) and (0.5, 0.2)
    assert p.tolist() == [0.9, 0.5] and g.tolist() == [0.0, 0.7]
    p, g = pick_best(proxy, gold, 1)
    assert g.tolist() == [1.0, 0.0, 0.7, 0.3]
    assert best_of_n_kl(1) == 0.0 and best_of_n_kl(4) == pytest.approx(math.log(4) - 0.75)


def _config(run_dir: Path) -> dict:
    return json.loads((run_dir / "config.json").read_text())


def _logged_eval_metrics(run_dir: Path) -> set[str]:
    """The ``eval/`` metrics the run logged (not their CI ends, not the marker of the evaluation before training)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = {k for r in records for k in r if k.startswith("eval/") and k != "eval/phase_before"}
    return {k for k in keys if not k.endswith(("_ci_low", "_ci_high"))}


def _tiny(cfg, steps: int, eval_every: int):
    cfg.model.hidden, cfg.model.layers, cfg.model.intermediate = 32, 1, 64
    cfg.eval.prompts, cfg.eval.samples = 16, 2
    cfg.trainer.total_steps, cfg.trainer.eval_every = steps, eval_every
    return cfg


@pytest.fixture(scope="module")
def stages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny SFT run and a reward-model run started from its export (what the later stages load)."""
    root = tmp_path_factory.mktemp("stages")
    sft = _tiny(get_recipe("synthetic-sft"), 64 * 8, 64 * 8)
    train(sft, root / "sft")
    rm = _tiny(get_recipe("synthetic-rm"), 16 * 4, 16 * 4)
    rm.model.path, rm.warm_start.updates = str(root / "sft" / "export"), 0
    rm.preferences.prompts, rm.preferences.heldout_prompts = 32, 16
    rm.collector.prompts = 8
    train(rm, root / "rm")
    return root


def test_sft_reward_model_dpo_and_best_of_n_chain_through_exports(stages: Path, tmp_path: Path) -> None:
    source = json.loads((stages / "sft" / "export" / "pickaxe_source.json").read_text())
    assert source["recipe"] == "synthetic-sft" and source["run_dir"] == str((stages / "sft").resolve())
    model_json = json.loads((stages / "sft" / "model.json").read_text())
    exported = hashlib.sha256((stages / "sft" / "export" / "model.safetensors").read_bytes()).hexdigest()
    assert source["weights_sha256"] == exported and source["step"] == model_json["step"]  # as `export`
    train_pairs = load_preferences(stages / "rm" / "preferences" / "train.jsonl")
    assert train_pairs and all(p.metadata["gold_chosen"] > p.metadata["gold_rejected"] for p in train_pairs)
    rm_records = [json.loads(line) for line in (stages / "rm" / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/accuracy" in r for r in rm_records if r["step"] > 0)
    for stage in ("sft", "rm"):  # what --select.metric may name is what each kind of run logs
        assert _logged_eval_metrics(stages / stage) == eval_metric_names(config_from_dict(_config(stages / stage)))[0]
    assert (stages / "rm" / "export" / "model.safetensors").is_file()
    rm_source = json.loads((stages / "rm" / "export" / "pickaxe_source.json").read_text())
    assert rm_source["started_from"] == str(stages / "sft" / "export")  # the run records where it came from
    inputs = json.loads((stages / "rm" / "inputs.json").read_text())
    assert inputs["sources"]["model.path"]["run_dir"] == str((stages / "sft").resolve())  # ... and which run made it

    dpo = _tiny(get_recipe("synthetic-dpo"), 16 * 2, 16 * 2)
    dpo.model.path, dpo.warm_start.updates = str(stages / "sft" / "export"), 0
    dpo.preferences.path = str(stages / "rm" / "preferences" / "train.jsonl")
    dpo.preferences.heldout_path = str(stages / "rm" / "preferences" / "heldout.jsonl")
    dpo.data.reward_model = str(stages / "rm" / "export")
    dpo.collector.prompts = 8
    result, _ = train(dpo, tmp_path / "dpo")
    last = result.history[-1]
    for key in ("eval/reward/proxy", "eval/reward/gold", "eval/kl", "eval/eval_accuracy"):
        assert key in last, key
    records = [json.loads(line) for line in (tmp_path / "dpo" / "metrics.jsonl").read_text().splitlines()]
    assert _logged_eval_metrics(tmp_path / "dpo") == eval_metric_names(dpo)[0]
    before = next(r for r in records if r.get("eval/phase_before"))
    assert before["eval/kl"] == 0.0  # before training the policy is its reference, sample for sample
    assert math.isfinite(last["eval/kl"]) and last["eval/kl"] != 0.0

    bon = _tiny(get_recipe("synthetic-bon"), 1, 1)
    bon.model.path, bon.warm_start.updates = str(stages / "sft" / "export"), 0
    bon.data.reward_model = str(stages / "rm" / "export")
    bon.algo.n = (1, 4)
    result, _ = train(bon, tmp_path / "bon")
    assert _logged_eval_metrics(tmp_path / "bon") == eval_metric_names(bon)[0]
    by_n = {r["step"]: r for r in result.history}
    assert by_n[4]["eval/reward/proxy"] >= by_n[1]["eval/reward/proxy"]  # the best of 4 by proxy scores higher
    assert json.loads((tmp_path / "bon" / "status.json").read_text())["state"] == "finished"


def test_a_resumed_best_of_n_run_writes_what_an_uninterrupted_run_writes(
    stages: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickaxe.train.best_of_n as best_of_n
    from pickaxe.runs.run import read_metrics
    from pickaxe.runs.status import read_status
    from pickaxe.train.build import resume

    bon = _tiny(get_recipe("synthetic-bon"), 1, 1)
    bon.model.path, bon.data.reward_model = str(stages / "sft" / "export"), str(stages / "rm" / "export")
    bon.warm_start.updates, bon.warm_start.batch_size, bon.warm_start.log_every = 2, 8, 1
    bon.algo.n = (1, 2, 4)
    train(bon, tmp_path / "a")
    calls = [0]

    def crash_at_the_second_n(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("killed")
        return pick_best(*args, **kwargs)

    monkeypatch.setattr(best_of_n, "pick_best", crash_at_the_second_n)
    with pytest.raises(RuntimeError, match="killed"):
        train(bon, tmp_path / "b")
    assert read_status(tmp_path / "b")["state"] == "crashed"
    monkeypatch.undo()
    resume(tmp_path / "b")
    full, resumed = (read_metrics(tmp_path / name, deterministic=True) for name in ("a", "b"))
    assert [r["step"] for r in full if "bon/n" in r] == [1, 2, 4] and any("warm_start/update" in r for r in full)
    assert resumed == full  # the warm start and every n, each once
    assert read_status(tmp_path / "b")["state"] == "finished"
    assert "starting the run again from step 0" in (tmp_path / "b" / "events.jsonl").read_text()


@pytest.mark.parametrize("kind", ["rm", "dpo"])
def test_reward_model_and_dpo_runs_resume_to_what_an_uninterrupted_run_writes(
    stages: Path, tmp_path: Path, kind: str
) -> None:
    from llm_runs import assert_resume_is_exact

    cfg = _tiny(get_recipe(f"synthetic-{kind}"), 16 * 4, 16 * 2)
    cfg.model.path, cfg.warm_start.updates = str(stages / "sft" / "export"), 0
    cfg.collector.prompts = 8
    if kind == "rm":  # generates its pairs, which a resumed run reads back
        cfg.preferences.prompts, cfg.preferences.heldout_prompts = 32, 16
    else:
        cfg.preferences.path = str(stages / "rm" / "preferences" / "train.jsonl")
        cfg.preferences.heldout_path = str(stages / "rm" / "preferences" / "heldout.jsonl")
        cfg.data.reward_model = str(stages / "rm" / "export")
    records = assert_resume_is_exact(cfg, tmp_path, cut=16 * 2)
    assert any("eval/accuracy" in r for r in records if r["step"] == 16 * 4)


def test_best_of_n_without_a_reward_model_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pickaxe.cli", "train", "synthetic-bon", "--run-dir", str(tmp_path / "r")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "--data.reward-model" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_lora_run_trains_adapters_only_and_shares_its_reference(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    from pickaxe.models.lora import SharedReference
    from pickaxe.train.llm import build_llm_trainer

    cfg = _tiny(get_recipe("arith-grpo"), 32, 32)
    cfg.model.lora.r, cfg.warm_start.updates, cfg.eval.before = 2, 0, False
    cfg.collector.prompts, cfg.collector.group_size = 4, 4
    trainer = build_llm_trainer(cfg)
    assert isinstance(trainer.collector.reference, SharedReference)
    model = trainer.algo.model
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    trainer.fit()
    assert all(p.equal(frozen[n]) for n, p in model.named_parameters() if n in frozen)


def _ppo_args(stages: Path) -> list[str]:
    return [
        "--model.path", str(stages / "sft" / "export"), "--warm-start.updates", "0",
        "--data.reward-model", str(stages / "rm" / "export"), "--collector.prompts", "8",
        "--trainer.total-steps", "64", "--save-every", "16", "--trainer.eval-every", "32",
        "--eval.prompts", "8", "--eval.samples", "2", "--algo.epochs", "2", "--no-progress",
    ]  # fmt: skip


def test_llm_ppo_run_killed_and_resumed_equals_the_uninterrupted_run(stages: Path, tmp_path: Path) -> None:
    import os
    import signal

    from safetensors.torch import load_file

    from pickaxe.runs.run import read_metrics

    cmd = [sys.executable, "-m", "pickaxe.cli"]
    a, b = tmp_path / "a", tmp_path / "b"
    subprocess.run([*cmd, "train", "synthetic-ppo", *_ppo_args(stages), "--run-dir", str(a)], check=True,
                   capture_output=True)  # fmt: skip
    # killed while writing its second checkpoint, then resumed to the end; its frozen models wait on the host
    # between uses (on this CPU nothing moves: the numbers must not change either)
    env = {**os.environ, "PICKAXE_FAULT": "checkpoint-write:2"}
    offload = ["--collector.offload-reward-model", "--collector.offload-reference"]
    proc = subprocess.run([*cmd, "train", "synthetic-ppo", *_ppo_args(stages), *offload, "--run-dir", str(b)],
                          env=env, capture_output=True)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL
    subprocess.run([*cmd, "resume", str(b), "--no-progress"], check=True, capture_output=True)
    ta, tb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert any(k.startswith("critic") for k in ta)  # the critic is part of the run's state
    assert ta.keys() == tb.keys() and all(ta[k].equal(tb[k]) for k in ta)
    ma, mb = read_metrics(a, deterministic=True), read_metrics(b, deterministic=True)
    assert ma == mb and any("eval/reward/gold" in r for r in mb) and any("ppo/explained_variance" in r for r in mb)
    assert "resume is exact" in (b / "events.jsonl").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["synthetic-rm", "--data.gold", "nosuch"], "--data.gold: unknown reward 'nosuch'"),
        (["arith-grpo", "--data.reward", "exact+"], "--data.reward: reward spec 'exact+' ends with '+'"),
        (["synthetic-bon", "--data.reward-model", "/nope"], "--data.reward-model '/nope' does not exist"),
        (["synthetic-dpo", "--preferences.path", "/nope.jsonl"], "preference file '/nope.jsonl' does not exist"),
    ],
)
def test_bad_reward_and_data_flags_fail_before_anything_is_built(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pickaxe.cli import main

    assert main(["train", *args, "--run-dir", str(tmp_path / "r")]) == 2
    out, err = capsys.readouterr()
    assert message in err and len(err.strip().splitlines()) == 1 and "model:" not in out
    assert not (tmp_path / "r").exists()


def test_a_warm_started_ppo_run_against_a_reward_model_builds(stages: Path) -> None:
    from pickaxe.train.llm import build_llm_trainer

    cfg = _tiny(get_recipe("synthetic-ppo"), 8, 8)
    cfg.warm_start.updates, cfg.warm_start.batch_size, cfg.eval.before = 2, 8, False
    cfg.data.reward_model = str(stages / "rm" / "export")
    trainer = build_llm_trainer(cfg)  # the warm start's prompt stream needs no reward model
    assert "proxy" in trainer.collector.env.reward_names


def test_resume_refuses_a_reward_model_that_changed_since_the_run_started(stages: Path, tmp_path: Path) -> None:
    import shutil

    from pickaxe.errors import PickaxeError
    from pickaxe.runs.run import Run
    from pickaxe.train.build import resume
    from pickaxe.train.llm import build_llm_trainer

    rm = shutil.copytree(stages / "rm" / "export", tmp_path / "rm")
    cfg = _tiny(get_recipe("synthetic-ppo"), 16, 16)
    cfg.model.path, cfg.warm_start.updates, cfg.data.reward_model = str(stages / "sft" / "export"), 0, str(rm)
    cfg.collector.prompts, cfg.trainer.save_every = 8, 8
    run = Run(tmp_path / "run", config=cfg.to_dict(), seed=cfg.seed)
    build_llm_trainer(cfg, run).fit(total_steps=8)  # stopped half-way, checkpoint at step 8
    run.close()
    with open(rm / "model.safetensors", "ab") as f:  # someone retrains the reward model in place
        f.write(b"\0")
    with pytest.raises(PickaxeError, match=r"--data.reward-model\) changed since .* started"):
        resume(tmp_path / "run")


def test_changing_one_recipe_config_leaves_every_other_alone() -> None:
    rm = get_recipe("synthetic-rm")
    rm.warm_start.updates, rm.eval.prompts, rm.task.max_len = 0, 1, 9  # a caller edits its config in place
    assert get_recipe("synthetic-sft").trainer.total_steps == 64 * 60
    fresh = get_recipe("synthetic-rm")
    assert (fresh.warm_start.updates, fresh.eval.prompts, fresh.task.max_len) == (60, 256, 5)


def test_a_short_ppo_run_raises_the_proxy_reward(stages: Path) -> None:
    from pickaxe.train.llm import build_llm_trainer

    cfg = _tiny(get_recipe("synthetic-ppo"), 1, 1)
    cfg.model.path, cfg.warm_start.updates, cfg.eval.before = str(stages / "sft" / "export"), 0, False
    cfg.data.reward_model = str(stages / "rm" / "export")
    cfg.algo.lr, cfg.collector.prompts = 3e-3, 32
    trainer = build_llm_trainer(cfg)
    proxy = []
    for _ in range(12):
        batch = trainer.collector.collect()
        proxy.append(float(batch["reward"].mean()))  # the reward model's score of the fresh samples
        trainer.algo.update(batch)
    assert sum(proxy[-3:]) / 3 > sum(proxy[:3]) / 3 + 0.04, proxy  # +0.08 measured: a steady climb


def _one_line_refusal(argv: list[str], run_dir: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``pickaxe train ARGV --run-dir RUN_DIR``; assert it is refused with one line, exit 2, nothing written and
    no model built; return the line."""
    from pickaxe.cli import main

    capsys.readouterr()
    assert main(["train", *argv, "--run-dir", str(run_dir), "--no-progress"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("pickaxe: error: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "model:" not in out and not run_dir.exists()
    return err


def test_a_fresh_ppo_stage_refuses_a_reward_model_with_a_flipped_bit(stages: Path, tmp_path: Path, capsys) -> None:
    rm = shutil.copytree(stages / "rm" / "export", tmp_path / "rm")
    weights = bytearray((rm / "model.safetensors").read_bytes())
    weights[-100] ^= 0x10  # one bit of one weight: the file still loads, and scores a little differently
    (rm / "model.safetensors").write_bytes(bytes(weights))
    argv = ["synthetic-ppo", "--model.path", str(stages / "sft" / "export"), "--warm-start.updates", "0",
            "--data.reward-model", str(rm), "--collector.prompts", "8", "--trainer.total-steps", "8",
            "--eval.prompts", "8", "--eval.samples", "2"]  # fmt: skip
    err = _one_line_refusal(argv, tmp_path / "ppo", capsys)
    assert f"--data.reward-model {rm}: model.safetensors does not match its sha256 in pickaxe_source.json" in err
    assert f"pickaxe export {(stages / 'rm').resolve()}" in err


def _swap_first_label(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[0]["chosen"], rows[0]["rejected"] = rows[0]["rejected"], rows[0]["chosen"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_fresh_dpo_stage_refuses_generated_preferences_with_a_swapped_label(
    stages: Path, tmp_path: Path, capsys
) -> None:
    from pickaxe.envs.text.preferences import verify_preference_digest

    prefs = shutil.copytree(stages / "rm" / "preferences", tmp_path / "preferences")
    assert verify_preference_digest(prefs / "train.jsonl", "--preferences.path")  # the RM run recorded its digest
    size = (prefs / "train.jsonl").stat().st_size
    _swap_first_label(prefs / "train.jsonl")
    assert (prefs / "train.jsonl").stat().st_size == size  # same bytes, other order: only the digest tells
    argv = ["synthetic-dpo", "--model.path", str(stages / "sft" / "export"), "--warm-start.updates", "0",
            "--preferences.path", str(prefs / "train.jsonl"), "--preferences.heldout-path",
            str(prefs / "heldout.jsonl"), "--collector.prompts", "8", "--trainer.total-steps", "8",
            "--eval.prompts", "8", "--eval.samples", "2"]  # fmt: skip
    err = _one_line_refusal(argv, tmp_path / "dpo", capsys)
    manifest = prefs / "MANIFEST.json"
    assert f"--preferences.path {str(prefs / 'train.jsonl')!r} does not match its sha256 in {manifest}" in err
    # the user's own file (no digest recorded beside it) is theirs to edit: accepted, as before
    mine = tmp_path / "mine"
    mine.mkdir()
    shutil.copy(prefs / "train.jsonl", mine / "train.jsonl")
    assert verify_preference_digest(mine / "train.jsonl", "--preferences.path") is False


def test_a_reward_model_run_resumed_with_its_own_preferences_changed_is_refused(stages: Path, tmp_path: Path) -> None:
    from pickaxe.envs.text.prompt_env import DatasetError
    from pickaxe.train.build import resume

    run = shutil.copytree(stages / "rm", tmp_path / "rm")
    assert (run / "checkpoints").is_dir() and (run / "preferences" / "MANIFEST.json").is_file()
    _swap_first_label(run / "preferences" / "train.jsonl")
    with pytest.raises(DatasetError, match=r"train.jsonl' does not match its sha256 in .*MANIFEST.json"):
        resume(run)


def test_a_resume_refuses_when_a_recorded_input_is_gone_or_changed(tmp_path: Path) -> None:
    """``check_inputs`` records the digests of the files a run reads at every start; a resume refuses with one line
    when one of them changed or no longer exists (nothing is loaded), and passes when all are as recorded."""
    from types import SimpleNamespace

    from pickaxe.errors import PickaxeError
    from pickaxe.train.inputs import check_inputs

    rm, pairs = tmp_path / "rm", tmp_path / "pairs.jsonl"
    rm.mkdir()
    (rm / "model.safetensors").write_bytes(b"weights")
    pairs.write_text("{}\n")
    cfg = get_recipe("synthetic-ppo")
    cfg.data.reward_model, cfg.preferences.path = str(rm), str(pairs)
    run = SimpleNamespace(path=tmp_path / "run")
    run.path.mkdir()
    check_inputs(cfg, run, resuming=False)  # type: ignore[arg-type]
    recorded = json.loads((run.path / "inputs.json").read_text())["files"]
    assert set(recorded) == {"data.reward_model", "preferences.path"}
    check_inputs(cfg, run, resuming=True)  # type: ignore[arg-type]  # unchanged: resumes
    pairs.write_text("{} \n")
    with pytest.raises(PickaxeError, match=r"--preferences\.path\) changed since"):
        check_inputs(cfg, run, resuming=True)  # type: ignore[arg-type]
    pairs.write_text("{}\n")
    shutil.rmtree(rm)
    with pytest.raises(PickaxeError, match=r"--data\.reward-model\) changed since .* restore the original"):
        check_inputs(cfg, run, resuming=True)  # type: ignore[arg-type]
    cfg.data.reward_model = None  # the flag dropped on resume: the recorded input is gone just the same
    with pytest.raises(PickaxeError, match=r"--data\.reward-model\) changed since"):
        check_inputs(cfg, run, resuming=True)  # type: ignore[arg-type]
    assert json.loads((run.path / "inputs.json").read_text())["files"] == recorded  # a refusal rewrites nothing
