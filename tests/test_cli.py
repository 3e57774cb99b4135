"""The pickaxe CLI: a working train/eval round trip, and one clear line for every user error."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pickaxe.cli import main


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pickaxe: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_train_then_eval_round_trip(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "run"
    argv = [
        "train", "cartpole-ppo", "--trainer.total-steps", "6144", "--trainer.eval-every", "3072", "--run-dir",
        str(run_dir), "--no-progress", "--seed", "0", "--algo.ent-coef", "0.001", "--model.hidden", "64", "64",
        "--env.num_envs", "8", "--trainer.log-every", "1024", "--trainer.stop-at-target", "False",
    ]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 6144 and summary["run_dir"] == str(run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["seed"] == 0 and config["algo"]["ent_coef"] == 0.001 and config["model"]["hidden"] == [64, 64]
    assert config["env"]["num_envs"] == 8 and config["trainer"]["log_every"] == 1024 and config["algo_name"] == "ppo"
    # it learned: the deterministic policy of an untrained network balances the pole for ~10 steps
    records = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval/return_mean"] for r in records if "eval/return_mean" in r]
    assert len(evals) == 2 and evals[-1] >= 150 and summary["eval_return"] == evals[-1]
    # `pickaxe eval` with the run's own settings reproduces the run's last evaluation from the saved model
    assert main(["eval", str(run_dir)]) == 0
    out = json.loads(capsys.readouterr().out.strip())
    assert out["episodes"] == 10 and out["checkpoint"] == "final"
    assert out["return_mean"] == pytest.approx(evals[-1])
    # --checkpoint is --checkpoints with one value: a table, and the report with the run's settings but 3 episodes
    assert main(["eval", str(run_dir), "--episodes", "3", "--checkpoint", "latest"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["step", "source", "eval/return_mean"] and table[1].split()[:2] == ["6144", "*"]
    report = json.loads((run_dir / "eval" / "checkpoints.json").read_text())
    assert report["settings"]["episodes"] == 3 and [r["step"] for r in report["rows"]] == [6144]


def test_recipes_lists_one_line_each(capsys) -> None:
    from pickaxe.recipes import RECIPES

    assert main(["recipes"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == list(RECIPES)
    assert {"cartpole-ppo", "cartpole-dqn", "pendulum-sac", "cartpole-rainbow", "arith-grpo"} <= set(RECIPES)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train", "cartpole-pp"], "unknown recipe 'cartpole-pp'; did you mean 'cartpole-ppo'"),
        (["train", "cartpole-ppo", "--algo.lrr", "3"], "unknown config key --algo.lrr; did you mean --algo.lr?"),
        (["train", "cartpole-ppo", "--algo.epoch", "3"], "did you mean --algo.epochs?"),
        (["train", "cartpole-ppo", "--algo.lr", "fast"], "--algo.lr takes float, got 'fast'"),
        (["train", "cartpole-ppo", "--seed", "1.5"], "--seed takes int, got '1.5'"),
        (["train", "pendulum-sac", "--algo.alpha", "foo"], "--algo.alpha takes float or auto, got 'foo'"),
        (["train", "cartpole-ppo", "--algo.lr-schedule", "cosine"], "must be one of constant, linear"),
        (
            ["train", "cartpole-ppo", "--env.id", "CartPol-v1"],
            "unknown environment id 'CartPol-v1'; did you mean 'CartPole-v1'",
        ),
        (["train"], "needs a recipe name"),
        (["trian", "cartpole-ppo"], "unknown command 'trian'; did you mean 'train'?"),
        (["eval", "/nonexistent/run"], "is not a run directory"),
        (["eval"], "pickaxe eval needs a run directory first"),
        (["resume", "--no-progress"], "pickaxe resume needs a run directory first"),
        (["set", "RUN"], "usage: pickaxe set RUN_DIR KEY=VALUE"),
        (["eval", "RUN", "--checkpoint", "newest"], "--checkpoint must be final, best, latest or an env step"),
        (["compare", "RUN", "--metrc", "x"], "did you mean --metric?"),
        (["queue", "list", "--stat", "failed"], "did you mean --state?"),
        (["worker", "--slots", "0"], "--slots must be >= 1, got 0"),
        (["sweep", "cartpole-ppo", "--seeds", "0", "--algo.lr", "1e-3,3e-4"], "--seeds must be >= 1, got 0"),
    ],
)
def test_user_errors_are_one_clear_line(capsys, tmp_path: Path, argv: list[str], expected: str) -> None:
    argv = [a.replace("RUN", str(tmp_path)) for a in argv]
    assert expected in _error(capsys, argv)


def test_unknown_env_creates_no_run_directory(capsys, tmp_path: Path) -> None:
    _error(capsys, ["train", "cartpole-ppo", "--env.id", "Nope-v0", "--run-dir", str(tmp_path / "r")])
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_gpu_is_a_clear_error(capsys) -> None:
    assert "torch sees no GPU" in _error(capsys, ["train", "cartpole-ppo", "--device", "cuda"])


def test_installed_command_exits_2_without_traceback() -> None:
    proc = subprocess.run([sys.executable, "-m", "pickaxe.cli", "train", "cartpole-pp"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "pickaxe: error: unknown recipe 'cartpole-pp'; did you mean 'cartpole-ppo'? (`pickaxe recipes` lists all)"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--help"],
        ["resume", "--help"],
        ["eval", "--help"],
        ["set", "--help"],
        ["runs", "--help"],
        ["sweep", "--help"],
        ["sweep", "cartpole-ppo", "--algo.lr", "1e-3,3e-4", "--help"],
        ["compare", "--help"],
        ["queue", "--help"],
        ["queue", "add", "--help"],
        ["queue", "list", "--help"],
        ["queue", "cancel", "--help"],
        ["queue", "retry", "--help"],
        ["worker", "--help"],
        ["recipes", "--help"],
    ],
)
def test_every_subcommand_has_help(capsys, argv: list[str]) -> None:
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "usage: pickaxe" in captured.out and not captured.err


def test_train_help_lists_config_keys_and_run_options(capsys) -> None:
    assert main(["train", "cartpole-ppo", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--algo.lr", "--env.kwargs", "--run-dir", "--save-every", "--max-restarts", "--no-progress",
                 "--track", "--prometheus-port", "--overwrite"):  # fmt: skip
        assert flag in out, flag


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["pipeline", "--help"], ["--pipeline-dir STR", "--workers INT", "--gpus INT"]),
        (["export", "--help"], ["--out STR"]),
        (["ui", "--help"], ["--queue-db STR"]),
        (["eval", "--help"], ["--episodes INT"]),
        (["queue", "list", "--help"], ["--state [STR [STR ...]]", "--db STR"]),
        (["train", "arith-grpo", "--help"], ["--run-dir STR", "--algo.tis-cap FLOAT"]),
    ],
)
def test_optional_options_show_their_value_not_none(capsys, argv: list[str], shown: list[str]) -> None:
    # tyro shows `X | None` as `{None}|STR`; the help shows the value an option takes
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "{None}" not in out
    for text in shown:
        assert text in out, text


def test_help_shows_each_docstring_paragraph_as_flowing_text(capsys, monkeypatch) -> None:
    from pickaxe.argparsing import reflow

    text = """First line, then
        (a continuation opening with a bracket) and ``code``

        Second paragraph:
        - one item
          that wraps
        - another"""
    want = "First line, then (a continuation opening with a bracket) and ``code``\n\n"
    assert reflow(text) == want + "Second paragraph:\n- one item that wraps\n- another"
    monkeypatch.setenv("COLUMNS", "80")  # one column of options
    assert main(["train", "arith-grpo", "--help"]) == 0
    out = capsys.readouterr().out
    # --dist.shard's docstring breaks its source line after "they are": the help fills its lines across it
    assert "fsdp: they are sharded across the learners" in out


def test_an_optional_option_still_takes_none_where_its_help_offers_it() -> None:
    from pickaxe.argparsing import parse
    from pickaxe.exp.queue_cli import ListArgs
    from pickaxe.recipes.args import parse_train

    assert parse(ListArgs, ["--state", "queued", "running"], "q").state == ("queued", "running")
    assert parse(ListArgs, ["--state", "None"], "q").state is None
    assert parse_train("cartpole-ppo", ["--algo.value-clip", "None"])[0].algo.value_clip is None
    assert parse_train("cartpole-ppo", ["--algo.value-clip", "0.3"])[0].algo.value_clip == 0.3


def test_version(capsys) -> None:
    from importlib.metadata import version

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"pickaxe {version('pickaxe')}"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--algo.lr", "-1"], "--algo.lr must be > 0"),
        (["--algo.epochs", "0"], "--algo.epochs must be >= 1"),
        (["--trainer.total-steps", "0"], "--trainer.total-steps must be >= 1"),
        (["--device", "tpu"], "--device must be one of auto, cpu, cuda"),
        (["--collector.steps", "100"], "collector.steps (100) must be a multiple of env.num_envs (8)"),
        (["--model.hidden", "64", "0"], "--model.hidden must be >= 1"),
        (["--max-restarts", "-1"], "--max-restarts must be >= 0"),
        (["--prometheus-port", "70000"], "--prometheus-port must be >= 1 and <= 65535"),
        (["--save-every", "-5"], "--save-every must be >= 0"),
        (["--track", "tensorboardx"], "tensorboardx"),
        (["--env.kwargs", "[1, 2]"], "--env.kwargs takes a JSON object"),
        (["--env.kwargs", "{bad"], "--env.kwargs takes a JSON object"),
        (["--env.id", "no_such_module_xyz:Env-v0"], "cannot import module 'no_such_module_xyz'"),
        (["--algo.normalize-advantage", "maybe"], "--algo.normalize-advantage takes True or False"),
        (["--select.rule", "nope"], "--select.rule"),
        (["--select.mode", "best"], "--select.mode"),
    ],
)
def test_bad_values_are_one_line_and_write_nothing(capsys, tmp_path: Path, flags: list[str], expected: str) -> None:
    run_dir = tmp_path / "r"
    err = _error(capsys, ["train", "cartpole-ppo", *flags, "--run-dir", str(run_dir), "--no-progress"])
    assert expected in err
    assert not run_dir.exists() and list(tmp_path.iterdir()) == []


_NO_TORCH = """
import json, sys
from pathlib import Path
from pickaxe.cli import main

