"""pickaxe from Python: ``pickaxe.load`` acts from a run's folder exactly as the run evaluated, ``pickaxe.train``
checks overrides as the command line checks flags, and the Python LLM path (own JSONL, own reward function, own
local model) trains, resumes exactly and exports."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import pickaxe as px
from pickaxe.errors import ConfigError, PickaxeError
from pickaxe.runs.tracking import read_metrics


def _evals(run_dir: Path, key: str = "eval/return_mean") -> dict[int, float]:
    return {r["step"]: r[key] for r in read_metrics(run_dir) if key in r}


CLASSIC = {
    "ppo": ("cartpole-ppo", {"collector.steps": 256, "trainer.total_steps": 1024, "trainer.eval_every": 512}),
    "dqn": (
        "cartpole-dqn",
        {
            "algo": {"learning_starts": 256, "gradient_steps": 8, "batch_size": 32},
            "trainer.total_steps": 1024,
            "trainer.eval_every": 512,
        },
    ),
    "sac": (
        "pendulum-sac",
        {
            "algo": {"learning_starts": 64, "gradient_steps": 2, "batch_size": 32},
            "trainer.total_steps": 256,
            "trainer.eval_every": 128,
            "trainer.eval_episodes": 2,
            "env.eval_envs": 2,
        },
    ),
}


@pytest.fixture(scope="module")
def classic_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny run of each classic family, shared by the tests below (trained through ``pickaxe.train``)."""
    root = tmp_path_factory.mktemp("classic")
    out = {}
    for name, (recipe, overrides) in CLASSIC.items():
        base = {"trainer.eval_episodes": 4, "env.eval_envs": 2, "trainer.stop_at_target": False, "device": "cpu"}
        run = px.train(recipe, root / name, **{**base, **overrides})
        assert run.path == root / name and run.final is not None and run.best is not None
        out[name] = run.path
    return out


@pytest.mark.parametrize("name", list(CLASSIC))
def test_a_loaded_classic_policy_reproduces_the_runs_own_evaluations(classic_runs: dict[str, Path], name: str) -> None:
    run_dir = classic_runs[name]
    logged = _evals(run_dir)
    assert len(logged) == 2
    for step, value in logged.items():  # every evaluated step, from its kept policy or checkpoint
        assert px.load(run_dir, step).evaluate().mean_return == value
    best = json.loads((run_dir / "selection.json").read_text())["step"]
    assert px.load(run_dir).evaluate().mean_return == logged[best]  # "best" is the default
    final = px.load(run_dir, "final")
    assert final.evaluate().mean_return == logged[max(logged)]
    # act on one observation, in a plain gymnasium loop, gives the numbers of the vectorised evaluation
    from pickaxe.envs.make import make
    from pickaxe.train.evaluate import evaluate

    returns, _ = evaluate(final.module, make(final.config.env.id, 1, 7, evaluation=True), 1)
    assert final.play(episodes=1, seed=7).returns.tolist() == returns.tolist()


def test_act_takes_one_observation_or_a_batch_with_the_runs_normalisation(classic_runs: dict[str, Path]) -> None:
    policy = px.load(classic_runs["ppo"], "final")
    assert policy.config.algo.normalize_obs
    stats = policy.module.obs_norm
    assert float(stats.count) > 1  # the statistics learnt in training came with the weights
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    batch = policy.act(obs)
    assert batch.shape == (5,) and [policy.act(o) for o in obs] == batch.tolist()
    with torch.no_grad():  # the same as the network on normalised observations
        expected, _ = policy.module.inner.act(stats(torch.as_tensor(obs)), deterministic=True)
    assert batch.tolist() == expected.tolist()
    sac = px.load(classic_runs["sac"], "final")
    action = sac.act(np.zeros(3, dtype=np.float32))
    assert action.shape == (1,) and -2.0 <= float(action[0]) <= 2.0
    with pytest.raises(PickaxeError, match=r"one observation of shape \(4,\) or a batch"):
        policy.act(np.zeros(3))


