"""Reward specs (``--data.reward``), batched rewards, metric-only rewards and rewards that fail on some samples."""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import pytest
import torch

import reward_fns
from pickaxe.algos.grpo import GRPO, GRPOConfig
from pickaxe.algos.llm_core import group_advantages
from pickaxe.envs.text import Arithmetic, Example, PromptEnv
from pickaxe.envs.text.rewards import (
    REWARDS,
    RewardFailedError,
    RewardSpecError,
    RewardWarning,
    exact_match,
    numeric_match,
    parse_reward_spec,
    score_rewards,
)
from pickaxe.envs.text.synthetic_preferences import sortedness
from pickaxe.errors import ConfigError
from pickaxe.models.lm import tiny_lm
from pickaxe.models.reward import tiny_reward_model
from pickaxe.models.tokenizer import SIMPLE_CHAT_TEMPLATE, char_tokenizer
from pickaxe.rollout.engines import HFEngine, SamplingParams
from pickaxe.rollout.pairs import RewardModelScorer
from pickaxe.rollout.text_collector import TextCollector

TOK = char_tokenizer()
SAMPLING = SamplingParams(max_new_tokens=4, temperature=1.0, n=4)


def _model(seed: int = 0) -> torch.nn.Module:
    return tiny_lm(len(TOK), hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=seed)


def _reward_model() -> torch.nn.Module:
    return tiny_reward_model(len(TOK), hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=1)


def _collector(rewards, model: torch.nn.Module | None = None, prompts: int = 2) -> TextCollector:
    model = model or _model()
    env = PromptEnv(Arithmetic(2), rewards=rewards, seed=0, eval_size=5)
    engine = HFEngine(model, TOK.eos_token_id, TOK.pad_token_id, seed=0)
    return TextCollector(env, engine, TOK, prompts=prompts, sampling=SAMPLING, policy=model)


# ---------------------------------------------------------------------------------------------- specs


def test_spec_reads_builtins_weights_and_import_paths() -> None:
    terms = parse_reward_spec(" exact + 0.5*reward_fns:length_score+-1e-1 * numeric+0*reward_fns:Shouting ")
    names = [name for name, _, _ in terms]
    assert names == ["exact", "reward_fns.length_score", "numeric", "reward_fns.Shouting"]
    assert [w for _, _, w in terms] == [1.0, 0.5, -0.1, 0.0]
    assert terms[0][1] is exact_match and terms[1][1] is reward_fns.length_score and terms[2][1] is numeric_match
    assert isinstance(terms[3][1], reward_fns.Shouting)  # a class is instantiated with no arguments
    env = PromptEnv([Example("1+1=", "2")], rewards=terms, eval_source=[Example("2+2=", "4")])
    total, parts = env.score(env.sample(1)[0], "2")
    assert parts == {"exact": 1.0, "reward_fns.length_score": 1.0, "numeric": 1.0, "reward_fns.Shouting": 0.0}
    assert total == pytest.approx(1.0 + 0.5 - 0.1)  # Shouting has weight 0: logged, not summed
    assert env.score(env.sample(1)[0], "SIX")[0] == pytest.approx(0.5 * 3)


def test_named_rewards_resolve_before_builtins() -> None:
    gold = reward_fns.length_score
    terms = parse_reward_spec("exact+0*gold", named={"gold": gold, "exact": numeric_match})
    assert terms == [("exact", numeric_match, 1.0), ("gold", gold, 0.0)]
    assert set(REWARDS) == {"exact", "numeric"}