def check(argv):
    code = main(argv)
    assert code == 0, (argv, code)
    assert "torch" not in sys.modules, f"pickaxe {' '.join(argv)} imported torch"

root = Path(sys.argv[1])
run = root / "runs" / "a"
run.mkdir(parents=True)
from pickaxe.recipes import get_recipe
(run / "config.json").write_text(json.dumps(get_recipe("cartpole-ppo").to_dict()))
(run / "metrics.jsonl").write_text(json.dumps({"step": 100, "eval/return_mean": 10.0}) + "\\n")
for argv in (["--help"], ["--version"], ["recipes"], ["algos"], ["algos", "grpo"], ["train", "cartpole-ppo", "--help"],
             ["sweep", "--help"],
             ["resume", "--help"], ["eval", "--help"], ["worker", "--help"], ["train", "--help"],
             ["set", str(run), "algo.lr=1e-4"], ["queue", "list", "--db", str(root / "q.db")],
             ["queue", "add", "--db", str(root / "q.db"), "--", "pickaxe", "train", "cartpole-ppo"],
             ["compare", str(root / "runs"), "--out", str(root / "cmp")], ["runs", str(root / "runs")]):
    check(argv)
print("ok")
"""


def test_commands_that_do_not_train_never_import_torch(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


_ENV_MODULE = '''
import json, os
import gymnasium as gym
import numpy as np


class CountEnv(gym.Env):
    """Observation: steps so far; an episode lasts `length` steps; reward 1 per step."""

    def __init__(self, length=5):
        self.length = length
        self.observation_space = gym.spaces.Box(0, 1000, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        with open(os.environ["ENV_LOG"], "a") as f:
            f.write(json.dumps({"length": length}) + "\\n")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(1, self.t, np.float32), 1.0, self.t >= self.length, False, {}


gym.register("CountEnv-v0", entry_point=CountEnv)
'''


def test_custom_env_module_and_kwargs(tmp_path: Path) -> None:
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "envs.py").write_text(_ENV_MODULE)
    log, run_dir = tmp_path / "env.log", tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "ENV_LOG": str(log)}
    head = [sys.executable, "-m", "pickaxe.cli", "train", "cartpole-ppo", "--env.id", "my_pkg.envs:CountEnv-v0"]
    tail = [
        "--env.num-envs", "2", "--env.eval-envs", "2", "--collector.steps", "64", "--trainer.total-steps", "128",
        "--trainer.eval-every", "128", "--trainer.eval-episodes", "2", "--no-progress", "--device", "cpu",
    ]  # fmt: skip
    train = [*head, "--env.kwargs", '{"length": 7}', *tail, "--run-dir", str(run_dir)]
    proc = subprocess.run(train, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["env"]["id"] == "my_pkg.envs:CountEnv-v0" and config["env"]["kwargs"] == {"length": 7}
    made = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert made and all(m == {"length": 7} for m in made)  # training and eval envs got the kwargs
    assert json.loads(proc.stdout.strip().splitlines()[-1])["eval_return"] == 7.0  # episodes of 7 steps
    log.unlink()
    proc = subprocess.run([sys.executable, "-m", "pickaxe.cli", "eval", str(run_dir)], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["return_mean"] == 7.0
    assert all(json.loads(ln) == {"length": 7} for ln in log.read_text().splitlines())
    # one key at a time, and a bad keyword is one line
    bad = [*head, "--env.kwargs.colour", '"red"', *tail, "--run-dir", str(tmp_path / "r3")]
    proc = subprocess.run(bad, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2 and "colour" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1
    from pickaxe.recipes.args import parse_train

    cfg, _ = parse_train("cartpole-ppo", ["--env.kwargs.length", "3", "--env.kwargs.name", "x"])
    assert cfg.env.kwargs == {"length": 3, "name": "x"}


def test_nothing_below_the_cli_imports_it() -> None:
    import ast

    import pickaxe

    root = Path(pickaxe.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "cli.py" and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(n == "pickaxe.cli" or n.startswith("pickaxe.cli.") for n in names):
                offenders.append(str(path.relative_to(root)))
    assert offenders == []  # the queue and sweeps check `pickaxe train` commands through pickaxe.recipes.args


@pytest.mark.parametrize(("statuses", "expected", "runs"), [([130], 130, 1), ([-9, 0], 0, 2), ([2], 2, 1)])
def test_supervisor_restarts_crashes_but_not_a_user_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, statuses: list[int], expected: int, runs: int
) -> None:
    import pickaxe.cli as cli

    started: list[list[str]] = []

    class FakeChild:
        def __init__(self, command: list[str]) -> None:
            started.append(command)

        def wait(self) -> int:
            return statuses[len(started) - 1]

    monkeypatch.setattr(subprocess, "Popen", FakeChild)
    assert cli._supervise(["cartpole-ppo"], tmp_path / "run", max_restarts=3, no_progress=True) == expected
    assert len(started) == runs  # an interrupted run (130: checkpointed on Ctrl-C/SIGTERM) is not restarted
    if runs > 1:
        assert started[1] == [sys.executable, "-m", "pickaxe.cli", "resume", str(tmp_path / "run"), "--restart",
                              "--no-progress"]  # fmt: skip


def test_supervisor_forwards_sigterm_to_its_child_and_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    import pickaxe.cli as cli

    received: list[int] = []

    class FakeChild:
        def __init__(self, command: list[str]) -> None:
            pass

        def send_signal(self, signum: int) -> None:
            received.append(signum)

        def wait(self) -> int:
            os.kill(os.getpid(), signal.SIGTERM)  # e.g. a cluster scheduler ending the job
            return 130 if received else -9  # the child checkpointed on the forwarded SIGTERM

    monkeypatch.setattr(subprocess, "Popen", FakeChild)
    before = signal.getsignal(signal.SIGTERM)
    assert cli._supervise(["cartpole-ppo"], tmp_path / "run", max_restarts=3, no_progress=True) == 130
    assert received == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is before  # the supervisor's handler is gone afterwards


def test_a_cross_field_check_is_its_own_line_without_the_parser_prefix(capsys, tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    flags = ["--alarms.length-min", "10", "--alarms.length-max", "5", "--run-dir", str(run_dir)]
    err = _error(capsys, ["train", "arith-grpo", *flags])
    assert "--alarms.length-min (10.0) must be below --alarms.length-max (5.0)" in err
    assert "Value error" not in err and "Error parsing" not in err and not run_dir.exists()


def test_a_repeated_tuple_flag_gathers_its_values() -> None:
    from pickaxe.argparsing import merge_repeated

    argv = ["RUN", "--checkpoints", "100", "200", "--episodes", "5", "--checkpoints=final", "--checkpoints", "best"]
    assert merge_repeated(argv, "--checkpoints") == ["RUN", "--episodes", "5", "--checkpoints", "100", "200", "final",
                                                     "best"]  # fmt: skip
    assert merge_repeated(["RUN", "--episodes", "5"], "--checkpoints") == ["RUN", "--episodes", "5"]


def test_algos_lists_every_algorithm_with_its_recipes(capsys) -> None:
    from pickaxe.train.config import TrainConfig
    from pickaxe.train.llm_config import LLMTrainConfig

    assert main(["algos"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [ln.split()[:3] for ln in lines if not ln.lstrip().startswith("recipes:")]
    expected = [["classic", n, t.__name__] for n, t in TrainConfig.ALGOS.items()]
    expected += [["llm", n, t.__name__] for n, t in LLMTrainConfig.ALGOS.items()]
    assert rows == expected
    used = {ln.split("recipes:")[1].strip() for ln in lines if "recipes:" in ln}
    assert any(u.startswith("cartpole-ppo") for u in used) and any(u.startswith("cartpole-dqn") for u in used)


@pytest.mark.parametrize("args", [["algos"], ["algos", "a2c"]])  # more, and less, than the stdout buffer holds
def test_a_reader_that_leaves_early_gets_no_traceback(args: list[str]) -> None:
    # `pickaxe algos | head -1`: the pipe's read end is closed before the listing is written
    proc = subprocess.Popen(
        [sys.executable, "-m", "pickaxe.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_algos_name_prints_its_keys_and_a_bad_name_is_one_line(capsys) -> None:
    assert main(["algos", "dqn", "--kind", "classic"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("dqn (classic, DQNConfig): ") and out[1].startswith("  recipes: cartpole-dqn, ")
    assert "  --algo.gamma 0.99" in out and "  --algo.double True" in out
    assert main(["algos", "dqm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["pickaxe: error: unknown algorithm 'dqm'; did you mean 'dqn'? (`pickaxe algos` lists all)"]
