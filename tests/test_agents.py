"""Agents: multi-turn, tool-using episodes as token-in/token-out trajectories (``ToolEnv`` + ``AgentRollout``).

What a user relies on: the loss mask covers exactly the model's tokens across turns and the sampler's log-probs
sit on those tokens; a turn that does not extend the previous tokens is an error naming the turn; malformed calls
and misbehaving tools come back to the model as messages, never as crashes; the turn and token limits hold; GAE
skips tool tokens; agent runs learn, and resume exactly; bad ``--agent.*`` values get one line and exit 2.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from pickaxe.algos.rlhf_core import token_gae, token_returns
from pickaxe.envs.agents.parsing import JsonTagParser, ToolCall
from pickaxe.envs.agents.sandbox import SandboxLimits
from pickaxe.envs.agents.tool_env import ToolEnv
from pickaxe.envs.agents.tools import make_tools
from pickaxe.envs.text import Arithmetic, PromptEnv
from pickaxe.errors import ConfigError
from pickaxe.models.lm import completion_logprobs, tiny_lm
from pickaxe.models.tokenizer import SIMPLE_CHAT_TEMPLATE, char_tokenizer
from pickaxe.rollout.agent import AgentDemoCollector, AgentRollout, ChatFormat, TrajectoryError
from pickaxe.rollout.engines import HFEngine, SamplingParams
from pickaxe.rollout.engines.base import Completion
from pickaxe.rollout.text_collector import TextCollector

TOK = char_tokenizer(model_max_length=512)
PARSER = JsonTagParser()


def call(expression: str) -> str:
    return PARSER.format_call(ToolCall("calculator", {"expression": expression}))


class ScriptedEngine:
    """An engine whose every row says ``turns[k]`` at its k-th turn (EOS appended unless ``eos`` is False), with
    log-prob ``-(k + 1) / 100 - i / 1000`` on its i-th token, so each token's log-prob is recognisable."""

    def __init__(self, turns: Sequence[str], eos: bool = True) -> None:
        self.turns = [[*TOK(t, add_special_tokens=False)["input_ids"], *([TOK.eos_token_id] if eos else [])]
                      for t in turns]  # fmt: skip
        self.version = 0
        self.calls = 0
        self.prompts: list[list[list[int]]] = []

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        ids = self.turns[self.calls][: params.max_new_tokens]
        logps = [-(self.calls + 1) / 100 - i / 1000 for i in range(len(ids))]
        self.calls += 1
        self.prompts.append([list(p) for p in prompts])
        return [
            Completion(r, list(ids), list(logps), finished=ids[-1] == TOK.eos_token_id) for r in range(len(prompts))
        ]

    def sync_weights(self, policy: object, version: int) -> None:
        self.version = version


def tool_env(max_turns: int = 4, max_tokens: int = 512, tools: Sequence[str] = ("calculator",), **kw) -> ToolEnv:
    limits = SandboxLimits(cpu_s=1.0, memory_mb=256, wall_s=60.0)  # wall: a safety net only, for a loaded machine
    return ToolEnv(PromptEnv(Arithmetic(3, "*"), seed=0, eval_size=8), make_tools(tools, limits=limits),
                   max_turns=max_turns, max_tokens=max_tokens, describe_tools=False, **kw)  # fmt: skip


