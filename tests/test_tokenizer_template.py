"""Prompts through chat templates: ``render_prompt`` uses the tokenizer's template when it has one and the plain
encoding otherwise, and a saved tokenizer loads back exactly (template included)."""

from pathlib import Path

import pytest

from pickaxe.envs.text import Arithmetic, PromptEnv
from pickaxe.models.lm import tiny_lm
from pickaxe.models.tokenizer import (
    SIMPLE_CHAT_TEMPLATE,
    TokenizerError,
    char_tokenizer,
    load_tokenizer,
    render_prompt,
)
from pickaxe.rollout.text_collector import encode_prompts


def test_without_a_template_prompts_encode_as_before() -> None:
    tok = char_tokenizer()
    assert tok.chat_template is None
    examples = PromptEnv(Arithmetic(2), seed=0, eval_size=4).sample(6)
    assert [render_prompt(tok, ex.prompt) for ex in examples] == encode_prompts(tok, examples)
    assert render_prompt(tok, "12+3=") == [4, 5, 66, 6, 70]


def test_without_a_template_the_tokenizers_own_special_tokens_stay() -> None:
    from tokenizers import processors

    tok = char_tokenizer(chars="ab<")
    tok.add_special_tokens({"bos_token": "<s>"})
    bos = tok.bos_token_id
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    assert render_prompt(tok, "ab") == [bos, 3, 4] == list(tok("ab")["input_ids"])


def test_a_template_renders_the_prompt_as_a_user_turn() -> None:
    tok = char_tokenizer(chat_template=SIMPLE_CHAT_TEMPLATE)
    ids = render_prompt(tok, "12+3=")
    assert tok.decode(ids) == "user: 12+3=\nassistant: "
    assert ids == list(tok("user: 12+3=\nassistant: ", add_special_tokens=False)["input_ids"])
    assert all(isinstance(i, int) for i in ids)


def test_template_special_tokens_become_their_ids() -> None:
    template = "{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}"
    tok = char_tokenizer(chat_template=template)
    assert render_prompt(tok, "1+1=") == [4, 66, 4, 70, tok.eos_token_id]


def test_a_saved_tokenizer_loads_back_exactly_beside_a_model(tmp_path: Path) -> None:
    # beside a Qwen2 config.json, AutoTokenizer alone would load a Qwen2Tokenizer, whose byte-level pre-tokenizer
    # drops the char tokenizer's spaces and newlines
    tok = char_tokenizer(model_max_length=64, chat_template=SIMPLE_CHAT_TEMPLATE)
    tiny_lm(len(tok), hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    text = "a b\nc 12 + 3 = 15"
    assert loaded(text)["input_ids"] == tok(text)["input_ids"] and loaded.decode(tok(text)["input_ids"]) == text
    assert loaded.chat_template == SIMPLE_CHAT_TEMPLATE and render_prompt(loaded, "1 + 2") == render_prompt(
        tok, "1 + 2"
    )
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.padding_side) == (0, 1, "left")


def test_a_broken_template_is_one_clear_line() -> None:
    tok = char_tokenizer(chat_template="{% for m in messages %}{{ m['content'] }")
    with pytest.raises(TokenizerError, match="chat template failed to render a prompt") as info:
        render_prompt(tok, "1+1=")
    assert "\n" not in str(info.value)
