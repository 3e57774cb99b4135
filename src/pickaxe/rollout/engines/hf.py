"""``HFEngine``: batched, KV-cached generation with a ``transformers`` causal LM (CPU or GPU)."""

from __future__ import annotations

import inspect
import itertools
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from pickaxe.models.lm import process_logits
from pickaxe.rollout.engines.base import Completion, SamplingParams


class HFEngine:
    """Samples from a ``transformers`` causal LM with our own decode loop over its KV cache.

    Why not ``model.generate``: (1) the sampler's log-probs must come from exactly the processed logits the token
    was drawn from (``pickaxe.models.lm.process_logits``, the same function the learner uses), in float32;
    (2) sampling draws from the engine's own seeded ``torch.Generator``, so rollouts are reproducible from the run
    seed whatever else touches the global RNG; (3) rows that finished are dropped from the batch and its cache, so
    a step costs only the still-running rows. Prompts are left-padded and positions skip the padding, as in the
    learner's forward pass (``pickaxe.models.lm.completion_logprobs``).

    ``model`` may be the learner's own module (then ``sync_weights`` only records the version) or a copy.
    """

    def __init__(
        self,
        model: nn.Module,
        eos_token_id: int,
        pad_token_id: int,
        max_batch: int = 512,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.eos_token_id = int(eos_token_id)
        self.pad_token_id = int(pad_token_id)
        self.max_batch = max_batch
        self.version = 0
        self.device = next(model.parameters()).device
        # a model on the meta device (a sharded learner other than rank 0, which never generates): a host generator
        self.generator = torch.Generator(device=self.device if self.device.type != "meta" else "cpu")
        self.generator.manual_seed(seed)
        params = inspect.signature(model.forward).parameters
        self._keep_last = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._cache_arg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.x
        self.generated_tokens = 0
        self.generate_s = 0.0

    def sync_weights(self, policy: nn.Module, version: int) -> None:
        """Copy ``policy``'s weights unless it is the engine's own model; record ``version``."""
        if policy is not self.model:
            self.model.load_state_dict(policy.state_dict())
        self.version = version

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """Complete every prompt ``params.n`` times, in chunks of at most ``max_batch`` rows."""
        start = time.perf_counter()
        rows = [(i, list(p)) for i, p in enumerate(prompts) for _ in range(params.n)]
        if any(len(p) == 0 for _, p in rows):
            raise ValueError("HFEngine.generate got an empty prompt; every prompt needs at least one token")
        out: list[Completion] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for s in range(0, len(rows), self.max_batch):
                out.extend(self._generate_chunk(rows[s : s + self.max_batch], params))
        finally:
            self.model.train(was_training)
        self.generate_s += time.perf_counter() - start
        self.generated_tokens += sum(len(c.token_ids) for c in out)
        return out

    def _generate_chunk(self, rows: list[tuple[int, list[int]]], params: SamplingParams) -> list[Completion]:
        B, P = len(rows), max(len(p) for _, p in rows)
        ids = torch.full((B, P), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((B, P), dtype=torch.long)
        for r, (_, p) in enumerate(rows):
            ids[r, P - len(p) :] = torch.tensor(p)
            mask[r, P - len(p) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        tokens = torch.full((B, params.max_new_tokens), self.pad_token_id, dtype=torch.long, device=self.device)
        logps = torch.zeros((B, params.max_new_tokens), device=self.device)
        lengths = torch.zeros(B, dtype=torch.long, device=self.device)
        finished = torch.zeros(B, dtype=torch.bool, device=self.device)
        alive = torch.arange(B, device=self.device)  # batch rows still generating, in cache order
        # the n samples of a prompt share its prefill: run each distinct prompt once, then copy its KV cache rows
        owner = list(itertools.accumulate(int(r > 0 and rows[r][0] != rows[r - 1][0]) for r in range(B)))
        firsts = [r for r in range(B) if r == 0 or owner[r] != owner[r - 1]]
        shared = len(firsts) < B
        index = torch.tensor(firsts, device=self.device) if shared else alive
        out = self.model(
            input_ids=ids[index], attention_mask=mask[index], position_ids=pos[index], use_cache=True, **self._keep_last
        )
        cache: Any = _cache_of(out)
        logits = out.logits[:, -1]
        if shared:
            expand = torch.tensor(owner, device=self.device)
            cache.batch_select_indices(expand)
            logits = logits[expand]
        next_pos = pos[:, -1:] + 1
        for t in range(params.max_new_tokens):
            logits = process_logits(logits, params.temperature, params.top_k, params.top_p)
            logprobs = logits.log_softmax(-1)
            if params.greedy:
                tok = logits.argmax(-1)
            else:
                tok = torch.multinomial(logprobs.exp(), 1, generator=self.generator).squeeze(-1)
            tokens[alive, t] = tok
            logps[alive, t] = logprobs.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
            lengths[alive] = t + 1
            done = tok == self.eos_token_id
            finished[alive] = done
            if t + 1 == params.max_new_tokens or bool(done.all()):
                break
            if bool(done.any()):  # drop finished rows from the batch and the KV cache
                keep = (~done).nonzero().squeeze(-1)
                alive, tok, mask, next_pos = alive[keep], tok[keep], mask[keep], next_pos[keep]
                cache.batch_select_indices(keep)
            mask = torch.cat([mask, mask.new_ones((len(alive), 1))], dim=-1)
            out = self.model(
                input_ids=tok.unsqueeze(-1),
                attention_mask=mask,
                position_ids=next_pos,
                use_cache=True,
                **{self._cache_arg: cache},
                **self._keep_last,
            )
            cache, logits = _cache_of(out), out.logits[:, -1]
            next_pos = next_pos + 1
        tokens, logps, lengths, finished = tokens.cpu(), logps.cpu(), lengths.cpu(), finished.cpu()
        return [
            Completion(
                prompt_index=rows[r][0],
                token_ids=tokens[r, : lengths[r]].tolist(),
                logprobs=logps[r, : lengths[r]].tolist(),
                finished=bool(finished[r]),
            )
            for r in range(B)
        ]

    def state_dict(self) -> dict[str, Any]:
        """Sampling RNG state and weight version."""
        return {"generator": self.generator.get_state(), "version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.generator.set_state(state["generator"])
        self.version = int(state["version"])


def _cache_of(out: Any) -> Any:
    """The KV cache of a model output (``cache`` in transformers >= 5.x, ``past_key_values`` before)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values