def test_parser_reads_calls_answers_and_malformed_calls() -> None:
    turn = PARSER.parse('<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>')
    assert turn.calls == [ToolCall("calculator", {"expression": "2*3"})] and not turn.errors and not turn.final
    assert PARSER.parse("  56088 ").answer == "56088"
    string_args = PARSER.parse('<tool_call>{"name": "lookup", "arguments": "{\\"key\\": \\"a\\"}"}</tool_call>')
    assert string_args.calls == [ToolCall("lookup", {"key": "a"})]
    for text, why in [
        ('<tool_call>{"name": "calculator", "arguments": {</tool_call>', "invalid JSON"),
        ('<tool_call>{"name": "calculator"', "never closed"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
        ("<tool_call>[1, 2]</tool_call>", "not an object"),
        ('<tool_call>{"name": "x", "arguments": 3}</tool_call>', '"arguments" is not an object'),
        ('{"name": "x"}</tool_call>', "without <tool_call>"),
    ]:
        parsed = PARSER.parse(text)
        assert not parsed.final and parsed.answer is None and not parsed.calls
        assert why in parsed.errors[0] and "<tool_call>" in parsed.errors[0]  # says how a call looks
    many = PARSER.parse(call("1+1") * 6)
    assert len(many.calls) == 4 and len(many.errors) == 2


def test_loss_mask_covers_exactly_the_model_tokens_across_turns() -> None:
    env = tool_env()
    script = [call("2*3"), call("4*5"), call("6*7"), "42"]
    engine = ScriptedEngine(script)
    rollout = AgentRollout(engine, env, TOK)
    example = env.sample(1)[0]
    prompt = rollout.encode([example])[0]
    [episode] = rollout.generate([prompt], SamplingParams(max_new_tokens=200, temperature=1.0))

    fmt = ChatFormat(TOK, env)
    expected, mask, logps = [], [], []
    for k, (turn, result) in enumerate(zip(engine.turns, ["6", "20", "42", None], strict=True)):
        expected += turn
        mask += [True] * len(turn)
        logps += [-(k + 1) / 100 - i / 1000 for i in range(len(turn))]
        if result is not None:
            obs = fmt.observation([{"role": "tool", "name": "calculator", "content": result}], True)
            expected += obs
            mask += [False] * len(obs)
            logps += [0.0] * len(obs)
    assert episode.token_ids == expected and episode.loss_mask == mask
    assert episode.logprobs == pytest.approx(logps)
    assert episode.text == "42" and episode.finished
    assert episode.info == {**episode.info, "turns": 4.0, "calls": 3.0, "malformed": 0.0, "answered": 1.0}
    text = TOK.decode(episode.token_ids)
    assert "<eos>\ntool: 6\nassistant: <tool_call>" in text  # the template's text around each tool result
    # every turn's prompt extended the previous one: the engine saw prefix-growing prompts
    seen = [p[0] for p in engine.prompts]
    assert all(b[: len(a)] == a for a, b in itertools.pairwise(seen))

    # packed by the collector: loss_mask is 1 exactly on the model's tokens, logprob sits on them
    collector = TextCollector(env, rollout, TOK, prompts=2, sampling=SamplingParams(200, n=2), encode=rollout.encode)
    engine.calls = 0
    batch = collector.collect()
    row_mask = batch["loss_mask"][0]
    start = int(batch["attention_mask"][0].argmax()) + len(prompt)
    assert row_mask[start : start + len(mask)].tolist() == mask and int(row_mask.sum()) == sum(mask)
    assert batch["logprob"][0][start : start + len(mask)].tolist() == pytest.approx(logps)
    assert collector.metrics()["rollout/agent/tool_calls"] == 3.0


def test_sampler_logprobs_stay_aligned_with_the_learner_over_turns() -> None:
    """A real model, every turn a tool call (a parser that calls for any text): the engine's log-probs of each
    turn, sampled with the earlier turns and tool results in its context, are the learner's log-probs of the
    packed episode on exactly those tokens."""

    class AlwaysCall(JsonTagParser):
        def parse(self, text):
            return super().parse(call("12*34"))

    env = tool_env(max_turns=3, parser=AlwaysCall())
    model = tiny_lm(len(TOK), hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, max_positions=512, seed=0)
    rollout = AgentRollout(HFEngine(model, TOK.eos_token_id, TOK.pad_token_id, seed=0), env, TOK)
    collector = TextCollector(env, rollout, TOK, prompts=3, sampling=SamplingParams(6, n=2), encode=rollout.encode)
    batch = collector.collect()
    assert collector.metrics()["rollout/agent/turns"] == 3.0
    with torch.no_grad():
        learner = completion_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["loss_mask"], 1.0)
    mask = batch["loss_mask"]
    # 3 prompts x 2 episodes x 3 turns of at most 6 tokens each (a turn may end early with EOS); no tool token
    assert int(mask.sum()) == 6 * collector.metrics()["rollout/agent/model_tokens"] > 6 * 3 * 3
    assert torch.allclose(learner[mask], batch["logprob"][mask], atol=1e-5)
    assert (batch["logprob"][~mask] == 0).all()


