"""Preference pairs as Batches for reward models and DPO, and a reward model as a batched ``PromptEnv`` reward.

``pack_pairs`` lays each pair out as two rows of the collector's layout (see ``text_collector.pack``: prompt
left-padded, response right-padded, ``loss_mask`` on the response and its EOS): row ``2i`` holds pair ``i``'s
chosen response, row ``2i + 1`` its rejected one. ``pair`` (an id per row, the same for both rows of a pair) and
``chosen`` (True on the chosen row) say which is which; learners pair rows by these keys, not by position.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from pickaxe.data.batch import Batch
from pickaxe.envs.text.preferences import PreferencePair
from pickaxe.models.reward import RewardModel
from pickaxe.models.sharding import is_meta
from pickaxe.rollout.text_collector import pack
from pickaxe.utils import visiting

__all__ = ["RewardModelScorer", "encode_response", "pack_pairs", "pair_batches"]


def encode_response(tokenizer: Any, text: str, eos: bool = True) -> list[int]:
    """Token ids of a response: its text without special tokens, then EOS (what a finished completion ends with)
    unless ``eos`` is False. Reward models and DPO see responses in this form, in training and in scoring."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return [*ids, int(tokenizer.eos_token_id)] if eos else ids


def pack_pairs(
    pairs: Sequence[PreferencePair],
    tokenizer: Any,
    pair_ids: Sequence[int] | None = None,
    margin_key: str | None = None,
    eos: bool = True,
) -> Batch:
    """A 1-D Batch of ``2 * len(pairs)`` rows: ``input_ids``, ``attention_mask``, ``loss_mask`` (see ``pack``),
    ``pair`` (``pair_ids``, default ``0..n-1``: DPO caches reference log-probs under these ids, so give each
    distinct pair one id for the whole run, e.g. its index in the dataset) and ``chosen`` (bool).

    ``margin_key`` copies each pair's ``metadata[margin_key]`` (a number: how strongly chosen is preferred) to a
    float ``margin`` row key, which the reward model's Bradley–Terry loss adds to the config's margin.
    """
    if not pairs:
        raise ValueError("pack_pairs needs at least one preference pair")
    ids = list(range(len(pairs))) if pair_ids is None else [int(i) for i in pair_ids]
    if len(ids) != len(pairs) or len(set(ids)) != len(ids):
        raise ValueError(
            f"pair_ids must hold {len(pairs)} distinct ids, one per pair; got {len(ids)} ({len(set(ids))} distinct)"
        )
    prompts, responses = [], []
    for p in pairs:
        prompt = list(tokenizer(p.prompt)["input_ids"])
        prompts += [prompt, prompt]
        responses += [encode_response(tokenizer, p.chosen, eos), encode_response(tokenizer, p.rejected, eos)]
    data = pack(prompts, responses, int(tokenizer.pad_token_id))
    data["pair"] = torch.tensor(ids, dtype=torch.long).repeat_interleave(2)
    data["chosen"] = torch.tensor([True, False]).repeat(len(pairs))
    if margin_key is not None:
        margins = []
        for i, p in enumerate(pairs):
            value = p.metadata.get(margin_key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(
                    f"pair {ids[i]} has no numeric metadata[{margin_key!r}] (got {value!r}); add the margin to every "
                    "row or pass margin_key=None"
                )
            margins.append(float(value))
        data["margin"] = torch.tensor(margins, dtype=torch.float32).repeat_interleave(2)
    return TensorDict(data, batch_size=[2 * len(pairs)])


def pair_batches(
    pairs: Sequence[PreferencePair],
    tokenizer: Any,
    batch_size: int,
    epochs: int = 1,
    seed: int = 0,
    shuffle: bool = True,
    margin_key: str | None = None,
) -> Iterator[Batch]:
    """Batches of ``batch_size`` pairs (the last of an epoch may be smaller), ``epochs`` passes over ``pairs``,
    shuffled per epoch by ``seed``. Each pair's id is its index in ``pairs``, the same in every epoch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(pairs)) if shuffle else np.arange(len(pairs))
        for s in range(0, len(pairs), batch_size):
            idx = [int(i) for i in order[s : s + batch_size]]
            yield pack_pairs([pairs[i] for i in idx], tokenizer, idx, margin_key)


class RewardModelScorer:
    """A reward model as a ``PromptEnv`` reward ``fn(prompt, completion, metadata) -> float``, and batched (a
    :class:`~pickaxe.envs.text.rewards.BatchReward`, so the ``TextCollector`` scores a whole batch in one call):
    ``batch(prompts, completions, metadatas)`` scores ``rows`` sequences per forward with one host read per call.
    Completions are encoded like training responses (:func:`encode_response`, EOS appended); the model scores in
    eval mode. Metadata is not used. With ``offload_to`` (a device) the model waits in host memory and visits that
    device for each batch it scores (``--collector.offload-reward-model``).

    :meth:`shard` splits the model across sharded learners (``--dist.shard fsdp``): each holds 1/N of it and
    :meth:`score_tokens` becomes a collective every learner calls with the same rows (the launcher has the other
    learners join rank 0's calls)."""

    __name__ = "reward_model"

    def __init__(self, model: RewardModel, tokenizer: Any, rows: int = 64, offload_to: Any = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.rows = rows
        self.offload_to = None if offload_to is None else torch.device(offload_to)
        self.sharded = False
        if self.offload_to is not None and not is_meta(model):  # kept on the host; it visits the device to score
            self.model.to("cpu")

    def __call__(self, prompt: str, completion: str, metadata: dict[str, Any] | None = None) -> float:
        """The reward model's score of one completion."""
        return self.batch([prompt], [completion])[0]

    def batch(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        metadatas: Sequence[dict[str, Any]] | None = None,
    ) -> list[float]:
        """Scores of ``completions`` (``completions[i]`` answers ``prompts[i]``), in order; ``metadatas`` is
        accepted for the ``BatchReward`` protocol and ignored."""
        if len(prompts) != len(completions):
            raise ValueError(f"got {len(prompts)} prompts and {len(completions)} completions; pass one prompt each")
        if not prompts:
            return []
        prompt_ids = [list(self.tokenizer(p)["input_ids"]) for p in prompts]
        responses = [encode_response(self.tokenizer, c) for c in completions]
        data = pack(prompt_ids, responses, int(self.tokenizer.pad_token_id))
        return self.score_tokens(data["input_ids"], data["attention_mask"]).cpu().tolist()

    def shard(self, offload: str = "none") -> None:
        """Shard the reward model in place across the learners (FSDP2, one decoder layer per unit): every learner
        calls it, each then holds 1/N of the weights, rank 0's (the other learners' rows are scattered from rank
        0's whole model, one unit at a time; they may have built theirs on the ``meta`` device, never holding it
        whole). Frozen, it is sharded in float32 whatever the policy's autocast, so its scores are the unsharded
        model's. With ``offload_to`` (or ``offload`` other than none) the shards wait in host memory and visit the
        device a unit at a time while they score (FSDP's CPU offload instead of the whole model's visit)."""
        import torch.distributed as dist

        from pickaxe.models.sharding import scatter_into, shard_from, shard_model

        if self.offload_to is not None:  # the mesh is the device's; FSDP then keeps the shards on the host
            if not is_meta(self.model):
                self.model.to(self.offload_to)
            offload = "params"
        if dist.get_rank() == 0:
            scatter_into(self.model, None)  # the others' rows, then its own shards in place
            shard_model(self.model, offload)  # type: ignore[arg-type]
        else:
            shard_from(self.model, None, offload)  # type: ignore[arg-type]
        self.sharded = True

    @torch.no_grad()
    def score_tokens(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``[B]`` float32 scores of packed rows (prompt left-padded, response right-padded: :func:`pack`), ``rows``
        sequences per forward, in eval mode. Sharded, a collective every learner calls with the same rows: the
        blocks of ``rows`` rows are dealt out among the learners (block j to learner j mod N, the blocks of the
        unsharded call, so the same scores), a learner with fewer runs a discarded one-row pass (every forward of a
        sharded model gathers its units from all learners), and the scores are summed over the learners."""
        if not self.sharded:
            with visiting(self.model, self.offload_to):
                device = next(self.model.parameters()).device
                with _eval_mode(self.model):
                    return self.model.score(input_ids.to(device), attention_mask.to(device), self.rows)
        import torch.distributed as dist

        from pickaxe.models.sharding import compute_device

        device = compute_device(self.model)
        ids, attn = input_ids.to(device), attention_mask.to(device)
        rank, world = dist.get_rank(), dist.get_world_size()
        n, size = ids.shape[0], self.rows
        blocks = -(-n // size)
        mine = range(rank, blocks, world)
        out = torch.zeros(n, dtype=torch.float32, device=device)
        with _eval_mode(self.model):
            for j in mine:
                block = slice(j * size, (j + 1) * size)
                out[block] = self.model(ids[block], attn[block])
            for _ in range(-(-blocks // world) - len(mine)):  # padding passes: as many forwards as every learner
                self.model(ids[:1], attn[:1])
        self.model.reshard()  # no backward pass frees the root's gathered weights: free them now
        dist.all_reduce(out)
        return out


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode for the block, back in its former mode after it (also after an error)."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
