"""LoRA through peft: only the adapters train, the shared reference (the policy with its adapters off) gives the
starting model's log-probs without a second copy of the weights, and export merges the adapters."""

import copy
import sys
from pathlib import Path

import pytest
import torch

from pickaxe.algos.configs import SFTConfig
from pickaxe.algos.sft import SFT
from pickaxe.envs.text import Arithmetic, PromptEnv
from pickaxe.errors import ConfigError, PickaxeError
from pickaxe.models.export import export_model, read_export_source
from pickaxe.models.lm import completion_logprobs, load_lm, num_parameters, split_lm, tiny_lm
from pickaxe.models.lora import (
    SharedReference,
    apply_lora,
    apply_lora_config,
    is_lora,
    merge_lora,
    shared_reference,
)
from pickaxe.models.tokenizer import char_tokenizer
from pickaxe.rollout.engines import HFEngine, SamplingParams
from pickaxe.rollout.text_collector import DemoCollector, TextCollector
from pickaxe.train.llm_config import LoRAConfig

TOK = char_tokenizer()


def _base(seed: int = 0) -> torch.nn.Module:
    return tiny_lm(len(TOK), hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=seed)


def _demos(seed: int = 0):
    return DemoCollector(PromptEnv(Arithmetic(2), seed=seed, eval_size=4), TOK, batch_size=16).collect()


def _logprobs(model, batch, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return completion_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["loss_mask"], **kwargs)


def _trained(seed: int = 0, updates: int = 2):
    """(plain starting model, LoRA policy after ``updates`` SFT updates of its adapters, the SFT batch)."""
    base = _base(seed)
    policy = apply_lora(copy.deepcopy(base), r=4, alpha=8.0, seed=seed)
    sft = SFT(policy, SFTConfig(lr=1e-2, micro_batch_size=16))
    batch = _demos(seed)
    for _ in range(updates):
        sft.update(batch)
    return base, policy.eval(), batch