def test_prefix_check_catches_a_retokenised_turn() -> None:
    """A rollout that rebuilds each prompt from the conversation's text (re-tokenising earlier turns) loses the
    model's EOS token; the prefix check stops it at the turn that changed, never silently."""

    class MessageMode(AgentRollout):
        def next_prompt(self, trajectory, appended):
            text = self.format.render(trajectory.messages, True)
            return self.format.encode(text)

    env = tool_env()
    rollout = MessageMode(ScriptedEngine([call("2*3"), "6"]), env, TOK)
    with pytest.raises(TrajectoryError, match=r"turn 2 of episode 0: .*does not extend.*re-tokenised"):
        rollout.generate(rollout.encode(env.sample(1)), SamplingParams(200))


def test_a_template_that_rewrites_earlier_turns_is_refused() -> None:
    """Like templates that strip an earlier turn's reasoning: appending would change what came before."""
    drops_old_turns = (
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}{{ m['role'] }}: {{ m['content'] }}\n"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    )
    tok = char_tokenizer(chat_template=drops_old_turns)
    env = tool_env()
    rollout = AgentRollout(ScriptedEngine([call("2*3"), "6"]), env, tok)
    with pytest.raises(TrajectoryError, match=r"turn 1: the chat template rewrites .*prefix-preserving"):
        rollout.generate(rollout.encode(env.sample(1)), SamplingParams(200))


def test_malformed_calls_and_unknown_tools_are_answered_not_raised() -> None:
    env = tool_env(max_tokens=1024)
    bad_json = '<tool_call>{"name": "calculator", "arguments": {"expression": 2*3}}</tool_call>'
    unknown = PARSER.format_call(ToolCall("weather", {"city": "Oslo"}))
    rollout = AgentRollout(ScriptedEngine([bad_json, unknown, call("1/0"), "6"]), env, TOK)
    [episode] = rollout.generate(rollout.encode(env.sample(1)), SamplingParams(200))
    text = TOK.decode(episode.token_ids)
    assert "tool: error: malformed tool call: invalid JSON" in text
    assert "weather" in text.split("tool: ")[2]  # the unknown tool is named back to the model
    assert "zero" in text.split("tool: ")[3]  # and so is the calculator's error
    assert episode.info["malformed"] == 1 and episode.info["tool_errors"] == 2 and episode.text == "6"


def test_python_tool_misbehaviour_comes_back_as_a_result_and_the_episode_goes_on() -> None:
    env = tool_env(tools=("python",), max_tokens=4096)
    loop = PARSER.format_call(ToolCall("python", {"code": "while True: pass"}))
    sock = PARSER.format_call(ToolCall("python", {"code": "import socket; socket.create_connection(('1.1.1.1', 80))"}))
    ok = PARSER.format_call(ToolCall("python", {"code": "print(6*7)"}))
    tok = char_tokenizer(model_max_length=4096)
    rollout = AgentRollout(ScriptedEngine([loop, sock, ok, "42"]), env, tok)
    [episode] = rollout.generate(rollout.encode(env.sample(1)), SamplingParams(400))
    assert episode.info["turns"] == 4 and episode.info["tool_errors"] >= 2 and episode.text == "42"
    assert "tool: 42" in tok.decode(episode.token_ids)


def test_turn_and_token_limits_end_episodes() -> None:
    env = tool_env(max_turns=2)
    rollout = AgentRollout(ScriptedEngine([call("2*3"), call("4*5"), "20"]), env, TOK)
    [episode] = rollout.generate(rollout.encode(env.sample(1)), SamplingParams(200))
    assert episode.info["turns"] == 2 and not episode.finished and episode.text == ""  # out of turns, no answer
    assert rollout.metrics()["tools/calls"] == 1  # the last turn's call is not run

    env = tool_env(max_tokens=100)
    engine = ScriptedEngine([call("2*3"), call("4*5"), "20"])
    rollout = AgentRollout(engine, env, TOK)
    prompt = rollout.encode(env.sample(1))[0]
    [episode] = rollout.generate([prompt], SamplingParams(200))
    assert len(prompt) + len(episode.token_ids) <= 100 and not episode.finished


