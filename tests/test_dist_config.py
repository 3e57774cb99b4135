"""``--dist.*`` values are checked before a run folder exists: one line naming the fix, before Ray is asked to
join anything (Ray retries an absent cluster for minutes)."""

import socket
from pathlib import Path

import pytest

from pickaxe.cli import main
from pickaxe.errors import ConfigError
from pickaxe.train.config import DistConfig, check_ray_address


def _closed_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_ray_address_fails_before_joining_ray_and_leaves_no_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: joining an address where no Ray listens waited minutes (Ray retries) with a run folder made.
    Now the address is refused before ``ray.init`` is ever called."""
    ray = pytest.importorskip("ray")

    def join(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"ray.init was called ({kwargs}): the address should have been refused before")

    monkeypatch.setattr(ray, "init", join)
    port = _closed_port()
    args = ["train", "cartpole-ppo", "--dist.placement", "separate", "--dist.address", f"127.0.0.1:{port}"]
    assert main([*args, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no Ray cluster answers there" in err[0] and "ray start --head" in err[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("address", ["nonsense", "host:", ":80", "ray://host:port"])
def test_a_malformed_ray_address_is_named(address: str) -> None:
    with pytest.raises(ConfigError, match="is not a Ray address: use auto, HOST:PORT or ray://HOST:PORT"):
        check_ray_address(address, "--dist.address")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mode": "pipelined"}, "--dist.mode pipelined needs rollout workers: add --dist.placement separate"),
        ({"workers": 2}, "--dist.workers 2 needs rollout workers: add --dist.placement separate"),
        ({"address": "auto"}, "--dist.address joins a Ray cluster for workers: add --dist.placement separate"),
    ],
)
def test_worker_options_need_separate_placement(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DistConfig(**fields).check(llm=True)


def test_starting_ray_prints_no_notice_of_its_own(tmp_path: Path) -> None:
    """Regression: a local Ray announced "Token authentication is enabled for this Ray cluster..." on stderr."""
    import os
    import subprocess
    import sys

    code = (
        "from pickaxe.dist.runtime import ensure_ray\n"
        "ray = ensure_ray(None, num_cpus=1)\n"
        "print(ray.get(ray.put(41)) + 1)\n"
        "ray.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {"HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "42"
    assert "Token authentication" not in proc.stderr and "RAY_AUTH_MODE" not in proc.stderr, proc.stderr
    assert (tmp_path / ".ray" / "auth_token").is_file()  # authentication is on, as Ray chose it


# ------------------------------------------------------------------------------ dist helpers, in process (no Ray)
def test_published_weights_are_the_trainable_tensors_only() -> None:
    import torch

    from pickaxe.dist.llm_engines import full_weights, trainable_weights

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    model[0].requires_grad_(False)  # frozen: the worker keeps its own copy
    assert set(trainable_weights(model)) == {"1.weight", "1.bias"}
    assert set(full_weights(model)) == {"0.weight", "0.bias", "1.weight", "1.bias"}


def test_the_weight_board_keeps_the_newest_version_and_workers_never_go_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A late post of an older version leaves the board alone; a worker asked for version 5 with the board at 7
    generates with 7, and with the board at 3 it keeps 5."""
    from types import SimpleNamespace

    from pickaxe.dist import engine_worker, runtime
    from pickaxe.rollout.engines import Completion, SamplingParams

    board = engine_worker.WeightBoard()
    board.post(7, ["w7"])
    board.post(6, ["w6"])
    assert board.latest() == (7, ["w7"])

    class Engine:
        def __init__(self, model: object, seed: int, device: str) -> None:
            self.loads: list[tuple[str, int]] = []

        def load_weights(self, state: str, version: int) -> None:
            self.loads.append((state, version))

        def generate(self, prompts: list, params: SamplingParams) -> list[Completion]:
            return [Completion(i, [1], [0.0], True) for i in range(len(prompts))]

    remote = SimpleNamespace(latest=SimpleNamespace(remote=board.latest))
    monkeypatch.setattr(runtime, "import_ray", lambda: SimpleNamespace(get=lambda ref: ref))
    worker = engine_worker.EngineWorker(None, Engine, seed=0, torch_threads=1, device="cpu")
    completions, version, _ = worker.generate([[1]], SamplingParams(n=1), 5, ["w5"], board=remote)
    assert version == 7 and completions[0].version == 7 and worker.engine.loads == [("w7", 7)]
    old = engine_worker.WeightBoard()
    old.post(3, ["w3"])
    remote = SimpleNamespace(latest=SimpleNamespace(remote=old.latest))
    _, version, _ = worker.generate([[1]], SamplingParams(n=1), 8, ["w8"], board=remote)
    assert version == 8 and worker.engine.loads[-1] == ("w8", 8)