def test_a_discrete_observation_is_flattened_as_in_training(tmp_path: Path) -> None:
    run = px.train("cartpole-ppo", tmp_path / "lake", device="cpu", env={"id": "FrozenLake-v1", "eval_envs": 2},
                   trainer={"total_steps": 256, "eval_every": 256, "eval_episodes": 2})  # fmt: skip
    policy = run.load("final")
    one_hot = np.eye(16, dtype=np.float32)
    assert [policy.act(s) for s in range(16)] == policy.act(one_hot).tolist() == policy.act(list(range(16))).tolist()
    assert policy.play(episodes=2).lengths.shape == (2,)


def test_load_refuses_a_bad_folder_or_checkpoint_in_one_line(classic_runs: dict[str, Path], tmp_path: Path) -> None:
    good = classic_runs["ppo"]
    (tmp_path / "empty").mkdir()
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "config.json").write_text('{"name": "not pickaxe"}')
    (tmp_path / "file").write_text("x")
    cases = [
        (tmp_path / "nope", "", "does not exist"),
        (tmp_path / "file", "", "is a file"),
        (tmp_path / "empty", "", "is not a pickaxe run folder: it has no config.json"),
        (tmp_path / "foreign", "", "is not a pickaxe run folder"),
        (good, "newest", "must be final, latest, best or an env step"),
        (good, 999, "no checkpoint at env step 999; kept checkpoints: 512, 1024"),
    ]
    for folder, checkpoint, message in cases:
        with pytest.raises(PickaxeError, match=message) as info:
            px.load(folder, checkpoint or "best")
        assert "\n" not in str(info.value)
    damaged = tmp_path / "damaged"
    shutil.copytree(good, damaged)
    weights = damaged / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(PickaxeError, match=r"model\.safetensors") as info:
        px.load(damaged, "final")
    assert "sha256" in str(info.value) and "\n" not in str(info.value)


def test_train_checks_overrides_as_the_command_line_does(tmp_path: Path) -> None:
    from pickaxe.api import configure

    cfg = configure("cartpole-ppo", seed=3, algo={"lr": 1e-3}, algo__epochs=2, **{"trainer.total_steps": 512})
    assert (cfg.seed, cfg.algo.lr, cfg.algo.epochs, cfg.trainer.total_steps) == (3, 1e-3, 2, 512)
    assert configure(cfg, env={"kwargs": {"max_episode_steps": 50}}).env.kwargs == {"max_episode_steps": 50}
    assert cfg.env.kwargs == {}  # the config passed in is not changed
    bad = [
        ({"algo": {"lrr": 1e-3}}, r"unknown config key --algo\.lrr; did you mean --algo\.lr\?"),
        ({"algo": {"lr": -1}}, r"--algo\.lr must be > 0"),
        ({"trainer.total_steps": "many"}, "trainer.total-steps"),
        ({"rewards": len}, "rewards= is for LLM runs"),
    ]
    for overrides, message in bad:
        with pytest.raises(ConfigError, match=message):
            px.train("cartpole-ppo", tmp_path / "never", **overrides)
    with pytest.raises(ConfigError, match=r"pickaxe\.train takes a recipe name"):
        px.train(42, tmp_path / "never")
    assert not (tmp_path / "never").exists()  # refused before the folder was made


def test_import_pickaxe_stays_torch_free_and_train_is_callable() -> None:
    code = "import sys, pickaxe as px; px.load; px.resume; assert callable(px.train); assert 'torch' not in sys.modules"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert px.train.TrainConfig.__name__ == "TrainConfig"  # still the package of the training code


# ---------------------------------------------------------------------------------------------- the LLM path


