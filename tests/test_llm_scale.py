"""The LLM learner at scale: completion-only, vocabulary-chunked log-probs equal the full-logits ones; no
vocabulary-wide tensor is kept for the backward pass; every compute option (gradient checkpointing, bf16 autocast,
length-sorted, packed and shared-prefix micro-batches, chunk size) gives the plain update; one host read per
optimizer step."""

import copy
import json
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from pickaxe.algos.grpo import GRPO, GRPOConfig
from pickaxe.algos.sft import SFT, SFTConfig
from pickaxe.envs.text import Arithmetic, PromptEnv
from pickaxe.errors import PickaxeError
from pickaxe.models.lm import completion_logprobs, sequence_logprobs, tiny_lm
from pickaxe.rollout.engines import HFEngine
from pickaxe.rollout.text_collector import DemoCollector, TextCollector, pack
from pickaxe.train.build import train

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_training import SAMPLING, TOK, _grpo_batch, _model, _step_grads


def _block(vocab: int, seed: int = 1) -> dict[str, torch.Tensor]:
    """Seven prompt/completion pairs of uneven lengths in the collector's layout."""
    g = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(2, vocab, (int(n),), generator=g).tolist() for n in torch.randint(3, 12, (7,), generator=g)
    ]
    comps = [torch.randint(2, vocab, (int(n),), generator=g).tolist() for n in torch.randint(1, 9, (7,), generator=g)]
    return pack(prompts, comps, 0)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("mode", ["padded", "packed"])
@pytest.mark.parametrize("chunk", [0, 3])
def test_completion_logprobs_equal_full_logits_values_and_gradients(arch: str, mode: str, chunk: int) -> None:
    model = tiny_lm(97, arch=arch, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=0)
    d = _block(97)
    ids, attn, mask = d["input_ids"], d["attention_mask"], d["loss_mask"].bool()
    full = sequence_logprobs(model, ids, attn, 0.7, 5, 1.0)
    (full[mask].sum()).backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    got = completion_logprobs(model, ids, attn, mask, 0.7, 5, 1.0, chunk_tokens=chunk, rows=3, mode=mode)
    (got[mask].sum()).backward()
    assert torch.allclose(got[mask], full[mask], atol=2e-6)
    assert torch.isinf(full[mask]).any() == torch.isinf(got[mask]).any()  # top-k's -inf where the full one has it
    assert (got[~mask] == 0).all()  # prompt and padding: never computed
    for p, g in zip(model.parameters(), want, strict=True):
        assert torch.allclose(p.grad, g, atol=2e-6), (p.grad - g).abs().max()


def _groups(vocab: int, groups: int = 4, n: int = 4, seed: int = 2) -> dict[str, torch.Tensor]:
    """``groups`` prompts of uneven lengths, each with ``n`` completions of uneven lengths, in the collector's
    layout (a GRPO batch)."""
    g = torch.Generator().manual_seed(seed)
    prompts, comps = [], []
    for _ in range(groups):
        prompt = torch.randint(2, vocab, (int(torch.randint(3, 9, (), generator=g)),), generator=g).tolist()
        for _ in range(n):
            prompts.append(prompt)
            comps.append(torch.randint(2, vocab, (int(torch.randint(1, 7, (), generator=g)),), generator=g).tolist())
    return pack(prompts, comps, 0)