def test_a_spec_module_in_the_current_directory_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_local_rewards.py").write_text("def score(prompt, completion, metadata):\n    return 2.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_local_rewards", raising=False)
    ((name, fn, weight),) = parse_reward_spec("my_local_rewards:score")
    assert (name, fn("p", "c", {}), weight) == ("my_local_rewards.score", 2.0, 1.0)
    monkeypatch.delitem(sys.modules, "my_local_rewards")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("  ", r"the reward spec is empty; name at least one reward, e.g. 'exact'"),
        ("exat", r"unknown reward 'exat' in 'exat'; did you mean 'exact'\? known names: exact, numeric"),
        ("reward_fns.length_score", r"write it as module:function, e.g. 'mypkg.rewards:score'"),
        ("exact+", r"ends with '\+'; remove it or add the reward after it"),
        ("exact-0.5*numeric", r"cannot read the term 'exact-0.5\*numeric'.*negative weight"),
        ("exact+0.5**numeric", r"cannot read the term '0.5\*\*numeric'; write terms as NAME or WEIGHT\*NAME"),
        ("no_such_pkg_xyz.rewards:score", r"no module named 'no_such_pkg_xyz'; check the spelling, install"),
        ("reward_fns:lenght_score", r"'reward_fns' has no attribute 'lenght_score'; did you mean 'length_score'\?"),
        ("reward_fns:NOT_A_REWARD", r"'reward_fns:NOT_A_REWARD' is a int, not a reward; point at a function"),
        ("reward_fns:make_reward", r"cannot be called as fn\(prompt, completion, metadata\).*call a factory"),
        ("reward_fns:NeedsArgs", r"could not be instantiated with no arguments \(TypeError: .*scale"),
        ("exact+0.5*exact", r"names 'exact' twice; merge them into one term"),
        ("0*exact+0*numeric", r"every reward of '0\*exact\+0\*numeric' has weight 0 \(metric only\)"),
    ],
)
def test_bad_specs_name_the_problem_and_the_fix(spec: str, message: str) -> None:
    with pytest.raises(RewardSpecError, match=message) as info:
        parse_reward_spec(spec)
    assert isinstance(info.value, ConfigError)  # the CLI prints it as one line and exits 2
    assert "\n" not in str(info.value)


def test_a_module_that_fails_to_import_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_rewards_mod.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RewardSpecError, match=r"importing 'broken_rewards_mod' raised ModuleNotFoundError: .*xyz"):
        parse_reward_spec("broken_rewards_mod:score")


# ---------------------------------------------------------------------------------------------- batched scoring


def test_batched_scoring_gives_the_one_by_one_values() -> None:
    scorer = RewardModelScorer(_reward_model(), TOK, rows=3)
    shouting = reward_fns.Shouting()
    rewards = [("rm", scorer, 1.0), ("shout", shouting, 2.0), ("len", reward_fns.length_score, 0.0)]
    examples = [Example(f"sort {i}3{i}=", "") for i in range(5)]
    env = PromptEnv(examples, rewards=rewards, eval_source=examples)
    completions = ["123", "Ab", "", "XYZ1", "x"]
    scores = env.score_batch(examples, completions)
    assert shouting.calls == 1 and scores.valid == [True] * 5 and not scores.failures
    for i, (ex, c) in enumerate(zip(examples, completions, strict=True)):
        total, parts = env.score(ex, c)
        assert parts == pytest.approx({name: values[i] for name, values in scores.parts.items()}, abs=1e-5)
        assert scores.total[i] == pytest.approx(total, abs=1e-5)
        assert total == pytest.approx(parts["rm"] + 2 * parts["shout"], abs=1e-6)  # len has weight 0


