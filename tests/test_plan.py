"""``pickaxe plan``: the memory planner's exact terms equal the bytes of the tensors a built model and its AdamW hold,
its activation estimate is within its stated tolerance of a measured peak, and the command is torch-free, reads the
train flags and answers bad input in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pickaxe.algos.configs import DPOConfig, GRPOConfig, LLMPPOConfig, RewardModelConfig, SFTConfig
from pickaxe.models.shapes import Shape
from pickaxe.recipes.llm import LLM_RECIPES
from pickaxe.train.llm_config import LLMTrainConfig, LMConfig, LoRAConfig
from pickaxe.train.plan import TOLERANCE, RankPlan, activations, plan_memory


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _term(rank: RankPlan, name: str) -> int:
    return sum(t.bytes for t in rank.terms if t.name == name)


def _cfg(algo, **model) -> LLMTrainConfig:
    cfg = LLM_RECIPES["arith-grpo"].make()
    cfg.algo = algo
    cfg.model = LMConfig(**{"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, **model})
    cfg.device = "cpu"
    return cfg


def _held(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> tuple[int, int]:
    """One AdamW step on ``model``'s trained parameters (gradients of ones): the bytes of the gradients and of the
    optimizer state afterwards."""
    trained = [p for p in model.parameters() if p.requires_grad]
    for p in trained:
        p.grad = torch.ones_like(p)
    grads = _bytes(p.grad for p in trained)
    optimizer.step()
    state = _bytes(v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    return grads, state


@pytest.mark.parametrize(
    "model",
    [{}, {"lora": LoRAConfig(r=4)}, {"dtype": "bfloat16"}, {"shape": "tiny-qwen2", "hidden": 64, "arch": "qwen2"}],
    ids=["full", "lora", "bf16", "tied"],
)
def test_weights_gradients_and_optimizer_state_are_the_bytes_of_the_tensors(model: dict) -> None:
    from pickaxe.algos.sft import SFT
    from pickaxe.train.llm import build_model

    cfg = _cfg(SFTConfig(), **model)
    policy, _ = build_model(cfg, torch.device("cpu"), seed=0)
    algo = SFT(policy, cfg.algo)
    grads, state = _held(algo.optimizer, policy)
    plan = plan_memory(cfg)
    rank = plan.ranks[0]
    assert _term(rank, "policy weights") == _bytes(policy.parameters())
    assert _term(rank, "policy gradients") == grads
    assert _term(rank, "policy AdamW state") == state
    assert plan.trainable == sum(p.numel() for p in policy.parameters() if p.requires_grad)


def test_ppo_critic_and_reference_are_the_bytes_of_the_tensors() -> None:
    from pickaxe.algos.llm_ppo import LLMPPO
    from pickaxe.train.llm import build_critic, build_model, frozen_reference

    cfg = _cfg(LLMPPOConfig(kl_coef=0.02))
    policy, _ = build_model(cfg, torch.device("cpu"), seed=0)
    reference = frozen_reference(policy)
    algo = LLMPPO(policy, build_critic(cfg, policy, torch.device("cpu")), cfg.algo)
    grads, state = _held(algo.critic_optimizer, algo.critic)
    rank = plan_memory(cfg).ranks[0]
    assert _term(rank, "critic weights") == _bytes(algo.critic.parameters())
    assert _term(rank, "critic gradients") == grads
    assert _term(rank, "critic AdamW state") == state
    assert _term(rank, "reference model") == _bytes(reference.parameters())


def test_reward_model_training_is_the_bytes_of_the_tensors() -> None:
    from pickaxe.models.reward import RewardModel
    from pickaxe.train.llm import build_model

    cfg = _cfg(RewardModelConfig())
    reward_model = RewardModel.from_lm(build_model(cfg, torch.device("cpu"), seed=0)[0])
    optimizer = torch.optim.AdamW([p for p in reward_model.parameters() if p.requires_grad])
    grads, state = _held(optimizer, reward_model)
    rank = plan_memory(cfg).ranks[0]
    assert _term(rank, "reward model weights") == _bytes(reward_model.parameters())
    assert (_term(rank, "reward model gradients"), _term(rank, "reward model AdamW state")) == (grads, state)


@pytest.mark.parametrize("recipe", sorted(LLM_RECIPES))
def test_every_llm_recipe_has_a_plan(recipe: str) -> None:
    from pickaxe.recipes.args import parse_train

    cfg, _ = parse_train(recipe, ["--data.reward-model", "not-yet-written"])
    plan = plan_memory(cfg, device_gib=1)
    assert plan.fits() is True and plan.ranks[0].peak("device") > 0
    assert json.loads(json.dumps(plan.to_dict()))["algo"] == plan.algo


def test_sharding_divides_the_training_state_and_the_reference_and_rank_0_keeps_the_policy() -> None:
    cfg = _cfg(GRPOConfig(kl_coef=0.01))
    one = plan_memory(cfg).ranks[0]
    cfg.dist.learners, cfg.dist.shard = 4, "fsdp"
    zero, other = plan_memory(cfg).ranks
    for name in ("weights", "gradients", "AdamW state"):
        assert _term(zero, f"policy {name} (1/4)") == pytest.approx(_term(one, f"policy {name}") / 4, abs=1)
        assert _term(other, f"policy {name} (1/4)") == _term(zero, f"policy {name} (1/4)")
    # the KL reference: a quarter on every learner, rank 0 included, scored collectively (gathered units)
    assert _term(zero, "reference model (1/4)") == pytest.approx(_term(one, "reference model") / 4, abs=1)
    assert _term(other, "reference model (1/4)") == _term(zero, "reference model (1/4)") > 0
    assert _term(zero, "reference model") == _term(other, "reference model") == 0
    gathered = next(t for t in other.terms if t.name == "reference model gathered units")
    assert gathered.phase == "score" and 0 < gathered.bytes <= _term(one, "reference model")  # 2 layers: all of it
    assert _term(zero, "policy, unsharded") == _term(one, "policy weights")
    assert _term(other, "policy, unsharded") == 0
    dpo = _cfg(DPOConfig())
    dpo.dist.learners, dpo.dist.shard = 2, "fsdp"
    for rank in plan_memory(dpo).ranks:  # DPO's reference: half on each learner (unsharded: whole on each)
        assert _term(rank, "reference model (1/2)") > 0 and _term(rank, "reference model") == 0
    lora = _cfg(GRPOConfig(kl_coef=0.01), lora=LoRAConfig(r=4))
    lora.dist.learners, lora.dist.shard = 2, "fsdp"
    assert not [t for r in plan_memory(lora).ranks for t in r.terms if t.name.startswith("reference model")]
    cfg.dist.offload = "params"
    on_host = {t.name for t in plan_memory(cfg).ranks[1].terms if t.where == "host"}
    assert on_host == {f"policy {n} (1/4)" for n in ("weights", "gradients", "AdamW state")} | {"reference model (1/4)"}
    zero_off = plan_memory(cfg).ranks[0]
    moved = sum(t.bytes for t in zero_off.terms if t.where == "host")
    assert zero_off.peak("device") < zero.peak("device") and moved > 0
    # optimizer offload (HostAdamW): only AdamW's state on the host, plus on an accelerator the staging copies of
    # the weight and gradient shards its step goes through; the shards, their gradients and the reference stay
    cfg.dist.offload = "optimizer"
    assert {t.name for t in plan_memory(cfg).ranks[1].terms if t.where == "host"} == {"policy AdamW state (1/4)"}
    cfg.device = "cuda"
    other = plan_memory(cfg).ranks[1]
    assert {t.name for t in other.terms if t.where == "host"} == {
        "policy AdamW state (1/4)",
        "policy step staging (1/4)",
    }
    assert _term(other, "policy step staging (1/4)") == 2 * _term(other, "policy gradients (1/4)")
    assert _term(other, "policy AdamW state (1/4)") == pytest.approx(2 * _term(other, "policy weights (1/4)"), abs=64)


def test_a_background_checkpoint_counts_its_copy_of_the_state() -> None:
    cfg = _cfg(GRPOConfig(kl_coef=0.01))
    cfg.dist.learners, cfg.dist.shard = 2, "fsdp"
    plain = plan_memory(cfg).ranks
    cfg.trainer.async_checkpoint = True
    for before, rank in zip(plain, plan_memory(cfg).ranks, strict=True):
        state = _term(rank, "policy weights (1/2)") + _term(rank, "policy AdamW state (1/2)")
        assert _term(rank, "checkpoint copy") == pytest.approx(state, abs=2)  # each learner copies its own shards
        assert rank.peak("device") == before.peak("device") + _term(rank, "checkpoint copy")  # on the CPU: same memory
    cfg.device = "cuda"
    copy = next(t for t in plan_memory(cfg).ranks[0].terms if t.name == "checkpoint copy")
    assert copy.where == "host"  # on a GPU the copy is in host memory


def test_an_offloaded_reward_model_is_counted_on_the_host_and_while_it_scores(tmp_path: Path) -> None:
    cfg = _cfg(GRPOConfig(kl_coef=0.0))
    cfg.data.reward_model = str(tmp_path / "not-written-yet")  # counted at the policy's shape
    cfg.device = "cuda"
    plain = plan_memory(cfg).ranks[0]
    cfg.collector.offload_reward_model = True
    moved = plan_memory(cfg).ranks[0]
    rm = [t for t in moved.terms if t.name == "reward model"]
    assert [(t.where, t.phase) for t in rm] == [("host", "resident"), ("device", "score")]
    assert rm[0].bytes == rm[1].bytes == _term(plain, "reward model") > 0
    assert moved.peak("device") < plain.peak("device")


def test_sharding_divides_the_reward_model_unless_kept_whole(tmp_path: Path) -> None:
    cfg = _cfg(GRPOConfig(kl_coef=0.0, autocast="bf16"))
    cfg.data.reward_model = str(tmp_path / "not-written-yet")  # counted at the policy's shape
    cfg.device = "cuda"
    one = plan_memory(cfg).ranks[0]
    cfg.dist.learners, cfg.dist.shard = 4, "fsdp"
    zero, other = plan_memory(cfg).ranks
    whole = _term(one, "reward model")
    for rank in (zero, other):  # a quarter on every learner, rank 0 included, and the units it gathers to score
        assert _term(rank, "reward model (1/4)") == pytest.approx(whole / 4, abs=1) and _term(rank, "reward model") == 0
        gathered = next(t for t in rank.terms if t.name == "reward model gathered units")
        assert gathered.phase == "score" and 0 < gathered.bytes <= whole  # float32 gathered: autocast leaves it
    cfg.dist.shard_reward_model = False  # --dist.no-shard-reward-model: whole on rank 0 only, as before
    kept_zero, kept_other = plan_memory(cfg).ranks
    assert _term(kept_zero, "reward model") == whole and _term(kept_other, "reward model") == 0
    assert kept_zero.peak("device") - zero.peak("device") >= whole * 3 / 4 - 1 - gathered.bytes
    assert kept_other.peak("device") < other.peak("device")  # the other learners no longer hold any of it
    cfg.dist.shard_reward_model, cfg.collector.offload_reward_model = True, True
    offloaded = next(t for t in plan_memory(cfg).ranks[1].terms if t.name == "reward model (1/4)")
    assert offloaded.where == "host"  # the shards wait on the host (FSDP's CPU offload)


MEASURE = """
import json, sys
import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile
from pickaxe.algos.configs import SFTConfig
from pickaxe.algos.sft import SFT
from pickaxe.data.batch import Batch
from pickaxe.models.lm import tiny_lm
torch.set_num_threads(1)
s, (rows, seq, micro, new, ckpt, autocast) = json.loads(sys.argv[1]), json.loads(sys.argv[2])
model = tiny_lm(s["vocab"], s["arch"], s["hidden"], s["layers"], s["heads"], s["kv_heads"], s["intermediate"], seq)
algo = SFT(model, SFTConfig(micro_batch_size=micro, gradient_checkpointing=ckpt, autocast=autocast))
ids = torch.randint(3, s["vocab"], (rows, seq), generator=torch.Generator().manual_seed(0))
mask = torch.zeros(rows, seq)
mask[:, seq - new:] = 1
batch = Batch({"input_ids": ids, "attention_mask": torch.ones(rows, seq, dtype=torch.long), "loss_mask": mask},
              batch_size=[rows])
