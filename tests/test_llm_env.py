"""Text environments: generated tasks and their held-out splits, rewards, PromptEnv, dataset validation."""

import json
from pathlib import Path

import numpy as np
import pytest

from pickaxe.envs.text import (
    Arithmetic,
    Countdown,
    DatasetError,
    Example,
    PromptEnv,
    Reverse,
    SortDigits,
    evaluate_expression,
    exact_match,
    format_reward,
    load_examples,
    make_task,
    numeric_match,
)
from pickaxe.errors import PickaxeError


@pytest.mark.parametrize("task", [Arithmetic(2), Arithmetic(2, "*"), Reverse(), SortDigits(), Countdown()])
def test_tasks_verify_their_answers_and_split_heldout(task) -> None:
    rng = np.random.default_rng(0)
    train = [task.sample(rng) for _ in range(200)]
    heldout = task.heldout(50, seed=1)
    assert len({ex.prompt for ex in heldout}) == len(heldout) == 50
    assert not {ex.prompt for ex in train} & {ex.prompt for ex in heldout}
    for ex in train[:20] + heldout[:20]:
        assert task.verify(ex.prompt, ex.answer, ex.reward_metadata()) == 1.0
        assert task.verify(ex.prompt, ex.answer + "1", ex.reward_metadata()) == 0.0
    again = [task.sample(np.random.default_rng(0)) for _ in range(1)]
    assert again[0].prompt == train[0].prompt  # seeded
    assert task.heldout(50, seed=1) == heldout


def test_task_answers_are_right() -> None:
    rng = np.random.default_rng(3)
    ex = Arithmetic(3, "*").sample(rng)
    a, b = ex.metadata["a"], ex.metadata["b"]
    assert ex.prompt == f"{a}*{b}=" and ex.answer == str(a * b)
    assert (
        Reverse().generate(np.random.default_rng(0)).answer
        == Reverse().generate(np.random.default_rng(0)).metadata["digits"][::-1]
    )
    s = SortDigits().generate(np.random.default_rng(0))
    assert s.answer == "".join(sorted(s.metadata["digits"]))
    assert make_task("countdown", digits=4).numbers == 4


def test_countdown_checker() -> None:
    task = Countdown()
    meta = {"numbers": [3, 5, 7], "target": 22, "answer": None}
    assert task.verify("", "3*5+7", meta) == 1.0
    assert task.verify("", " 7+(5*3) ", meta) == 1.0
    assert task.verify("", "3*5+7+0", meta) == 0.0  # a number not given
    assert task.verify("", "5*5-3", meta) == 0.0  # 5 used twice, 7 unused
    assert task.verify("", "22", meta) == 0.0
    assert evaluate_expression("(1+2)/3") == 1
    assert evaluate_expression("1/0") is None
    assert evaluate_expression("__import__('os').system('true')") is None
    assert evaluate_expression("2**10") is None
    assert evaluate_expression("1.5+1") is None


def test_rewards() -> None:
    meta = {"answer": "42"}
    assert exact_match("", " 42\n", meta) == 1.0 and exact_match("", "420", meta) == 0.0
    assert numeric_match("", "it is 42.0", meta) == 1.0 and numeric_match("", "no", meta) == 0.0
    assert format_reward(r"\d+")("", "123", meta) == 1.0 and format_reward(r"\d+")("", "12a", meta) == 0.0


def test_prompt_env_weighted_rewards_and_state() -> None:
    task = Arithmetic(2)
    env = PromptEnv(task, rewards=[task.verify, (format_reward(r"\d+"), 0.5)], seed=0, eval_size=30)
    ex = env.sample(1)[0]
    total, parts = env.score(ex, ex.answer)
    assert total == 1.5 and parts == {"verify": 1.0, r"format[\d+]": 1.0}
    assert env.score(ex, "x")[0] == 0.0
    state = env.state_dict()
    nxt = env.sample(3)
    env.load_state_dict(json.loads(json.dumps(state)))  # JSON-safe state
    assert env.sample(3) == nxt
    assert len(env.eval_examples()) == 30 and env.eval_examples(5) == env.eval_examples()[:5]


