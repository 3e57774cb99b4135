"""The decoder's last layer run only at the positions read (pickaxe.models.last_layer.hidden_at): the same hidden
states and gradients as the plain forward, for each supported architecture and attention mask, and the work really
skipped (the last layer's MLP sees the picked positions only)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from pickaxe.algos.configs import RewardModelConfig
from pickaxe.algos.reward_model import RewardModelTrainer
from pickaxe.envs.text.preferences import PreferencePair
from pickaxe.models import last_layer
from pickaxe.models.last_layer import hidden_at
from pickaxe.models.lm import enable_checkpointing, split_lm, tiny_lm
from pickaxe.models.reward import tiny_reward_model
from pickaxe.models.tokenizer import char_tokenizer
from pickaxe.rollout.pairs import pack_pairs

VOCAB = 40
CLOSE = {"atol": 2e-6, "rtol": 1e-5}


def _decoder(arch: str, seed: int = 0) -> nn.Module:
    if arch == "qwen3":
        from transformers import Qwen3Config, Qwen3Model

        torch.manual_seed(seed)
        cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=8, intermediate_size=64, max_position_embeddings=64,
                          attn_implementation="sdpa")  # fmt: skip
        return Qwen3Model(cfg).train()
    lm = tiny_lm(VOCAB, arch, hidden=32, layers=3, heads=4, kv_heads=2, intermediate=64, seed=seed)  # type: ignore[arg-type]
    parts = split_lm(lm)
    assert parts is not None
    return parts[0].train()


def _plain(decoder: nn.Module, inputs: dict, index: torch.Tensor) -> torch.Tensor:
    hidden = decoder(**inputs).last_hidden_state
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, index)


def _mlp_rows(decoder: nn.Module) -> list[int]:
    """Records the number of positions the last layer's MLP runs on at each call."""
    seen: list[int] = []
    decoder.layers[-1].mlp.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[:-1].numel()))
    return seen


def _inputs(mask: torch.Tensor, seed: int = 1) -> dict:
    torch.manual_seed(seed)
    ids = torch.randint(2, VOCAB, mask.shape)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "use_cache": False}


def _same(decoder: nn.Module, inputs: dict, index: torch.Tensor) -> list[int]:
    """hidden_at equals the plain forward's pick, values and every parameter's gradient; returns the MLP's
    position counts in hidden_at's forward."""
    plain_model = copy.deepcopy(decoder)
    weights = torch.randn(index.numel(), decoder.config.hidden_size)
    want = _plain(plain_model, inputs, index)
    (want * weights).sum().backward()
    seen = _mlp_rows(decoder)
    got = hidden_at(decoder, inputs, index)
    (got * weights).sum().backward()
    torch.testing.assert_close(got, want, **CLOSE)
    for (name, p), q in zip(decoder.named_parameters(), plain_model.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            scale = float(q.grad.abs().max())  # float rounding, relative to the gradient's size
            torch.testing.assert_close(p.grad, q.grad, atol=1e-6 * scale, rtol=1e-5, msg=name)
    return seen


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_padded_rows_read_at_a_few_positions_match_the_plain_forward(arch: str) -> None:
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[0, :3] = 0  # left padding
    mask[1, 9:] = 0  # right padding
    index = torch.tensor([11, 12 + 8, 12 + 3, 24 + 11, 24 + 5, 36 + 2, 36 + 11])  # rows out of order, 1-2 a row
    seen = _same(_decoder(arch), _inputs(mask), index)
    assert seen == [4 * 2]  # 4 rows x the most picks of a row, not 4 x 12


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_rows_without_padding_use_the_causal_mask(arch: str) -> None:
    mask = torch.ones(3, 10, dtype=torch.long)  # transformers passes no mask for these
    index = torch.tensor([9, 10 + 9, 20 + 4, 20 + 9])
    seen = _same(_decoder(arch), _inputs(mask), index)
    assert seen == [3 * 2]


def test_rows_without_picks_are_skipped_and_repeated_picks_are_read_twice() -> None:
    mask = torch.ones(4, 8, dtype=torch.long)
    index = torch.tensor([8 + 7, 8 + 7, 24 + 1])  # rows 0 and 2 not read
    seen = _same(_decoder("qwen2"), _inputs(mask), index)
    assert seen == [2 * 2]


def test_most_positions_picked_runs_the_whole_last_layer() -> None:
    mask = torch.ones(2, 6, dtype=torch.long)
    index = torch.arange(12)
    seen = _same(_decoder("llama"), _inputs(mask), index)
    assert seen == [12]


def test_with_gradient_checkpointing() -> None:
    decoder = _decoder("qwen2")
    enable_checkpointing(decoder)
    mask = torch.ones(2, 9, dtype=torch.long)
    seen = _same(decoder, _inputs(mask), torch.tensor([8, 9 + 8]))
    assert seen == [2]


def test_eager_attention_runs_the_whole_last_layer() -> None:
    decoder = _decoder("qwen2")
    decoder.config._attn_implementation = "eager"  # additive float masks: not sliced
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[0, :2] = 0
    seen = _same(decoder, _inputs(mask), torch.tensor([6, 7 + 6]))
    assert seen == [14]


def test_reward_model_update_on_shared_prompts_is_the_plain_forward_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reward model's training step over the shared-prompt layout (one pass over each prompt for both answers)
    gives the gradient of the plain forward, which reads the last layer at every position."""
    tok = char_tokenizer()
    pairs = [PreferencePair("sort 3142=", "1234", "3124"), PreferencePair("7+5=", "12", "1"),
             PreferencePair("sort 3142=", "12344", "2"), PreferencePair("9+9=", "18", "81818181")]  # fmt: skip
    batch = pack_pairs(pairs, tok)
    model = tiny_reward_model(len(tok), hidden=32, layers=3, heads=4, kv_heads=2, intermediate=64, seed=3)
    grads = []
    for partial in (True, False):
        algo = RewardModelTrainer(copy.deepcopy(model), RewardModelConfig(lr=1e-3, max_grad_norm=1e9))
        if not partial:  # the plain forward: the last layer at every position
            monkeypatch.setattr(last_layer, "MAX_SHARE", 0.0)
        seen = _mlp_rows(algo.model.backbone)
        step = algo.optimizer.step

        def recording(*args: object, _step=step, _algo=algo, **kwargs: object) -> object:
            grads.append(torch.cat([p.grad.flatten() for p in _algo.model.parameters() if p.grad is not None]))
            return _step(*args, **kwargs)

        algo.optimizer.step = recording  # type: ignore[method-assign]
        algo.update(batch)
        if partial:
            assert seen and max(seen) <= 2 * len(pairs)  # chosen and rejected ends only
    assert grads[0].abs().max() > 1e-3
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6 * float(grads[1].abs().max()), rtol=1e-5)