algo.update(batch)  # the optimizer state exists from here on: the next update allocates gradients and activations
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    algo.update(batch)
events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
while stack:
    e = stack.pop()
    if e.tag == _EventType.Allocation:
        events.append((e.start_time_ns, e.extra_fields.alloc_size))
    stack.extend(e.children)
live = peak = 0
for _, n in sorted(events):
    live += n
    peak = max(peak, live)
print(json.dumps({"peak": peak, "grads": sum(p.numel() * p.element_size() for p in model.parameters())}))
"""


@pytest.mark.parametrize(
    ("hidden", "layers", "seq", "checkpointing", "autocast"),
    [(256, 4, 256, False, "off"), (256, 4, 256, True, "off"), (128, 4, 128, False, "bf16")],
    ids=["plain", "checkpointing", "bf16-autocast"],
)
def test_activation_estimate_is_within_its_tolerance_of_a_measured_peak(
    hidden: int, layers: int, seq: int, checkpointing: bool, autocast: str
) -> None:
    """One SFT update of a hidden-256, 4-layer model with a 4096-row vocabulary on sequences of 256 tokens (2
    micro-batches of 4, half of each sequence scored; under bf16 autocast a hidden-128 model on 128 tokens, CPU bf16
    being slow): the allocations the update makes at their peak (the profiler's count, in a fresh process) against
    the planner's gradients + activations of one micro-batch (+ autocast's bf16 weight copies)."""
    shape = Shape("qwen2", hidden, layers, 4, 2, 4 * hidden, 4096)
    rows, micro, new = 8, 4, seq // 2
    args = [rows, seq, micro, new, checkpointing, autocast]
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, json.dumps(vars(shape)), json.dumps(args)],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    bf16 = autocast == "bf16"
    estimate = measured["grads"] + activations(shape, micro * seq, micro * new, 2.5 if bf16 else 4.0, 0, checkpointing)
    estimate += 2 * shape.parameters() if bf16 else 0
    assert abs(estimate / measured["peak"] - 1) <= TOLERANCE, (estimate, measured)


def _plan(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    code = (
        "import sys\nfrom pickaxe.cli import main\ncode = main(sys.argv[1:])\n"
        "assert 'torch' not in sys.modules, 'pickaxe plan imported torch'\nsys.exit(code)"
    )
    return subprocess.run([sys.executable, "-c", code, "plan", *args], capture_output=True, text=True, timeout=120)


def test_plan_is_torch_free_and_prints_one_json_object() -> None:
    out = _plan("arith-grpo", "--model.shape", "qwen2.5-7b", "--dist.learners", "8", "--dist.shard", "fsdp",
                "--algo.autocast", "bf16", "--device-gib", "80", "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["parameters"] == 7_615_616_512 and plan["learners"] == 8 and plan["fits"] in (True, False)
    assert [r["ranks"] for r in plan["ranks"]] == ["rank 0", "ranks 1-7"]
    table = _plan("arith-grpo", "--model.shape", "qwen2-0.5b", "--algo.micro-batch-size", "8", "--device-gib", "80")
    assert table.returncode == 0 and "on 80 GiB devices: learner: fits (" in table.stdout
    assert "does not fit" in _plan("arith-grpo", "--model.shape", "qwen2-0.5b", "--device-gib", "8").stdout


def test_train_dry_run_prints_the_plan_and_trains_nothing(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pickaxe.cli", "train", "arith-grpo", "--model.shape", "tiny-qwen2", "--dry-run",
         "--json", "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["model"] == "tiny-qwen2" and not (tmp_path / "run").exists()


def test_plan_reads_a_model_folders_config(tmp_path: Path) -> None:
    from pickaxe.models.shapes import SHAPES

    with torch.device("meta"):
        from pickaxe.models.lm import tiny_lm

        s = SHAPES["qwen2.5-1.5b"]
        config = tiny_lm(s.vocab, s.arch, s.hidden, s.layers, s.heads, s.kv_heads, s.intermediate, tied=True).config
    (tmp_path / "config.json").write_text(config.to_json_string())
    out = _plan("arith-sft", "--model.path", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["parameters"] == s.parameters()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "pickaxe plan needs a recipe name"),
        (["cartpole-ppo"], "counts the memory of LLM recipes"),
        (["arith-grpo", "--device-gib", "-3"], "--device-gib takes"),
        (["arith-grpo", "--prompt-tokens", "many"], "--prompt-tokens takes"),
        (["arith-grpo", "--algo.lrr", "1"], "unknown config key --algo.lrr"),
        (["arith-grpo", "--model.shape", "gpt-9"], "pickaxe plan arith-grpo: --model.shape 'gpt-9' is not a known"),
        (["arith-grpo", "--model.path", "/nonexistent/model"], "--model.path '/nonexistent/model': cannot read"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    out = _plan(*args) if args else _plan("--json")
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
