"""Named model shapes (``pickaxe.models.shapes``, ``--model.shape``): their parameter arithmetic equals the models
transformers builds and the published totals, the tiny model is built at the named shape, and bad input is one
line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pickaxe.algos.configs import SFTConfig
from pickaxe.errors import ConfigError
from pickaxe.models.lm import load_lm, num_parameters, tiny_lm
from pickaxe.models.shapes import SHAPES, get_shape, shape_from_config
from pickaxe.recipes.llm import LLM_RECIPES
from pickaxe.train.config import TrainerConfig
from pickaxe.train.llm_config import LLMEvalConfig, LMConfig, TextCollectorConfig, WarmStartConfig

PUBLISHED = {
    "qwen2-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-3b": 3_085_938_688,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-14b": 14_770_033_664,
    "qwen2.5-32b": 32_763_876_352,
    "qwen2.5-72b": 72_706_203_648,
    "smollm2-135m": 134_515_008,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
}
"""Parameter counts the models' cards and papers give (the shapes above 20B are checked here only: building them
even on the meta device takes seconds each)."""


def _meta_model(name: str) -> torch.nn.Module:
    s = SHAPES[name]
    with torch.device("meta"):
        return tiny_lm(s.vocab, s.arch, s.hidden, s.layers, s.heads, s.kv_heads, s.intermediate, tied=s.tied)


@pytest.mark.parametrize("name", [n for n in SHAPES if SHAPES[n].parameters() < 20e9])
def test_shape_arithmetic_equals_the_model_transformers_builds(name: str) -> None:
    model = _meta_model(name)
    s = SHAPES[name]
    assert num_parameters(model) == s.parameters()
    assert len(list(model.parameters())) == s.tensors()
    assert sum(p.numel() for p in model.get_decoder().parameters()) == s.backbone_parameters()
    assert model.config.tie_word_embeddings is s.tied


def test_shape_arithmetic_equals_published_counts() -> None:
    assert {n: SHAPES[n].parameters() for n in PUBLISHED} == PUBLISHED


def test_lora_arithmetic_equals_peft() -> None:
    pytest.importorskip("peft")
    from pickaxe.models.lora import apply_lora_config
    from pickaxe.train.llm_config import LoRAConfig

    s = SHAPES["tiny-qwen2"]
    for targets in (("all-linear",), ("q_proj", "v_proj")):
        model = apply_lora_config(_cpu_tiny(s), LoRAConfig(r=4, target_modules=targets), seed=0)
        trained = [p for p in model.parameters() if p.requires_grad]
        assert (sum(p.numel() for p in trained), len(trained)) == s.lora_parameters(4, targets)


def _cpu_tiny(s):
    return tiny_lm(s.vocab, s.arch, s.hidden, s.layers, s.heads, s.kv_heads, s.intermediate, tied=s.tied)


def test_model_shape_builds_a_qwen2_half_billion_model() -> None:
    from pickaxe.train.llm import build_model

    cfg = LLM_RECIPES["arith-grpo"].make()
    cfg.model = LMConfig(shape="qwen2-0.5b")
    assert (cfg.model.hidden, cfg.model.layers, cfg.model.heads, cfg.model.kv_heads) == (896, 24, 14, 2)
    with torch.device("meta"):
        model, tokenizer = build_model(cfg, torch.device("meta"), seed=0)
    assert num_parameters(model) == SHAPES["qwen2-0.5b"].parameters() == 494_032_768
    assert model.get_input_embeddings().weight.shape == (151_936, 896)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    assert len(tokenizer) < 151_936  # the character tokenizer uses the first ids


def test_a_shape_set_after_the_config_was_made_builds_that_shape() -> None:
    from pickaxe.train.llm import build_model

    cfg = LLM_RECIPES["arith-grpo"].make()
    cfg.model.shape = "qwen2-0.5b"  # from Python, after the recipe's config was made: not the recipe's tiny shape
    with torch.device("meta"):
        model, _ = build_model(cfg, torch.device("meta"), seed=0)
    assert num_parameters(model) == SHAPES["qwen2-0.5b"].parameters()


def test_shape_from_config_reads_a_transformers_config() -> None:
    model = _meta_model("llama-3.2-1b")
    record = model.config.to_dict()
    s = shape_from_config(record)
    assert s.parameters() == SHAPES["llama-3.2-1b"].parameters() and s.tied and not s.qkv_bias


def test_unknown_shape_is_one_line() -> None:
    with pytest.raises(ConfigError, match="is not a known shape; choose one of"):
        get_shape("qwen3")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model.shape", "gpt-5"], "is not a known shape; choose one of qwen2-0.5b"),
        (["--model.shape", "tiny-qwen2", "--model.path", "x"], "drop one of them"),
        (["--model.shape", "tiny-qwen2", "--model.hidden", "64"], "--model.shape sets model.hidden"),
    ],
)
def test_shape_flags_are_checked_before_anything_loads(flags: list[str], message: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pickaxe.cli", "train", "arith-grpo", *flags, "--run-dir", "never-written"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not Path("never-written").exists()


def test_a_run_at_a_named_shape_trains_saves_and_reloads(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from pickaxe.train.build import train
    from pickaxe.train.llm import load_run_lm

    cfg = LLM_RECIPES["arith-sft"].make()
    cfg.model = LMConfig(shape="tiny-qwen2")
    cfg.algo = SFTConfig(lr=1e-3, micro_batch_size=8)
    cfg.warm_start = WarmStartConfig(updates=0)
    cfg.collector = TextCollectorConfig(prompts=8)
    cfg.eval = LLMEvalConfig(prompts=4, samples=0)
    cfg.trainer = TrainerConfig(total_steps=16, eval_every=16)
    cfg.device = "cpu"
    result, _ = train(cfg, run_dir=tmp_path / "run")
    assert result.steps == 16
    weights = load_file(str(tmp_path / "run" / "model.safetensors"))
    assert weights["policy.model.embed_tokens.weight"].shape == (1024, 64)
    model, _ = load_run_lm(cfg, tmp_path / "run", "cpu")
    assert num_parameters(model) == SHAPES["tiny-qwen2"].parameters()
    assert torch.equal(model.model.embed_tokens.weight, weights["policy.model.embed_tokens.weight"])
    exported = load_lm(tmp_path / "run" / "export", "cpu")  # the transformers folder the next stage loads
    assert exported.config.tie_word_embeddings and num_parameters(exported) == SHAPES["tiny-qwen2"].parameters()
    assert torch.equal(exported.lm_head.weight, model.model.embed_tokens.weight)