def digit_share(prompt: str, completion: str, metadata: dict[str, Any]) -> float:
    """A user's reward: the share of the completion's characters that are digits."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


def _llm_inputs(root: Path) -> tuple[Path, Path, Path]:
    """A tiny model built from a config and saved to a local folder, and train/held-out prompt files."""
    from pickaxe.models.lm import tiny_lm
    from pickaxe.models.tokenizer import char_tokenizer

    tok = char_tokenizer(model_max_length=64)
    model = tiny_lm(len(tok), hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64, max_positions=64,
                    pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    rng = random.Random(0)
    files = []
    for name, n in (("train.jsonl", 64), ("eval.jsonl", 8)):
        rows = [(rng.randint(0, 9), rng.randint(0, 9)) for _ in range(n)]
        (root / name).write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                                         for a, b in rows))  # fmt: skip
        files.append(root / name)
    return root / "model", files[0], files[1]


def _llm_config(model: Path, data: Path, heldout: Path) -> Any:
    from pickaxe.algos.configs import GRPOConfig
    from pickaxe.train.config import TrainerConfig
    from pickaxe.train.llm_config import (
        DataConfig,
        EngineConfig,
        LLMEvalConfig,
        LLMTrainConfig,
        LMConfig,
        TextCollectorConfig,
    )

    return LLMTrainConfig(
        algo=GRPOConfig(lr=1e-3, micro_batch_size=16),
        model=LMConfig(path=str(model)),
        data=DataConfig(path=str(data), eval_path=str(heldout)),
        engine=EngineConfig(max_new_tokens=4),
        collector=TextCollectorConfig(prompts=4, group_size=4),
        eval=LLMEvalConfig(prompts=8, samples=0),
        trainer=TrainerConfig(total_steps=32, eval_every=16),
        device="cpu",
    )


def test_the_python_llm_path_trains_resumes_exactly_exports_and_loads(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from pickaxe.envs.text.rewards import supplied_rewards
    from pickaxe.models.export import verify_export
    from pickaxe.runs.run import Run
    from pickaxe.supplied import MissingObjectError
    from pickaxe.train.llm_runs import build_llm_run

    def lively(prompt: str, completion: str, metadata: dict[str, Any]) -> float:  # not importable: local
        return float(len(set(completion)))

    model, data, heldout = _llm_inputs(tmp_path)
    cfg = _llm_config(model, data, heldout)
    rewards = {"digits": digit_share, "lively": lively}
    full = px.train(cfg, tmp_path / "full", rewards=rewards, **{"data.reward": "digits+0.1*lively"})
    recorded = json.loads((tmp_path / "full" / "config.json").read_text())["data"]
    assert recorded["reward"] == "digits+0.1*lively"
    assert recorded["python_rewards"] == [
        "digits=test_python_api:digit_share",
        "lively=test_python_api:test_the_python_llm_path_trains_resumes_exactly_exports_and_loads.<locals>.lively",
    ]
    assert full.steps == 32 and set(_evals(full.path)) == {0, 16, 32}
    assert verify_export(full.path / "export", "export") is not None

    # the same run stopped at step 16 (its checkpoint) and resumed from Python
    from pickaxe.api import configure

    cut_cfg = configure(cfg, rewards=rewards, **{"data.reward": "digits+0.1*lively"})
    with supplied_rewards(rewards):
        run = Run(tmp_path / "cut", config=cut_cfg.to_dict(), seed=cut_cfg.seed)
        trainer = build_llm_run(cut_cfg, run)
        trainer.fit(total_steps=16)
        trainer.close()
        run.close()
    status = (tmp_path / "cut" / "status.json").read_bytes()
    with pytest.raises(MissingObjectError, match=r"reward 'lively' is the Python object .*lively passed to") as e:
        px.resume(tmp_path / "cut", rewards={"digits": digit_share})  # digit_share alone would import by its path
    assert "rewards={'lively': lively}" in str(e.value)
    here = str(Path(__file__).parent)  # digit_share imports by its path, as from a user's package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    cli = subprocess.run([sys.executable, "-m", "pickaxe.cli", "resume", str(tmp_path / "cut")],
                         capture_output=True, text=True, env=env)  # fmt: skip
    assert cli.returncode == 2 and "reward 'lively' is the Python object" in cli.stderr, cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1
    assert (tmp_path / "cut" / "status.json").read_bytes() == status  # refused before anything was built
    resumed = px.resume(tmp_path / "cut", rewards={"lively": lively})
    assert resumed.steps == 32 and resumed.final == full.final
    a, b = (load_file(str(tmp_path / n / "model.safetensors")) for n in ("full", "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert read_metrics(tmp_path / "full", deterministic=True) == read_metrics(tmp_path / "cut", deterministic=True)
    assert verify_export(tmp_path / "cut" / "export", "export") is not None

    # load: greedy completions of the held-out prompts are the run's own, and score what it logged
    from pickaxe.rollout.engines.base import SamplingParams
    from pickaxe.rollout.text_collector import completion_text
    from pickaxe.runs.model import load_model
    from pickaxe.train.llm import run_evaluator

    prompts = [json.loads(line)["prompt"] for line in heldout.read_text().splitlines()]
    logged = _evals(full.path)
    for step in (16, "final"):
        policy = px.load(full.path, step)
        texts = [g.text for g in policy.generate(prompts)]
        with supplied_rewards(rewards):  # the evaluator scores with the run's rewards
            net, _, evaluator, device = run_evaluator(policy.config, full.path)
        load_model(full.path, {"policy": net}, device, checkpoint=step)
        own = evaluator.engine.generate(evaluator.prompt_ids, SamplingParams(4, temperature=0.0))
        tok = evaluator.tokenizer
        assert texts == [completion_text(tok, c.token_ids, tok.eos_token_id) for c in own]
        scores = [digit_share(p, t, {}) + 0.1 * lively(p, t, {}) for p, t in zip(prompts, texts, strict=True)]
        assert float(np.mean(scores)) == pytest.approx(logged[32 if step == "final" else step], rel=1e-12)
    assert policy.generate(prompts[0]).text == texts[0]  # one prompt, one Generation


class Echo:
    """A user-written tool (importable: a resume in another process finds it by its path)."""

    name = "echo"
    description = "Says its text back."

    def __init__(self) -> None:
        self.parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    def __call__(self, arguments: dict[str, Any]) -> Any:
        from pickaxe.envs.agents.tools import ToolResult

        return ToolResult(str(arguments["text"]), True)


def test_own_tools_are_recorded_by_name_and_found_again() -> None:
    from pickaxe.api import configure
    from pickaxe.envs.agents.tools import make_tools, python_tools, supplied_tools
    from pickaxe.supplied import MissingObjectError

    cfg = configure("calc-agent-grpo", tools=[Echo()])
    assert cfg.agent.tools == ("calculator", "echo") and cfg.agent.python_tools == ("echo=test_python_api:Echo",)
    cfg.check_more()  # "echo" is a tool of this run
    found = python_tools(cfg.agent.python_tools)  # imported by its path and instantiated
    assert isinstance(found["echo"], Echo)
    with make_tools(cfg.agent.tools, extra=found) as box:
        assert box.call("echo", '{"text": "hi"}').text == "hi" and not box.call("echo", {}).ok
    local = type("Local", (Echo,), {"__qualname__": "f.<locals>.Local"})()
    record = configure("calc-agent-grpo", tools={"echo": local}).agent.python_tools
    with pytest.raises(MissingObjectError, match=r"tool 'echo' is the Python object .* pass it again: pickaxe\.resume"):
        python_tools(record)
    with supplied_tools({"echo": local}):
        assert python_tools(record)["echo"] is local
    with pytest.raises(ConfigError, match=r"tools: .* is not a tool: it needs name, description, parameters"):
        configure("calc-agent-grpo", tools=[len])
    with pytest.raises(ConfigError, match=r"unknown tool 'echoo'; choose from calculator, lookup, python, echo"):
        configure("calc-agent-grpo", tools=[Echo()], **{"agent.tools": ("echoo",)}).check_more()


def test_a_recurrent_policy_acts_with_its_memory_and_reproduces_its_evaluation(tmp_path: Path) -> None:
    """A recurrent policy loaded from its folder carries its LSTM state from ``act`` to ``act`` within an episode
    (``play`` resets it between episodes) and gives the run's logged evaluation and the vectorised evaluation."""
    overrides = {"trainer.total_steps": 1024, "trainer.eval_every": 512, "trainer.eval_episodes": 2}
    run = px.train("memory-recurrent-ppo", tmp_path / "r", device="cpu", **{"env.eval_envs": 2}, **overrides)
    logged = _evals(run.path)
    final = px.load(run.path, "final")
    assert final.evaluate().mean_return == logged[max(logged)]
    from pickaxe.envs.make import make
    from pickaxe.train.evaluate import evaluate

    returns, _ = evaluate(final.module, make(final.config.env.id, 1, 7, evaluation=True), 1)
    assert final.play(episodes=1, seed=7).returns.tolist() == returns.tolist()
    obs = np.zeros(final.observation_space.shape, dtype=np.float32)
    final.reset()
    first = final.act(obs)
    assert final._state is not None  # the memory after one step is kept for the next
    final.reset()
    assert final.act(obs) == first  # reset: the same first step again