def test_prompt_env_over_a_list_reserves_heldout_rows() -> None:
    rows = [Example(f"q{i}", str(i)) for i in range(50)]
    env = PromptEnv(rows, seed=0, eval_fraction=0.2)
    held = {ex.prompt for ex in env.eval_examples()}
    assert len(held) == 10
    sampled = {ex.prompt for ex in env.sample(200)}
    assert sampled == {ex.prompt for ex in rows} - held


def _jsonl(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_load_jsonl_parquet_and_dataset(tmp_path: Path) -> None:
    import datasets

    rows = [{"prompt": "1+1=", "answer": 2, "level": "easy"}, {"prompt": "2+2=", "answer": "4", "level": "easy"}]
    path = _jsonl(tmp_path / "p.jsonl", [json.dumps(r).encode() for r in rows])
    examples = load_examples(path)
    assert examples[0] == Example("1+1=", "2", {"level": "easy"})
    datasets.Dataset.from_list(rows[1:]).to_parquet(str(tmp_path / "p.parquet"))
    assert load_examples(tmp_path / "p.parquet")[0] == Example("2+2=", "4", {"level": "easy"})
    ds = datasets.Dataset.from_list([{"question": "hi", "solution": "yo"}])
    assert load_examples(ds, prompt_key="question", answer_key="solution") == [Example("hi", "yo", {})]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([b'{"prompt": "a", "answer": "1"}', b'{"answer": "2"}'], r"p\.jsonl: line 2 has no 'prompt' field"),
        ([b'{"prompt": "a", "answer": "1"}', b'{"prompt": "  ", "answer": "2"}'], r"line 2: the prompt is empty"),
        ([b'{"prompt": "a"}'], r"line 1 has no 'answer' field"),
        ([b'{"prompt": "a", "answer": "1"}', b'{"prompt": "\xff\xfe", "answer": "2"}'], r"line 2 is not valid UTF-8"),
        ([b'{"prompt": "a", "answer": "1"', b"{}"], r"line 1 is not valid JSON"),
        ([b'{"prompt": 3, "answer": "1"}'], r"line 1: field 'prompt' must be a string"),
    ],
)
def test_bad_rows_name_the_file_and_row(tmp_path: Path, lines: list[bytes], message: str) -> None:
    path = _jsonl(tmp_path / "p.jsonl", lines)
    with pytest.raises(DatasetError, match=message) as info:
        load_examples(path)
    assert isinstance(info.value, PickaxeError)


def test_bad_source_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_examples(tmp_path / "missing.jsonl")
    (tmp_path / "p.csv").write_text("prompt\n")
    with pytest.raises(DatasetError, match="unsupported file type"):
        load_examples(tmp_path / "p.csv")
    import datasets

    ds = datasets.Dataset.from_list([{"prompt": b"ok", "answer": "1"}, {"prompt": b"\xc3\x28", "answer": "2"}])
    with pytest.raises(DatasetError, match=r"row 1: field 'prompt' is not valid UTF-8"):
        load_examples(ds)


def test_text_env_modules_import_without_a_circle() -> None:
    """``Example`` lives below both ``tasks`` and ``prompt_env``: no module of ``pickaxe.envs.text`` imports (even
    for type checking only) a module that imports it back."""
    import ast

    import pickaxe.envs.text as text

    folder = Path(text.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        name = f"pickaxe.envs.text.{path.stem}" if path.stem != "__init__" else "pickaxe.envs.text"
        graph[name] = {
            node.module
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pickaxe.envs.text.")
        }

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == target or (nxt not in seen and reaches(nxt, target, seen | {nxt})):
                return True
        return False

    circular = sorted(m for m in graph if m != "pickaxe.envs.text" and reaches(m, m, {m}))
    assert not circular, f"import circle through {circular}"