@pytest.mark.parametrize(
    ("rows", "min_width", "chunk"),
    [(0, 512, 0), (6, 512, 3), (0, 1, 0)],
    ids=["one-row-per-prompt", "groups-split-by-micro-batch", "groups-split-by-row-width"],
)
def test_shared_prefix_logprobs_equal_full_logits_with_fewer_tokens(
    rows: int, min_width: int, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The completions of a prompt share one pass over it: values and gradients equal the full-logits ones (top-k
    included), and the decoder sees each prompt once per row instead of once per completion."""
    monkeypatch.setattr("pickaxe.data.shared_prefix.MIN_WIDTH", min_width)
    model = tiny_lm(97, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=0)
    d = _groups(97)
    ids, attn, mask = d["input_ids"], d["attention_mask"], d["loss_mask"].bool()
    full = sequence_logprobs(model, ids, attn, 0.7, 5, 1.0)
    full[mask].sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    fed: list[int] = []
    model.model.embed_tokens.register_forward_hook(lambda m, inp, out: fed.append(int((inp[0] != 0).sum())))
    got = completion_logprobs(model, ids, attn, mask, 0.7, 5, 1.0, chunk_tokens=chunk, rows=rows, mode="shared-prefix")
    got[mask].sum().backward()
    assert torch.allclose(got[mask], full[mask], atol=2e-6)
    assert (got[~mask] == 0).all()
    for p, g in zip(model.parameters(), want, strict=True):
        assert torch.allclose(p.grad, g, atol=2e-6), (p.grad - g).abs().max()
    prompt_tokens = int(attn.sum() - mask.sum())  # every copy of every prompt
    if min_width > 1 and rows == 0:
        assert sum(fed) == int(attn.sum()) - prompt_tokens * 3 // 4  # 4 completions per prompt: 1 copy of 4 left
    else:
        assert sum(fed) < int(attn.sum())


def test_shared_prefix_needs_a_4d_mask_kernel() -> None:
    """A model whose attention cannot take the tree-shaped mask gets the padded layout (same numbers); asking a
    shared-prefix layout for a 2-D mask names the fix."""
    from pickaxe.data.layout import sequence_bounds
    from pickaxe.data.shared_prefix import plan_shared_prefix

    model = tiny_lm(97, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=0)
    d = _groups(97)
    ids, attn, mask = d["input_ids"], d["attention_mask"], d["loss_mask"]
    with torch.no_grad():
        sdpa = completion_logprobs(model, ids, attn, mask, mode="shared-prefix")
        model.config._attn_implementation = "eager"
        eager = completion_logprobs(model, ids, attn, mask, mode="shared-prefix")
    assert torch.allclose(sdpa, eager, atol=2e-6)
    layout = plan_shared_prefix(ids, sequence_bounds(attn, mask))
    with pytest.raises(ValueError, match="attn_implementation='sdpa' or set share_prompts=False"):
        layout.padding_mask()


def test_no_vocabulary_wide_tensor_is_kept_for_the_backward_pass() -> None:
    vocab, chunk = 4096, 4
    model = tiny_lm(vocab, hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, seed=0)
    d = _block(vocab)
    ids, attn, mask = d["input_ids"], d["attention_mask"], d["loss_mask"].bool()
    scored = int(mask.sum())
    head_rows: list[int] = []
    model.lm_head.register_forward_hook(lambda m, inp, out: head_rows.append(inp[0].shape[0]))

    def widest_saved(chunk_tokens: int) -> int:
        kept: list[int] = []

        def pack_hook(t: torch.Tensor) -> torch.Tensor:
            if t.shape[-1:] == (vocab,):
                kept.append(t.numel() // vocab)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
            out = completion_logprobs(model, ids, attn, mask, chunk_tokens=chunk_tokens)
        out.sum().backward()
        return max(kept, default=0)

    assert widest_saved(scored) >= scored  # one chunk: the [N, V] logits are kept (the check bites)
    head_rows.clear()
    assert widest_saved(chunk) == 0  # chunked: the logits are recomputed in the backward pass, never kept
    assert max(head_rows) <= chunk  # the output layer never sees more than a chunk ...
    assert sum(head_rows) == 2 * scored  # ... nor a prompt position: each scored token once forward, once again


def _update(base, batch, **options):
    """The gradient the update's optimizer step applied (see ``_step_grads``) and its metrics."""
    cfg = GRPOConfig(lr=1e-3, micro_batch_size=5, kl_coef=0.1, max_grad_norm=1e9, **options)
    algo = GRPO(copy.deepcopy(base), cfg, SAMPLING)
    grads = _step_grads(algo)
    metrics = algo.update(batch.clone())
    return grads[0], metrics


@pytest.fixture(scope="module")
def grpo_case():
    base = _model()
    return base, _grpo_batch(base, reference=_model(seed=5))


@pytest.mark.parametrize(
    ("options", "atol"),
    [
        ({"gradient_checkpointing": True}, 0.0),  # recomputation repeats the same operations: bitwise
        ({"micro_batch_layout": "length-sorted"}, 2e-6),
        ({"micro_batch_layout": "packed"}, 2e-6),
        ({"logprob_chunk_tokens": 3}, 2e-6),
        ({"share_prompts": False}, 2e-6),  # the plain update runs each prompt once per micro-batch
    ],
    ids=["checkpointing", "length-sorted", "packed", "chunked", "unshared-prompts"],
)
def test_each_compute_option_gives_the_plain_update(grpo_case, options: dict, atol: float) -> None:
    base, batch = grpo_case
    plain, plain_metrics = _update(base, batch)
    delta, metrics = _update(base, batch, **options)
    assert plain.abs().max() > 1e-3  # a real gradient
    assert (delta - plain).abs().max() <= atol
    for key in ("loss/policy", "kl/token_mean", "kl/seq_sum_mean", "grpo/clip_fraction"):
        assert metrics[key] == pytest.approx(plain_metrics[key], rel=1e-5, abs=1e-7)


def test_bf16_autocast_update_is_close_to_float32(grpo_case) -> None:
    base, batch = grpo_case
    plain, plain_metrics = _update(base, batch)
    delta, metrics = _update(base, batch, autocast="bf16")
    cos = torch.nn.functional.cosine_similarity(delta, plain, dim=0)
    assert cos > 0.99  # the same gradient up to bf16 rounding
    assert metrics["loss/policy"] == pytest.approx(plain_metrics["loss/policy"], abs=2e-3)
    assert metrics["check/logprob_diff_max"] > 1e-5  # bf16 log-probs are not the float32 sampler's: it did run in bf16
    assert all(p.dtype == torch.float32 for p in base.parameters())


@pytest.mark.parametrize("options", [{}, {"gradient_checkpointing": True}, {"micro_batch_layout": "packed"}])
def test_sft_options_give_the_plain_update(options: dict) -> None:
    base = _model()
    batch = DemoCollector(PromptEnv(Arithmetic(2), seed=0, eval_size=5), TOK, batch_size=12).collect()
    out = []
    for micro, opts in ((12, {}), (5, options)):
        sft = SFT(copy.deepcopy(base), SFTConfig(lr=1e-3, micro_batch_size=micro, max_grad_norm=1e9, **opts))
        grads = _step_grads(sft)
        sft.update(batch.clone())
        out.append(grads[0])
    assert torch.allclose(out[0], out[1], atol=2e-6)


def test_packing_lowers_the_padding_fraction() -> None:
    base = _model()
    d = _block(len(TOK), seed=3)
    batch = TensorDict(dict(d), batch_size=[d["input_ids"].shape[0]])
    fractions = {}
    for micro, layout in ((4, "padded"), (4, "length-sorted"), (7, "padded"), (7, "packed")):
        sft = SFT(copy.deepcopy(base), SFTConfig(micro_batch_size=micro, micro_batch_layout=layout))
        fractions[micro, layout] = sft.update(batch.clone())["perf/padding_fraction"]
    assert fractions[4, "length-sorted"] < fractions[4, "padded"], fractions  # similar lengths share micro-batches
    assert 0.0 <= fractions[7, "packed"] < fractions[7, "padded"], fractions  # short sequences share rows


# ------------------------------------------------------------------ host synchronisations per optimizer step

_READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


def _count_reads(fn) -> int:
    """Calls of the Tensor methods that read a value to the host while ``fn`` runs (on CUDA each one waits for
    the device; on CPU we count them the same way)."""
    count = [0]
    originals = {name: getattr(torch.Tensor, name) for name in _READS}

    def wrap(name):
        original = originals[name]

        def counted(self, *args, **kwargs):
            count[0] += 1
            return original(self, *args, **kwargs)

        return counted

    try:
        for name in _READS:
            setattr(torch.Tensor, name, wrap(name))
        fn()
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    return count[0]


def test_one_host_read_per_optimizer_step() -> None:
    base = _model()
    batch = _grpo_batch(base, reference=_model(seed=5))
    n = len(batch)

    def reads(**kw) -> int:
        algo = GRPO(copy.deepcopy(base), GRPOConfig(lr=1e-3, kl_coef=0.1, **kw), SAMPLING)
        return _count_reads(lambda: algo.update(batch.clone()))

    one = reads(micro_batch_size=n)
    assert reads(micro_batch_size=5) == one  # not per micro-batch
    assert reads(micro_batch_size=1, micro_batch_layout="packed") == one - 1  # no token ids to read: no prompt sharing
    assert reads(micro_batch_size=n, share_prompts=False) == one - 1
    assert reads(micro_batch_size=n, epochs=3) == one + 2  # one per optimizer step
    deep = GRPO(
        tiny_lm(len(TOK), hidden=32, layers=6, heads=4, kv_heads=2, intermediate=64, seed=0),
        GRPOConfig(lr=1e-3, kl_coef=0.1, micro_batch_size=n),
        SAMPLING,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # another model than the sampler's: the on-policy check warns
        assert _count_reads(lambda: deep.update(batch.clone())) == one  # not per parameter (3x the tensors)
    assert one == 3  # the planning reads of the sequence bounds and of the token ids, and the step's one read


def test_sft_reads_once_per_update() -> None:
    batch = DemoCollector(PromptEnv(Arithmetic(2), seed=0, eval_size=5), TOK, batch_size=12).collect()

    def reads(micro: int) -> int:
        sft = SFT(_model(), SFTConfig(micro_batch_size=micro))
        return _count_reads(lambda: sft.update(batch.clone()))

    assert reads(12) == reads(2) == 2


def test_offloaded_reference_gives_the_same_log_probs_and_stays_on_the_host() -> None:
    model, reference = _model(), _model(seed=5)
    batches = []
    for offload in (False, True):
        env = PromptEnv(Arithmetic(2), seed=0, eval_size=5)
        engine = HFEngine(model, TOK.eos_token_id, TOK.pad_token_id, seed=0)
        collector = TextCollector(env, engine, TOK, 4, SAMPLING, model, reference, offload_reference=offload)
        batches.append(collector.collect())
    assert torch.equal(batches[0]["ref_logprob"], batches[1]["ref_logprob"])
    assert batches[1]["ref_logprob"][batches[1]["loss_mask"]].abs().sum() > 0
    assert all(p.device.type == "cpu" for p in reference.parameters())


@pytest.mark.filterwarnings("ignore:GRPO on-policy check")  # bf16 learner vs float32 sampler: ~1e-3 apart
def test_a_run_with_every_compute_option_trains_and_logs_them(tmp_path: Path) -> None:
    from test_llm_training import _records, _tiny_cfg

    cfg = _tiny_cfg(seed=3)
    for key, value in {
        "micro_batch_layout": "packed",
        "gradient_checkpointing": True,
        "autocast": "bf16",
        "logprob_chunk_tokens": 7,
    }.items():
        setattr(cfg.algo, key, value)
    cfg.collector.offload_reference = True
    result, _ = train(cfg, run_dir=tmp_path / "run")
    assert result.steps == 32
    records = _records(tmp_path / "run")
    updates = [r for r in records if "loss/policy" in r]
    assert updates and all(math.isfinite(r["loss/policy"]) for r in updates)
    assert all(0.0 <= r["perf/padding_fraction"] < 1.0 for r in updates)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["algo"]["micro_batch_layout"] == "packed" and saved["collector"]["offload_reference"] is True


def test_compute_options_parse_from_the_command_line_and_bad_values_are_named() -> None:
    from pickaxe.recipes.args import parse_train

    cfg, _ = parse_train(
        "arith-grpo",
        [
            "--algo.micro-batch-layout",
            "length-sorted",
            "--algo.gradient-checkpointing",
            "True",
            "--algo.autocast",
            "bf16",
            "--algo.logprob-chunk-tokens",
            "128",
            "--collector.offload-reference",
            "True",
        ],
    )
    assert (cfg.algo.micro_batch_layout, cfg.algo.gradient_checkpointing, cfg.algo.autocast) == (
        "length-sorted",
        True,
        "bf16",
    )
    assert cfg.algo.logprob_chunk_tokens == 128 and cfg.collector.offload_reference
    with pytest.raises(PickaxeError, match=r"--algo.logprob-chunk-tokens must be >= 0, got -1"):
        parse_train("arith-grpo", ["--algo.logprob-chunk-tokens", "-1"])
    with pytest.raises(PickaxeError, match=r"micro.batch.layout"):
        parse_train("arith-grpo", ["--algo.micro-batch-layout", "sorted"])


def test_all_finite_reads_once_however_many_tensors() -> None:
    from pickaxe.algos.base import all_finite

    params = list(tiny_lm(len(TOK), hidden=32, layers=6, heads=4, kv_heads=2, intermediate=64).parameters())
    assert _count_reads(lambda: all_finite(params)) == 1  # the Trainer's check of the weights after each update
    assert all_finite(params) and all_finite([])
    params[-3].data.view(-1)[0] = float("nan")
    assert not all_finite(params)


def test_generation_from_a_checkpointed_learner_skips_checkpointing_and_keeps_the_kv_cache() -> None:
    from pickaxe.models.lm import enable_checkpointing
    from pickaxe.rollout.engines import SamplingParams

    plain = _model()
    model = copy.deepcopy(plain)
    enable_checkpointing(model)
    model.train()  # as the learner leaves it mid-update
    calls = []
    for layer in model.model.layers:
        inner = layer._gradient_checkpointing_func
        layer._gradient_checkpointing_func = lambda *a, inner=inner, **k: calls.append(1) or inner(*a, **k)
    widths: list[int] = []
    model.model.layers[0].register_forward_pre_hook(lambda mod, args: widths.append(args[0].shape[1]))
    prompts = [TOK.encode("12+34="), TOK.encode("7+8="), TOK.encode("99+1=")]
    params = SamplingParams(max_new_tokens=6, temperature=1.0, n=2)
    got = HFEngine(model, TOK.eos_token_id, TOK.pad_token_id, seed=3).generate(prompts, params)
    want = HFEngine(plain, TOK.eos_token_id, TOK.pad_token_id, seed=3).generate(prompts, params)
    assert calls == [] and model.training  # no recomputation set up while sampling; the learner's mode restored
    assert widths[0] == max(len(p) for p in prompts) and set(widths[1:]) == {1}  # one new token per step ...
    assert [c.token_ids for c in got] == [c.token_ids for c in want]  # ... over the cache: the plain model's samples
    for a, b in zip(got, want, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)
    ids = torch.tensor([prompts[0]])
    scored = torch.ones_like(ids).index_fill(1, torch.tensor([0]), 0)
    completion_logprobs(model, ids, torch.ones_like(ids), scored).sum().backward()
    assert len(calls) == len(model.model.layers)  # the counter does see the learner's checkpointed forward
