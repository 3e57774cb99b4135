"""Tokenizers for language models: a local character-level one (built with ``tokenizers``, no download), loading a
model's own tokenizer from a local directory, and :func:`render_prompt` (a prompt's token ids, through the
tokenizer's chat template when it has one)."""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pickaxe.errors import PickaxeError

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
DEFAULT_CHARS = string.digits + string.ascii_letters + " +-*/=()<>,.:;?!'\"_#[]{}|\n"
"""Characters of ``char_tokenizer``'s default vocabulary: enough for every built-in task's prompts and answers."""
CHAR_VOCAB = 3 + len(dict.fromkeys(DEFAULT_CHARS))
"""Size of ``char_tokenizer()``'s vocabulary: the three special tokens and the default characters."""


SIMPLE_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
"""A minimal chat template (``role: content`` lines, then ``assistant: ``) whose every character is in
``DEFAULT_CHARS``: for tests and tiny models (``char_tokenizer(chat_template=SIMPLE_CHAT_TEMPLATE)``)."""


class TokenizerError(PickaxeError):
    """A tokenizer that cannot be loaded or lacks what pickaxe needs (an EOS token)."""


def char_tokenizer(chars: str = DEFAULT_CHARS, model_max_length: int = 512, chat_template: str | None = None):
    """A character-level ``PreTrainedTokenizerFast``: one token per character, ``<pad>`` = 0, ``<eos>`` = 1,
    ``<unk>`` = 2, left padding (what batched generation needs). ``chat_template`` (a Jinja template, e.g.
    ``SIMPLE_CHAT_TEMPLATE``) becomes the tokenizer's chat template; it is saved and loaded with the tokenizer.

    Built locally with ``tokenizers`` (WordLevel model over single characters, a pre-tokenizer that isolates every
    character, a ``Fuse`` decoder so decoding concatenates without spaces).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    unique = list(dict.fromkeys(chars))
    vocab = {PAD: 0, EOS: 1, UNK: 2, **{c: i + 3 for i, c in enumerate(unique)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    if chat_template is not None:
        out.chat_template = chat_template
    return out


def render_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of ``prompt`` as the policy sees it. With a chat template (``tokenizer.chat_template`` set): the
    prompt as one user message, rendered by ``apply_chat_template`` with the assistant's turn opened
    (``add_generation_prompt``), special tokens as the template writes them. Without one: the plain encoding,
    the tokenizer's own special tokens included (e.g. a BOS), as ``tokenizer(prompt)`` gives it."""
    if not getattr(tokenizer, "chat_template", None):
        return list(tokenizer(prompt)["input_ids"])
    try:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
    except Exception as e:  # jinja2 raises its own error types for a broken template
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        msg = f"the tokenizer's chat template failed to render a prompt ({first}); fix or unset tokenizer.chat_template"
        raise TokenizerError(msg) from None
    if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding, 4.x a list
        ids = ids["input_ids"]
    return [int(i) for i in ids]


_GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
"""``tokenizer_class`` values of a tokenizer that is entirely its ``tokenizer.json`` (e.g. ``char_tokenizer``)."""


def _declared_class(folder: Path) -> str | None:
    """The ``tokenizer_class`` in ``folder/tokenizer_config.json``, if it names one."""
    try:
        value = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def load_tokenizer(path: str | Path):
    """The tokenizer saved with a model in local directory ``path`` (``AutoTokenizer``), left-padded, with a pad
    token (the EOS token when the tokenizer has none)."""
    from transformers import AutoTokenizer

    p = Path(path)
    if not p.is_dir():
        raise TokenizerError(f"tokenizer path {str(p)!r} is not a directory; pass the folder of a saved model")
    try:
        if _declared_class(p) in _GENERIC_CLASSES:
            # the folder's tokenizer.json is the whole tokenizer: load it as it is. AutoTokenizer (transformers 5)
            # would pick the class of config.json's model type instead (Qwen2Tokenizer for a tiny Qwen2 model),
            # which replaces the pre-tokenizer and decoder: the char tokenizer would then drop every space
            from transformers import PreTrainedTokenizerFast

            tok = PreTrainedTokenizerFast.from_pretrained(str(p), local_files_only=True)
        else:
            tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except (OSError, ValueError) as e:
        msg = f"no usable tokenizer in {p} ({e}); save one there with tokenizer.save_pretrained(DIR)"
        raise TokenizerError(msg) from None
    if tok.eos_token_id is None:
        raise TokenizerError(f"the tokenizer in {p} has no EOS token; completions could never stop")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok
