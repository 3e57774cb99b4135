"""Models, tokenizer and the hf engine: sampler log-probs equal learner log-probs (greedy, temperature, top-k/p,
left padding), loss_mask covers exactly the generated tokens, sampling is seeded, vLLM fails clearly."""

from pathlib import Path

import pytest
import torch

from pickaxe.envs.text import Arithmetic, PromptEnv
from pickaxe.errors import PickaxeError
from pickaxe.models.lm import ModelError, load_lm, sequence_logprobs, tiny_lm
from pickaxe.models.tokenizer import char_tokenizer
from pickaxe.rollout.engines import HFEngine, SamplingParams
from pickaxe.rollout.text_collector import TextCollector, pack


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return tiny_lm(len(tok), hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=0)


def test_char_tokenizer_round_trip(tok) -> None:
    ids = tok("12+345=", add_special_tokens=False)["input_ids"]
    assert len(ids) == 7 and tok.decode(ids) == "12+345="
    assert tok.decode([*ids, tok.eos_token_id], skip_special_tokens=True) == "12+345="
    assert (tok.pad_token_id, tok.eos_token_id, tok.padding_side) == (0, 1, "left")


def test_tiny_lm_is_seeded_and_both_archs_build(tok) -> None:
    a, b = tiny_lm(len(tok), hidden=32, layers=1, seed=3), tiny_lm(len(tok), hidden=32, layers=1, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    llama = tiny_lm(len(tok), arch="llama", hidden=32, layers=1, heads=4, kv_heads=2)
    assert type(llama).__name__ == "LlamaForCausalLM"


def test_load_lm_round_trip_and_errors(tok, model, tmp_path: Path) -> None:
    model.save_pretrained(tmp_path / "m")
    loaded = load_lm(tmp_path / "m", device="cpu")
    ids = torch.tensor([[4, 5, 6]])
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-6)
    with pytest.raises(ModelError, match="does not exist"):
        load_lm(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match=r"no config\.json"):
        load_lm(tmp_path / "empty")


PROMPTS = ["1+2=", "12+34=", "999+1=", "7="]  # different lengths: the batch is left-padded


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=6, temperature=0.0),
        SamplingParams(max_new_tokens=6, temperature=1.0, n=3),
        SamplingParams(max_new_tokens=6, temperature=0.7, n=2),
        SamplingParams(max_new_tokens=6, temperature=0.9, top_k=10, top_p=0.8, n=2),
    ],
    ids=["greedy", "t1", "t0.7", "topk-topp"],
)
def test_sampler_logprobs_equal_learner_logprobs(tok, model, params: SamplingParams) -> None:
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, max_batch=5, seed=0)  # chunks of 5 rows
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    completions = engine.generate(prompts, params)
    assert len(completions) == len(prompts) * params.n
    assert [c.prompt_index for c in completions] == [i for i in range(len(prompts)) for _ in range(params.n)]
    data = pack(
        [prompts[c.prompt_index] for c in completions],
        [c.token_ids for c in completions],
        tok.pad_token_id,
        [c.logprobs for c in completions],
    )
    temperature = params.temperature or 1.0
    with torch.no_grad():
        learner = sequence_logprobs(
            model, data["input_ids"], data["attention_mask"], temperature, params.top_k, params.top_p
        )
    m = data["loss_mask"]
    assert torch.isfinite(learner[m]).all()
    assert torch.allclose(learner[m], data["logprob"][m], atol=1e-5), (learner[m] - data["logprob"][m]).abs().max()


def test_samples_of_a_prompt_share_one_prefill(tok, model) -> None:
    """n samples of a prompt are prefilled once (the KV cache rows are copied): the prefill runs on the distinct
    prompts only, and the completions equal those of the prompts written out n times (same seed)."""
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    params = SamplingParams(max_new_tokens=6, temperature=1.0, n=4)
    rows: list[int] = []
    hook = model.register_forward_hook(
        lambda m, args, kwargs, out: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        shared = HFEngine(model, tok.eos_token_id, tok.pad_token_id, max_batch=6, seed=3).generate(prompts, params)
    finally:
        hook.remove()
    assert rows[0] == 2  # the first chunk of 6 rows holds prompts 0 (4 samples) and 1 (2 samples)
    spelled = [p for p in prompts for _ in range(params.n)]
    plain = HFEngine(model, tok.eos_token_id, tok.pad_token_id, max_batch=6, seed=3).generate(
        spelled, SamplingParams(max_new_tokens=6, temperature=1.0, n=1)
    )
    assert [c.token_ids for c in shared] == [c.token_ids for c in plain]
    a = torch.tensor([x for c in shared for x in c.logprobs])
    b = torch.tensor([x for c in plain for x in c.logprobs])
    assert torch.allclose(a, b, atol=1e-5)


def test_sampling_is_seeded(tok, model) -> None:
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    params = SamplingParams(max_new_tokens=5, n=2)
    a = HFEngine(model, 1, 0, seed=7).generate(prompts, params)
    b = HFEngine(model, 1, 0, seed=7).generate(prompts, params)
    c = HFEngine(model, 1, 0, seed=8).generate(prompts, params)
    assert [x.token_ids for x in a] == [x.token_ids for x in b] != [x.token_ids for x in c]


def test_pack_masks_by_hand() -> None:
    out = pack([[5, 6], [7]], [[8, 1], [9, 9, 9]], pad_token_id=0, completion_logprobs=[[-1.0, -2.0], [-3.0] * 3])
    assert out["input_ids"].tolist() == [[5, 6, 8, 1, 0], [0, 7, 9, 9, 9]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]]
    assert out["loss_mask"].int().tolist() == [[0, 0, 1, 1, 0], [0, 0, 1, 1, 1]]  # EOS (1) included
    assert out["logprob"].tolist() == [[0, 0, -1, -2, 0], [0, 0, -3, -3, -3]]


def test_collector_loss_mask_is_exactly_the_generated_tokens(tok, model) -> None:
    env = PromptEnv(Arithmetic(2), seed=0, eval_size=10)
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, seed=1)
    # a model that says EOS often: boost the EOS logit so some completions stop and some are truncated
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] += 0.3 * model.lm_head.weight.abs().mean()
    sampling = SamplingParams(max_new_tokens=4, n=4)
    collector = TextCollector(env, engine, tok, prompts=6, sampling=sampling, policy=model)
    batch = collector.collect()
    assert batch.batch_size == torch.Size([24])
    for key in ("input_ids", "attention_mask", "loss_mask", "logprob", "reward", "advantage", "group"):
        assert batch.get(key, None) is not None
    ids, attn, loss = batch["input_ids"], batch["attention_mask"].bool(), batch["loss_mask"]
    assert not (loss & ~attn).any()  # never on padding
    eos_rows = 0
    for r in range(24):
        gen = ids[r][loss[r]].tolist()
        assert 1 <= len(gen) <= 4
        assert tok.eos_token_id not in gen[:-1]  # nothing after EOS is generated
        eos_rows += gen[-1] == tok.eos_token_id
        first = int(loss[r].nonzero()[0])
        prompt = ids[r][attn[r]][: first - int((~attn[r][:first]).sum())]
        assert not loss[r][:first].any() and tok.decode(prompt.tolist()).endswith("=")  # prompt part is masked
        assert not loss[r][first + len(gen) :].any()  # right padding is masked
    assert 0 < eos_rows < 24  # both cases were exercised
    assert batch["group"].view(6, 4).unique(dim=1).shape == (6, 1)  # one id per group of 4
    assert collector.metrics()["rollout/truncated_fraction"] == pytest.approx(1 - eos_rows / 24)
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] -= 0.3 * model.lm_head.weight.abs().mean()


def test_vllm_engine_absent_gives_clear_error() -> None:
    pytest.importorskip("transformers")
    try:
        import vllm  # noqa: F401
    except ImportError:
        from pickaxe.rollout.engines import VLLMEngine

        with pytest.raises(PickaxeError, match=r"pip install 'pickaxe\[vllm\]'"):
            VLLMEngine("some/model", eos_token_id=1)
    else:
        pytest.skip("vLLM is installed")


def test_tied_embedding_models_save_and_load(tmp_path: Path) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from pickaxe.algos.sft import SFT
    from pickaxe.runs.model import load_model
    from pickaxe.runs.run import Run

    config = Qwen2Config(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    with Run(tmp_path / "run") as run:
        run.save_model(SFT(model).networks())
    copy = Qwen2ForCausalLM(config)
    load_model(tmp_path / "run", SFT(copy).networks())
    assert torch.equal(copy.lm_head.weight, model.lm_head.weight)
    assert copy.lm_head.weight.data_ptr() == copy.model.embed_tokens.weight.data_ptr()  # still tied