def test_only_the_adapters_train() -> None:
    base, policy, _ = _trained(updates=0)
    batch = _demos()
    assert torch.equal(_logprobs(policy, batch), _logprobs(base, batch))  # B = 0: adapters start as a no-op
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # every linear layer of the decoder is adapted, the output layer is not
    assert any("mlp.down_proj.lora_A" in n for n in trainable) and not any("lm_head" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    sft = SFT(policy, SFTConfig(lr=1e-2, micro_batch_size=16))
    sft.update(batch)
    changed = {n for n, p in policy.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable and any(".lora_B." in n for n in changed)
    assert num_parameters(policy) - num_parameters(base) == sum(
        p.numel() for n, p in policy.named_parameters() if n in trainable
    )


def test_adapter_init_is_seeded_and_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    a, b = apply_lora(_base(), r=4, seed=7), apply_lora(_base(), r=4, seed=7)
    assert torch.equal(torch.random.get_rng_state(), state)
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert all(torch.equal(pa[n], pb[n]) for n in pa)
    c = apply_lora(_base(), r=4, seed=8)
    assert not all(torch.equal(pa[n], p) for n, p in c.named_parameters())


@pytest.mark.parametrize(
    "kwargs", [{}, {"chunk_tokens": 3}, {"mode": "packed", "rows": 16}, {"temperature": 0.7}], ids=str
)
def test_shared_reference_gives_the_starting_models_logprobs_after_training(kwargs: dict) -> None:
    base, policy, batch = _trained()
    reference = shared_reference(policy)
    assert split_lm(reference) is not None  # the chunked-head path sees through the wrapper
    expected = _logprobs(base, batch, **kwargs)
    assert not torch.allclose(_logprobs(policy, batch, **kwargs), expected, atol=1e-4)  # the policy moved
    assert torch.allclose(_logprobs(reference, batch, **kwargs), expected, atol=1e-6)
    logits = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # full forward
    assert torch.allclose(logits, base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits)
    # and the adapters are back on afterwards, gradients too
    policy.train()
    loss = completion_logprobs(policy, batch["input_ids"], batch["attention_mask"], batch["loss_mask"]).sum()
    loss.backward()
    assert policy.training and all(p.grad is not None for p in policy.parameters() if p.requires_grad)


def test_shared_reference_holds_no_second_copy_of_the_weights() -> None:
    _, policy, batch = _trained(updates=1)
    reference = shared_reference(policy)
    assert isinstance(reference, SharedReference) and reference.policy is policy
    assert num_parameters(reference) == 0 and reference.state_dict() == {}
    # the decoder and output layer it runs are the policy's own tensors
    backbone, head = split_lm(reference)
    pbackbone, phead = split_lm(policy)
    assert head.weight.data_ptr() == phead.weight.data_ptr()
    assert {p.data_ptr() for p in pbackbone.parameters()} == {p.data_ptr() for p in backbone._module.parameters()}
    # what the trainer and collector do to a reference leaves the policy alone
    reference.eval().requires_grad_(False).to("cpu")
    reference.load_state_dict({})
    assert any(p.requires_grad for p in policy.parameters())
    expected = _logprobs(reference, batch)
    assert torch.equal(_logprobs(shared_reference(policy), batch), expected)


def test_shared_reference_in_the_text_collector_matches_a_frozen_copy() -> None:
    base, policy, _ = _trained()
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, n=2)

    def collect(reference, offload: bool):
        env = PromptEnv(Arithmetic(2), seed=1, eval_size=4)
        engine = HFEngine(policy, TOK.eos_token_id, TOK.pad_token_id, seed=1)
        collector = TextCollector(env, engine, TOK, 4, sampling, policy, reference, offload_reference=offload)
        return collector.collect(), collector.state_dict()["reference"]

    copy_ref, copy_state = collect(copy.deepcopy(base).eval().requires_grad_(False), False)
    shared, shared_state = collect(shared_reference(policy), True)
    assert torch.equal(shared["input_ids"], copy_ref["input_ids"])
    assert torch.allclose(shared["ref_logprob"], copy_ref["ref_logprob"], atol=1e-6)
    assert len(copy_state) > 0 and shared_state == {}  # checkpoints no longer carry a second model
    assert next(policy.parameters()).device.type == "cpu" and any(p.requires_grad for p in policy.parameters())


def test_merge_gives_the_adapted_models_logprobs(tmp_path: Path) -> None:
    _, policy, batch = _trained()
    adapted = _logprobs(policy, batch)
    merged = merge_lora(policy)
    assert not is_lora(merged) and is_lora(policy)  # merged on a copy: the policy keeps its adapters
    assert type(merged).__name__ == "Qwen2ForCausalLM" and num_parameters(merged) == num_parameters(_base())
    assert torch.allclose(_logprobs(merged, batch), adapted, atol=1e-5)
    out = export_model(policy, TOK, tmp_path / "merged", {"stage": "sft"})
    assert read_export_source(out)["lora_merged"] is True
    assert not any("lora" in p.name or "adapter" in p.name for p in out.iterdir())
    assert torch.allclose(_logprobs(load_lm(out, "cpu"), batch), adapted, atol=1e-5)
    assert torch.equal(_logprobs(policy, batch), adapted)  # exporting changed nothing


def test_lora_config_fields_and_errors() -> None:
    assert not LoRAConfig().enabled and LoRAConfig(r=8).target_modules == ("all-linear",)
    base = _base()
    assert apply_lora_config(base, LoRAConfig()) is base
    policy = apply_lora_config(_base(), LoRAConfig(r=2, alpha=4.0, target_modules=("q_proj", "v_proj")))
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("q_proj" in n or "v_proj" in n for n in trainable)
    with pytest.raises(ConfigError, match=r"LoRAConfig\.r must be >= 0"):
        LoRAConfig(r=-1)
    with pytest.raises(ConfigError, match="target_modules is empty"):
        LoRAConfig(r=4, target_modules=())
    with pytest.raises(PickaxeError, match=r"check lora\.target_modules"):
        apply_lora(_base(), r=4, target_modules=("no_such_proj",))
    with pytest.raises(PickaxeError, match="already has LoRA adapters"):
        apply_lora(policy, r=4)
    with pytest.raises(PickaxeError, match="keep a frozen copy"):
        shared_reference(_base())


def test_missing_peft_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft now raises ImportError
    with pytest.raises(PickaxeError, match=r"LoRA needs the peft package: pip install 'pickaxe\[lora\]'"):
        apply_lora(_base(), r=4)
