"""Tokenizers for language models: a local character-level one (built with ``tokenizers``, no download) and
loading a model's own tokenizer from a local directory."""

from __future__ import annotations

import string
from pathlib import Path

from pickaxe.errors import PickaxeError

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
DEFAULT_CHARS = string.digits + string.ascii_letters + " +-*/=()<>,.:;?!'\"_#[]{}|\n"
"""Characters of ``char_tokenizer``'s default vocabulary: enough for every built-in task's prompts and answers."""


class TokenizerError(PickaxeError):
    """A tokenizer that cannot be loaded or lacks what pickaxe needs (an EOS token)."""


def char_tokenizer(chars: str = DEFAULT_CHARS, model_max_length: int = 512):
    """A character-level ``PreTrainedTokenizerFast``: one token per character, ``<pad>`` = 0, ``<eos>`` = 1,
    ``<unk>`` = 2, left padding (what batched generation needs).

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
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def load_tokenizer(path: str | Path):
    """The tokenizer saved with a model in local directory ``path`` (``AutoTokenizer``), left-padded, with a pad
    token (the EOS token when the tokenizer has none)."""
    from transformers import AutoTokenizer

    p = Path(path)
    if not p.is_dir():
        raise TokenizerError(f"tokenizer path {str(p)!r} is not a directory; pass the folder of a saved model")
    try:
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