def test_ray_job_capacity_is_set_by_the_scarcest_resource() -> None:
    from types import SimpleNamespace

    from pickaxe.dist.jobs import capacity
    from pickaxe.errors import PickaxeError

    ray = SimpleNamespace(cluster_resources=lambda: {"CPU": 16.0, "GPU": 2.0})
    assert capacity(ray, cpus=2, gpus=1) == 2  # 8 by CPUs, 2 by GPUs
    assert capacity(ray, cpus=4, gpus=0) == 4
    assert capacity(ray, cpus=0, gpus=0) == 1 << 30
    with pytest.raises(PickaxeError, match="asks for 1 cpus and 3 GPUs but the Ray cluster has 16 cpus and 2 GPUs"):
        capacity(ray, cpus=1, gpus=3)
    with pytest.raises(PickaxeError, match="asks for 32 cpus"):
        capacity(ray, cpus=32, gpus=0)


@pytest.mark.parametrize("world", ["2", "4"])
def test_torchrun_must_start_as_many_processes_as_learners(monkeypatch: pytest.MonkeyPatch, world: str) -> None:
    from types import SimpleNamespace

    from pickaxe.dist.learners import learners_wanted

    monkeypatch.setenv("WORLD_SIZE", world)
    cfg = SimpleNamespace(dist=SimpleNamespace(learners=3))
    with pytest.raises(ConfigError, match=f"torchrun started {world} processes but --dist.learners is 3"):
        learners_wanted(cfg)
    cfg.dist.learners = int(world)
    assert learners_wanted(cfg) == int(world)


def test_a_follower_learner_neither_warm_starts_nor_evaluates_nor_starts_workers() -> None:
    from pickaxe.dist.learners import follower_config
    from pickaxe.recipes.llm import LLM_RECIPES

    cfg = LLM_RECIPES["arith-grpo"].make()
    cfg.warm_start.updates, cfg.eval.before = 8, True
    cfg.dist.placement, cfg.dist.workers, cfg.dist.mode = "separate", 2, "pipelined"
    follower = follower_config(cfg)
    assert follower.warm_start.updates == 0 and follower.eval.before is False
    assert (follower.dist.placement, follower.dist.workers, follower.dist.mode) == ("colocated", 1, "sync")
    assert cfg.warm_start.updates == 8 and cfg.dist.workers == 2  # the leader's config is untouched


def test_data_parallel_backend_and_torchrun_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from pickaxe.dist.data_parallel import backend_for, init_from_env
    from pickaxe.errors import PickaxeError

    assert (backend_for("cuda:1"), backend_for("cpu")) == ("nccl", "gloo")
    for key in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert init_from_env() is False  # one process: no group, nothing asked of the environment
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(PickaxeError, match="WORLD_SIZE=2 but RANK, MASTER_PORT unset: start the learners"):
        init_from_env()


def test_learners_other_than_rank_0_do_not_load_the_reward_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only rank 0 scores rollouts: the other learners build their env without the reward model (a whole model's
    memory each), rank 0 with it."""
    import pickaxe.dist.learners as learners
    import pickaxe.train.llm as llm
    from pickaxe.recipes.llm import LLM_RECIPES

    loaded: list[str] = []

    def load(path: str, tokenizer: object, device: object, **options: object) -> object:
        loaded.append(path)
        return lambda *a: 0.0

    monkeypatch.setattr(llm, "load_reward_model", load)
    cfg = LLM_RECIPES["arith-grpo"].make()
    cfg.dist.learners, cfg.data.reward_model = 2, "some/reward-model"
    for follower, names in ((True, ["verify"]), (False, ["verify", "proxy"])):
        monkeypatch.setattr(learners, "is_follower", lambda f=follower: f)
        env = llm.build_env(cfg, 0, 1, tokenizer=object())
        assert env.reward_names == names
    assert loaded == ["some/reward-model"]