PREFERENCE_RUN = """
import sys
sys.path.insert(0, {tests!r})
import pickaxe as px
from test_python_api import digit_share
px.train({recipe!r}, {run!r}, rewards=[digit_share] if {reward} else None, **{overrides!r})
"""


@pytest.mark.parametrize("recipe", ["synthetic-dpo", "synthetic-rm"])
def test_preference_runs_from_python_resume_exactly_and_export(tmp_path: Path, recipe: str) -> None:
    """DPO and a reward model trained from Python on a user's preference file and local model (DPO evaluated with
    a Python reward): SIGKILLed after an update and resumed with ``pickaxe.resume``, each ends with the metrics and
    weights of the run that was never stopped, and exports."""
    from safetensors.torch import load_file

    from pickaxe.models.export import verify_export

    model, _, heldout = _llm_inputs(tmp_path)
    rng = random.Random(1)
    with open(tmp_path / "pairs.jsonl", "w") as f:
        for _ in range(64):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            wrong = str(a + b + rng.choice([-2, -1, 1, 2]))
            f.write(json.dumps({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": wrong}) + "\n")
    overrides = {"model.path": str(model), "warm_start.updates": 0, "data.gold": None, "device": "cpu",
                 "preferences.path": str(tmp_path / "pairs.jsonl"), "trainer.total_steps": 96,
                 "trainer.eval_every": 32, "collector.prompts": 16, "algo.lr": 1e-3}  # fmt: skip
    dpo = recipe == "synthetic-dpo"
    if dpo:
        overrides.update({"data.path": str(heldout), "eval.prompts": 8, "eval.samples": 0})
    full = px.train(recipe, tmp_path / "full", rewards=[digit_share] if dpo else None, **overrides)
    script = PREFERENCE_RUN.format(tests=str(Path(__file__).parent), recipe=recipe, run=str(tmp_path / "cut"),
                                   reward=dpo, overrides=overrides)  # fmt: skip
    env = {**os.environ, "PICKAXE_FAULT": "iteration:2"}
    killed = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = px.resume(tmp_path / "cut")  # digit_share is found again by its recorded path
    assert resumed.steps == full.steps == 96 and resumed.final == full.final
    assert read_metrics(tmp_path / "full", deterministic=True) == read_metrics(tmp_path / "cut", deterministic=True)
    a, b = (load_file(str(tmp_path / n / "model.safetensors")) for n in ("full", "cut"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert verify_export(tmp_path / "cut" / "export", "export") is not None