def test_reward_scores_the_final_answer_and_counts_tool_use() -> None:
    env = tool_env(format_weight=0.5)
    example = env.sample(1)[0]
    rollout = AgentRollout(ScriptedEngine([call(example.prompt.rstrip("=")), str(example.answer)]), env, TOK)
    [episode] = rollout.generate(rollout.encode([example]), SamplingParams(200))
    scores = env.score_batch([example, example], [episode.text or "", "0"], [episode.info, {"turns": 1.0}])
    assert scores.parts["verify"] == [1.0, 0.0] and scores.parts["tool_use"] == [1.0, 0.0]
    assert scores.total == [1.5, 0.0] and env.reward_names == ["verify", "tool_use", "turns"]


def test_demonstrations_are_laid_out_like_episodes() -> None:
    from pickaxe.envs.agents.tool_env import calculator_demo

    env = tool_env(demo=calculator_demo)
    example = env.sample(1)[0]
    prompt, ids, mask = AgentDemoCollector(env, TOK).episode(example)
    rollout = AgentRollout(ScriptedEngine([call(example.prompt.rstrip("=")), str(example.answer)]), env, TOK)
    [episode] = rollout.generate(rollout.encode([example]), SamplingParams(200))
    assert prompt == rollout.encode([example])[0] and ids == episode.token_ids and mask == episode.loss_mask


def test_gae_and_returns_skip_tool_tokens() -> None:
    """A multi-turn row (tool tokens off the mask between turns) gets exactly the advantages of the same model
    tokens laid out contiguously: tool results are not steps, and V after a turn is V at the next turn."""
    g = torch.Generator().manual_seed(0)
    holes = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 0]], dtype=torch.bool)
    dense = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    r, v = torch.randn(1, 6, generator=g), torch.randn(1, 6, generator=g)

    def place(x, m):
        out = torch.zeros(m.shape)
        out[m] = x.flatten()
        return out

    adv_h, ret_h = token_gae(place(r, holes), place(v, holes), holes, 0.9, 0.8)
    adv_d, ret_d = token_gae(place(r, dense), place(v, dense), dense, 0.9, 0.8)
    assert torch.allclose(adv_h[holes], adv_d[dense]) and torch.allclose(ret_h[holes], ret_d[dense])
    assert (adv_h[~holes] == 0).all() and (ret_h[~holes] == 0).all()
    rtg_h, rtg_d = token_returns(place(r, holes), holes, 0.9), token_returns(place(r, dense), dense, 0.9)
    assert torch.allclose(rtg_h[holes], rtg_d[dense]) and (rtg_h[~holes] == 0).all()


def _agent_cfg(**overrides):
    from pickaxe.recipes.llm import LLM_RECIPES
    from pickaxe.train.config import TrainerConfig
    from pickaxe.train.llm_config import LLMEvalConfig, LMConfig, TextCollectorConfig, WarmStartConfig

    cfg = LLM_RECIPES["calc-agent-grpo"].make()
    cfg.model = LMConfig(hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64, max_positions=192)
    cfg.warm_start = WarmStartConfig(updates=4, batch_size=8, log_every=2)
    cfg.collector = TextCollectorConfig(prompts=2, group_size=4)
    cfg.engine.max_new_tokens = 24
    cfg.eval = LLMEvalConfig(prompts=6, samples=2, pass_k=2)
    cfg.trainer = TrainerConfig(total_steps=32, eval_every=16)
    cfg.device = "cpu"
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def test_agent_run_resumes_exactly(tmp_path: Path) -> None:
    from llm_runs import assert_resume_is_exact
    from pickaxe.train.llm_config import WarmStartConfig

    # long enough a warm start for the model to open calls: its episodes then have a second turn (the error its
    # cut-off call gets back, 24 tokens a turn), so the resumed run has to replay multi-turn rounds exactly
    cfg = _agent_cfg(seed=2, warm_start=WarmStartConfig(updates=60, batch_size=16, lr=1e-2, log_every=20))
    records = assert_resume_is_exact(cfg, tmp_path, cut=16)
    assert min(r["rollout/agent/turns"] for r in records if "rollout/agent/turns" in r) > 1
    assert any("eval/reward/tool_use" in r for r in records)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agent.tools", "shell"], "--agent.tools: unknown tool 'shell'; choose from calculator, lookup, python"),
        (["--agent.tools", "lookup"], "--agent.tools lookup needs --agent.corpus FILE"),
        (["--agent.max-tokens", "999"], "--agent.max-tokens 999 is more than the tiny model's --model.max-positions"),
        (["--agent.demo", "none"], "needs demonstration episodes: set --agent.demo calculator"),
        (["--agent.max-turns", "0"], "--agent.max-turns"),
    ],
)
def test_bad_agent_flags_get_one_line(args: list[str], message: str) -> None:
    from pickaxe.recipes.args import parse_train

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        cfg, _ = parse_train("calc-agent-grpo", args)
        cfg.check_more()
    assert "\n" not in str(e.value)


def test_a_corpus_that_cannot_be_read_is_a_config_error(tmp_path: Path) -> None:
    from pickaxe.recipes.args import parse_train

    bad = tmp_path / "corpus.json"
    bad.write_text("{not json")
    cfg, _ = parse_train("calc-agent-grpo", ["--agent.tools", "calculator", "lookup", "--agent.corpus", str(bad)])
    with pytest.raises(ConfigError, match=r"--agent.corpus: lookup corpus .* is not valid JSON"):
        cfg.check_more()


def test_lookup_tool_in_an_episode(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps({"oslo": "capital of Norway"}))
    limits = SandboxLimits()
    env = ToolEnv(PromptEnv(Arithmetic(1), seed=0), make_tools(["lookup"], str(corpus), limits),
                  describe_tools=True, system_prompt="Be brief.", max_tokens=1024)  # fmt: skip
    look = PARSER.format_call(ToolCall("lookup", {"key": "oslo"}))
    tok = char_tokenizer(model_max_length=4096, chat_template=SIMPLE_CHAT_TEMPLATE)
    rollout = AgentRollout(ScriptedEngine([look, "ok"]), env, tok)
    prompt = rollout.encode(env.sample(1))[0]
    assert "system: Be brief.\n\nTools:\n- lookup:" in tok.decode(prompt)  # described for a template without tools
    [episode] = rollout.generate([prompt], SamplingParams(200))
    assert "tool: capital of Norway\n" in tok.decode(episode.token_ids) and episode.text == "ok"


@pytest.mark.parametrize("algo", ["ppo", "rloo", "reinforce++"])
def test_agent_runs_with_the_other_llm_algorithms(algo: str, tmp_path: Path) -> None:
    import math

    from pickaxe.algos.configs import GRPOConfig, LLMPPOConfig
    from pickaxe.runs.run import read_metrics
    from pickaxe.train.build import train

    chosen = LLMPPOConfig(lr=1e-4, micro_batch_size=64) if algo == "ppo" else GRPOConfig(lr=1e-4, advantage=algo)
    result, _ = train(_agent_cfg(algo=chosen, seed=1), run_dir=tmp_path / algo)
    assert result.steps == 32
    updates = [r for r in read_metrics(tmp_path / algo) if "rollout/agent/turns" in r]
    assert len(updates) == 4 and all(math.isfinite(v) for r in updates for v in r.values() if isinstance(v, float))


def test_grpo_through_a_tool_env_raises_the_reward() -> None:
    """GRPO on whole episodes: a policy that learns to open its turn with a tool call (a parser for which any
    turn starting with '?' is a well-formed call) gets the tool_use reward; from ~1% of episodes to most of them."""
    from pickaxe.algos.grpo import GRPO, GRPOConfig
    from pickaxe.envs.agents.parsing import ParsedTurn

    class QuestionMark(JsonTagParser):
        def parse(self, text: str) -> ParsedTurn:
            if text.startswith("?"):
                return ParsedTurn(text, [ToolCall("calculator", {"expression": "1+1"})])
            return ParsedTurn(text, answer=text.strip())

    torch.manual_seed(0)
    env = tool_env(max_turns=2, parser=QuestionMark(), format_weight=1.0)
    model = tiny_lm(len(TOK), hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64, max_positions=512, seed=0)
    sampling = SamplingParams(3, temperature=1.0, n=8)
    algo = GRPO(model, GRPOConfig(lr=1e-2, micro_batch_size=128, kl_coef=0.0), sampling, seed=0)
    rollout = AgentRollout(HFEngine(model, TOK.eos_token_id, TOK.pad_token_id, seed=0), env, TOK)
    collector = TextCollector(env, rollout, TOK, prompts=16, sampling=sampling, policy=model,
                              version_fn=lambda: algo.version, encode=rollout.encode)  # fmt: skip
    rewards = []
    for _ in range(15):
        batch = collector.collect()
        rewards.append(float(batch["reward"].mean()))
        algo.update(batch)
    assert sum(rewards[:3]) / 3 < 0.05 and sum(rewards[-3:]) / 3 > 0.3, rewards
    assert collector.metrics()["rollout/agent/turns"] > 1.3  # the calls were answered and the episodes went on


@pytest.mark.slow
def test_calc_agent_grpo_raises_accuracy_and_well_formed_tool_use(tmp_path: Path) -> None:
    """The recipe itself (about 10 minutes on 2 cores): held-out greedy accuracy and the sampled share of episodes
    with only well-formed calls end higher than after the warm start."""
    from pickaxe.recipes.llm import LLM_RECIPES
    from pickaxe.runs.run import read_metrics
    from pickaxe.train.build import train

    cfg = LLM_RECIPES["calc-agent-grpo"].make()
    cfg.device = "cpu"
    train(cfg, run_dir=tmp_path / "run")
    evals = [r for r in read_metrics(tmp_path / "run") if "eval/accuracy" in r]
    before, after = evals[0], evals[-1]
    assert after["eval/accuracy"] > before["eval/accuracy"]
    assert after["eval/sampled/tool_use"] > before["eval/sampled/tool_use"]


def test_agent_evaluation_is_a_pure_function_of_the_weights() -> None:
    """The evaluator re-seeds the rollout's sampler and restores it: two evaluations agree, and the training
    stream's sampler state is what it was (an agent rollout hides its engine's generator otherwise)."""
    from pickaxe.algos.sft import SFT, SFTConfig
    from pickaxe.train.llm_config import LLMEvalConfig
    from pickaxe.train.text_eval import TextEvaluator

    env = tool_env()
    model = tiny_lm(len(TOK), hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64, max_positions=512, seed=0)
    engine = HFEngine(model, TOK.eos_token_id, TOK.pad_token_id, seed=0)
    rollout = AgentRollout(engine, env, TOK)
    evaluator = TextEvaluator(env, rollout, TOK, LLMEvalConfig(prompts=4, samples=2, pass_k=2), 8, seed=5,
                              encode=rollout.encode)  # fmt: skip
    before = engine.generator.get_state()
    first = evaluator(SFT(model, SFTConfig()))
    assert torch.equal(engine.generator.get_state(), before)
    assert evaluator(SFT(model, SFTConfig())) == first


class VersionedEngine(ScriptedEngine):
    """A ScriptedEngine whose k-th turn is sampled by policy version ``first + k`` (async workers move on between
    the turns of an episode)."""

    def __init__(self, turns: Sequence[str], first: int) -> None:
        super().__init__(turns)
        self.first = first

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        version = self.first + self.calls
        out = super().generate(prompts, params)
        for c in out:
            c.version = version
        return out


def test_an_episode_carries_the_oldest_policy_version_of_its_turns() -> None:
    """Turns sampled by versions 5, 6 and 7: the episode is as stale as its oldest turn (5), which the staleness
    bound and the on-policy checks read; an engine that tags no version leaves it None."""
    env = tool_env()
    rollout = AgentRollout(VersionedEngine([call("2*3"), call("4*5"), "20"], first=5), env, TOK)
    [episode] = rollout.generate(rollout.encode(env.sample(1)), SamplingParams(200))
    assert episode.info["turns"] == 3 and episode.version == 5
    plain = AgentRollout(ScriptedEngine([call("2*3"), "6"]), env, TOK)
    assert plain.generate(plain.encode(env.sample(1)), SamplingParams(200))[0].version is None


class RowEngine(ScriptedEngine):
    """Row ``r`` of every request says ``scripts[r][k]`` at its k-th turn (EOS appended)."""

    def __init__(self, scripts: Sequence[Sequence[str]]) -> None:
        super().__init__([])
        eos = [TOK.eos_token_id]
        self.scripts = [[[*TOK(t, add_special_tokens=False)["input_ids"], *eos] for t in s] for s in scripts]
        self.rows: list[int] = []

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        k = self.calls
        self.calls += 1
        active = [r for r, s in enumerate(self.scripts) if k < len(s)]  # finished episodes are not asked again
        return [Completion(i, list(self.scripts[r][k]), [0.0] * len(self.scripts[r][k]), True)
                for i, r in enumerate(active[: len(prompts)])]  # fmt: skip


def test_each_episode_reads_the_results_of_its_own_tool_calls() -> None:
    env = tool_env()
    rollout = AgentRollout(RowEngine([[call("2*3"), "6"], [call("1+1"), call("4*5"), "20"]]), env, TOK)
    episodes = rollout.generate(rollout.encode(env.sample(2)), SamplingParams(200))
    texts = [TOK.decode(e.token_ids) for e in episodes]
    assert "tool: 6\n" in texts[0] and "tool: 2\n" not in texts[0]
    assert "tool: 2\n" in texts[1] and "tool: 20\n" in texts[1] and "tool: 6\n" not in texts[1]
    assert [e.info["turns"] for e in episodes] == [2.0, 3.0] and [e.text for e in episodes] == ["6", "20"]


def test_a_turn_without_eos_gets_the_templates_end_of_turn_text() -> None:
    """A template that closes an assistant turn with EOS: after a turn that ended with EOS the model's own token
    said it, so the appended tokens start after it; after a turn cut without EOS they start with it."""
    template = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}"
                "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant: {% endif %}")  # fmt: skip
    tok = char_tokenizer(model_max_length=512, chat_template=template)
    fmt = ChatFormat(tok, tool_env())
    tool = [{"role": "tool", "name": "calculator", "content": "6"}]
    after_eos, cut = fmt.observation(tool, True), fmt.observation(tool, False)
    assert cut == [tok.eos_token_id, *after_eos] and tok.eos_token_id not in after_eos
    assert "tool: 6" in tok.decode(after_eos)


def test_an_observation_that_fills_the_budget_exactly_ends_the_episode() -> None:
    script = [call("2*3"), "6"]
    probe = tool_env()
    prompt = AgentRollout(ScriptedEngine(script), probe, TOK).encode(probe.sample(1))[0]
    turn = ScriptedEngine(script).turns[0]
    obs = ChatFormat(TOK, probe).observation([{"role": "tool", "name": "calculator", "content": "6"}], True)
    for budget, turns in ((len(prompt) + len(turn) + len(obs), 1.0), (len(prompt) + len(turn) + len(obs) + 1, 2.0)):
        env = tool_env(max_tokens=budget)
        rollout = AgentRollout(ScriptedEngine(script), env, TOK)
        [episode] = rollout.generate(rollout.encode(env.sample(1)), SamplingParams(200))
        assert episode.info["turns"] == turns and len(prompt) + len(episode.token_ids) <= budget


def test_a_turn_is_cut_at_the_trajectory_budget_whatever_the_engine_returns() -> None:
    """An engine that ignores ``max_new_tokens`` (it returns its whole script): the episode still keeps only the
    tokens that fit the budget, with as many log-probs and mask entries."""
    env = tool_env(max_tokens=10_000)
    rollout = AgentRollout(RowEngine([["123456789"]]), env, TOK)
    prompt = rollout.encode(env.sample(1))[0]
    env = tool_env(max_tokens=len(prompt) + 5)
    rollout = AgentRollout(RowEngine([["123456789"]]), env, TOK)
    [episode] = rollout.generate(rollout.encode(env.sample(1)), SamplingParams(200))
    assert episode.token_ids == TOK("12345", add_special_tokens=False)["input_ids"]
    assert len(episode.logprobs) == len(episode.loss_mask) == 5