def test_an_offloaded_reward_model_visits_the_device_only_while_it_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--collector.offload-reward-model``: the scorer keeps the model on the host, moves it to the device for each
    batch and back after it (also when scoring fails), with the scores of a scorer that never moves it."""
    plain = RewardModelScorer(_reward_model(), TOK, rows=3)
    model = _reward_model()
    moves: list[str] = []
    to = model.to
    monkeypatch.setattr(model, "to", lambda device: moves.append(str(device)) or to(device))
    scorer = RewardModelScorer(model, TOK, rows=3, offload_to="cpu")
    assert moves == ["cpu"]  # kept on the host from the start
    prompts, completions = ["sort 132=", "sort 2=", "x"], ["123", "", "abc"]
    assert scorer.batch(prompts, completions) == pytest.approx(plain.batch(prompts, completions), abs=0)
    assert moves == ["cpu", "cpu", "cpu"]  # to the device ("cpu" here) for the batch, and back
    monkeypatch.setattr(model, "score", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("out of memory")))
    with pytest.raises(RuntimeError, match="out of memory"):
        scorer.batch(prompts, completions)
    assert moves[-1] == "cpu" and len(moves) == 5  # back on the host after a failed batch too


def test_the_collector_scores_a_batch_at_once_and_logs_each_reward() -> None:
    scorer = RewardModelScorer(_reward_model(), TOK)
    seen: list[tuple[list[str], list[str]]] = []
    inner = scorer.batch
    scorer.batch = lambda p, c, m=None: seen.append((list(p), list(c))) or inner(p, c, m)  # type: ignore[method-assign]
    collector = _collector([("proxy", scorer, 1.0), ("gold", sortedness, 0.0)])
    batch = collector.collect()
    assert len(seen) == 1 and len(seen[0][1]) == 8  # every completion of the batch in one call
    prompts, texts = seen[0]
    completion_ids = [ids[m].tolist() for ids, m in zip(batch["input_ids"], batch["loss_mask"], strict=True)]
    assert texts == [collector.decode(ids) for ids in completion_ids]
    one_by_one = [inner([p], [t])[0] for p, t in zip(prompts, texts, strict=True)]
    metrics = collector.metrics()
    assert batch["reward"].tolist() == pytest.approx(one_by_one, abs=1e-5)  # gold (weight 0) is not trained on
    assert metrics["rollout/reward/proxy"] == pytest.approx(sum(one_by_one) / 8, abs=1e-5)
    assert metrics["rollout/reward/gold"] == pytest.approx(sum(sortedness("", t) for t in texts) / 8)
    assert metrics["rollout/reward/failed"] == 0.0 and batch["valid"].all()


# ---------------------------------------------------------------------------------------------- failures


def _step_grads(algo: GRPO) -> list[torch.Tensor]:
    """The gradient of every optimizer step of ``algo``, flattened."""
    seen: list[torch.Tensor] = []
    step = algo.optimizer.step

    def recording(*args, **kwargs):
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in algo.model.parameters()]
        seen.append(torch.cat([g.detach().flatten() for g in grads]).clone())
        return step(*args, **kwargs)

    algo.optimizer.step = recording  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize(
    ("reward", "error"),
    [
        (reward_fns.FailsAt(2), "ValueError: reward exploded"),
        (reward_fns.FailsAt(2, nan=True), "returned nan"),
        (reward_fns.BatchNanAt(2), "returned nan"),
        (reward_fns.BatchNanAt(2, value=math.inf), "returned inf"),
    ],
    ids=["raises", "nan", "batched-nan", "batched-inf"],
)
def test_a_sample_a_reward_fails_on_is_left_out_of_the_update(reward, error: str) -> None:
    base = _model()
    collector = _collector([reward, (exact_match, 0.5)], model=copy.deepcopy(base))
    with pytest.warns(RewardWarning) as caught:
        batch = collector.collect()
    assert len(caught) == 1
    prompt, completion = reward.failed_on
    message = str(caught[0].message)
    assert f"reward {reward.__name__!r} failed on 1 of 8 completions, excluded from the update" in message
    assert f"prompt {prompt!r}, completion {completion!r}: {error}" in message
    valid = batch["valid"]
    assert valid.tolist() == [i != 2 for i in range(8)]
    assert batch["loss_mask"][2].sum() == 0 and batch["loss_mask"][valid].sum(-1).min() > 0
    group = batch["group"]
    assert group[2] < 0 and (group == group[2]).sum() == 1  # a group of its own
    assert torch.equal(group[[0, 1, 3]], group[[1, 3, 0]])  # its prompt's other completions keep theirs
    assert batch["reward"][2] == pytest.approx(batch["reward"][[0, 1, 3]].mean().item())  # neutral, for metrics
    assert torch.isfinite(batch["reward"]).all()
    assert collector.metrics()["rollout/reward/failed"] == 1.0
    assert collector.metrics()["rollout/reward_mean"] == pytest.approx(batch["reward"][valid].mean().item())

    # the others' advantages are those of the valid samples alone, the failed one's is 0
    batch["reward"][valid] = torch.rand(7, generator=torch.Generator().manual_seed(0))  # a signal everywhere
    cfg = GRPOConfig(lr=1e-3, max_grad_norm=1e9)
    advantage = GRPO(copy.deepcopy(base), cfg, SAMPLING).with_advantages(batch.clone())["advantage"]
    assert advantage[2] == 0
    assert torch.allclose(advantage[valid], group_advantages(batch["reward"][valid], group[valid]))
    # and the update is the one without the failed sample, whatever the loss aggregation
    for aggregation in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        cfg = GRPOConfig(lr=1e-3, max_grad_norm=1e9, aggregation=aggregation)
        grads = []
        for data in (batch, batch[valid]):
            algo = GRPO(copy.deepcopy(base), cfg, SAMPLING)
            seen = _step_grads(algo)
            metrics = algo.update(data.clone())
            assert math.isfinite(metrics["loss/policy"])
            grads.append(seen[0])
        assert grads[0].abs().max() > 1e-3
        assert torch.allclose(grads[0], grads[1], atol=1e-6), (aggregation, (grads[0] - grads[1]).abs().max())


def test_a_metric_only_reward_that_fails_leaves_the_sample_in() -> None:
    collector = _collector([exact_match, ("gold", reward_fns.FailsAt(5), 0.0)])
    with pytest.warns(RewardWarning, match=r"reward 'gold' failed on 1 of 8 completions, left out of its metric"):
        batch = collector.collect()
    assert batch["valid"].all() and collector.metrics()["rollout/reward/failed"] == 0.0
    assert math.isfinite(collector.metrics()["rollout/reward/gold"])


def test_a_reward_failing_on_every_sample_stops_the_run() -> None:
    collector = _collector([exact_match, reward_fns.FailsAt(None)])
    with pytest.raises(
        RewardFailedError,
        match=r"reward 'fails_at' failed on all 8 completions of the batch; the "
        r"first: prompt '.*', completion '.*': ValueError: reward exploded; fix the reward",
    ):
        collector.collect()


def test_a_batch_with_no_valid_sample_stops_the_run() -> None:
    class NanOn:
        """NaN on the even (``parity`` 0) or odd (1) completions of a batch."""

        def __init__(self, parity: int) -> None:
            self.parity = parity

        def batch(self, prompts, completions, metadatas):
            return [math.nan if i % 2 == self.parity else 1.0 for i in range(len(completions))]

    collector = _collector([("even", NanOn(0), 1.0), ("odd", NanOn(1), 1.0)])
    with pytest.warns(RewardWarning), pytest.raises(RewardFailedError) as info:
        collector.collect()
    message = str(info.value)
    assert message.startswith("no completion of the batch could be scored (rewards failed on every one); the first:")
    assert "reward 'even' on prompt '" in message and message.endswith("returned nan; fix the reward functions")


def test_score_names_the_failing_reward_and_sample() -> None:
    env = PromptEnv([Example("1+1=", "2")], rewards=[reward_fns.FailsAt(0)], eval_source=[Example("2+2=", "4")])
    with pytest.raises(RewardFailedError, match=r"reward 'fails_at' failed on prompt '1\+1=', completion '3': "):
        env.score(env.sample(1)[0], "3")


def test_a_batched_reward_that_raises_is_retried_one_by_one() -> None:
    class Picky:
        __name__ = "picky"

        def batch(self, prompts, completions, metadatas):
            if "bad" in completions:
                raise KeyError("bad completion")
            return [1.0] * len(completions)

    scores = score_rewards([("picky", Picky(), 1.0)], ["a", "b", "c"], ["ok", "bad", "fine"], [{}, {}, {}])
    assert scores.valid == [True, False, True]
    assert scores.parts["picky"][0] == 1.0 and math.isnan(scores.parts["picky"][1])
    (failure,) = scores.failures
    assert (failure.index, failure.completion, failure.error) == (1, "bad", "KeyError: 'bad completion'")


def test_a_batched_reward_returning_the_wrong_count_is_an_error() -> None:
    class Short:
        def batch(self, prompts, completions, metadatas):
            return [1.0]

    with pytest.raises(RewardFailedError, match=r"reward 'short' returned 1 scores for 2 completions; its batch"):
        score_rewards([("short", Short(), 1.0)], ["a", "b"], ["x", "y"], [{}, {}])


def test_collected_prompts_go_through_the_chat_template() -> None:
    tok = char_tokenizer(chat_template=SIMPLE_CHAT_TEMPLATE)
    model = _model()
    env = PromptEnv(Arithmetic(2), seed=0, eval_size=5)
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, seed=0)
    batch = TextCollector(env, engine, tok, prompts=2, sampling=SAMPLING, policy=model).collect()
    row = batch["attention_mask"][0].bool() & ~batch["loss_mask"][0]
    prompt = tok.decode(batch["input_ids"][0][row].tolist())
    assert prompt.startswith("user: ") and prompt.endswith("=\nassistant: ")
