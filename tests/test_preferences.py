"""Preference data: pairs and ranked lists from JSONL, JSON, Parquet and ``datasets.Dataset``; each malformed row
is one ``DatasetError`` line naming the file, row and field; nothing is half-loaded."""

import json
from pathlib import Path
from typing import Any

import pytest

from pickaxe.envs.text import DatasetError, PreferencePair, load_preferences
from pickaxe.errors import PickaxeError

PAIRS = [
    {"prompt": "2+2=", "chosen": "4", "rejected": "5", "source": "hand"},
    {"prompt": "capital of France?", "chosen": "Paris", "rejected": "Lyon", "source": "hand"},
    {"prompt": "2+2=", "chosen": "4", "rejected": "22", "source": "web"},
]


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_pairs_from_jsonl_json_parquet_and_dataset(tmp_path: Path) -> None:
    import datasets

    expected = [
        PreferencePair("2+2=", "4", "5", group=0, row=0, metadata={"source": "hand"}),
        PreferencePair("capital of France?", "Paris", "Lyon", group=1, row=1, metadata={"source": "hand"}),
        PreferencePair("2+2=", "4", "22", group=0, row=2, metadata={"source": "web"}),  # same prompt, same group
    ]
    assert load_preferences(_jsonl(tmp_path / "p.jsonl", PAIRS)) == expected
    (tmp_path / "p.json").write_text(json.dumps(PAIRS))
    assert load_preferences(tmp_path / "p.json") == expected
    datasets.Dataset.from_list(PAIRS).to_parquet(str(tmp_path / "p.parquet"))
    assert load_preferences(str(tmp_path / "p.parquet")) == expected
    renamed = [{"q": r["prompt"], "good": r["chosen"], "bad": r["rejected"]} for r in PAIRS[:1]]
    got = load_preferences(datasets.Dataset.from_list(renamed), prompt_key="q", chosen_key="good", rejected_key="bad")
    assert got == [PreferencePair("2+2=", "4", "5")]


def test_a_ranking_becomes_all_its_ordered_pairs_grouped_per_prompt(tmp_path: Path) -> None:
    import datasets

    rows = [
        {"prompt": "name a prime", "ranked": ["7", "9", "x"], "id": 3},
        {"prompt": "2+2=", "ranked": ["4", "5"]},
        {"prompt": "name a prime", "ranked": ["2", "1"]},
    ]
    path = _jsonl(tmp_path / "r.jsonl", rows)
    got = load_preferences(path, ranking_key="ranked")
    assert [(p.chosen, p.rejected, p.group, p.row) for p in got] == [
        ("7", "9", 0, 0),
        ("7", "x", 0, 0),
        ("9", "x", 0, 0),
        ("4", "5", 1, 1),
        ("2", "1", 0, 2),
    ]
    assert got[0].metadata == {"id": 3} and got[3].metadata == {}
    datasets.Dataset.from_list(rows[:2]).to_parquet(str(tmp_path / "r.parquet"))  # lists survive Parquet
    from_parquet = load_preferences(tmp_path / "r.parquet", ranking_key="ranked")
    assert [(p.prompt, p.chosen, p.rejected, p.group) for p in from_parquet] == [
        (p.prompt, p.chosen, p.rejected, p.group) for p in got if p.row < 2
    ]


@pytest.mark.parametrize(
    ("rows", "ranking_key", "message"),
    [
        ([PAIRS[0], {"chosen": "a", "rejected": "b"}], None, r"p\.jsonl: line 2 has no 'prompt' field .*prompt_key"),
        ([{"prompt": "q", "rejected": "b"}], None, r"line 1 has no 'chosen' field .*set chosen_key"),
        ([{"prompt": "q", "chosen": "a", "rejected": None}], None, r"line 1 has no 'rejected' field"),
        ([{"prompt": "q", "chosen": 4, "rejected": "b"}], None, r"line 1: field 'chosen' must be a string, got int"),
        ([{"prompt": " ", "chosen": "a", "rejected": "b"}], None, r"line 1: field 'prompt' is empty"),
        (
            [{"prompt": "q", "chosen": "a", "rejected": "a"}],
            None,
            r"line 1: fields 'chosen' and 'rejected' are the same",
        ),
        ([PAIRS[0], ["q", "a", "b"]], None, r"line 2 is a list, not an object"),
        ([{"prompt": "q", "chosen": "a"}], "ranked", r"line 1 has no 'ranked' field .*set ranking_key"),
        ([{"prompt": "q", "ranked": "a > b"}], "ranked", r"line 1: field 'ranked' must be a list .*got str"),
        ([{"prompt": "q", "ranked": ["a"]}], "ranked", r"line 1: field 'ranked' ranks 1 response\(s\)"),
        ([{"prompt": "q", "ranked": ["a", 3]}], "ranked", r"line 1: field 'ranked\[1\]' must be a string"),
        ([{"prompt": "q", "ranked": ["a", ""]}], "ranked", r"line 1: field 'ranked\[1\]' is empty"),
        ([{"prompt": "q", "ranked": ["a", "b", "a"]}], "ranked", r"field 'ranked\[2\]' repeats 'ranked\[0\]'"),
    ],
)
def test_each_malformed_row_is_one_line_naming_file_row_and_field(
    tmp_path: Path, rows: list[Any], ranking_key: str | None, message: str
) -> None:
    path = _jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(DatasetError, match=message) as info:
        load_preferences(path, ranking_key=ranking_key)
    assert isinstance(info.value, PickaxeError)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_bad_files_and_bytes(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"preference file .* does not exist"):
        load_preferences(tmp_path / "missing.jsonl")
    (tmp_path / "p.csv").write_text("prompt,chosen,rejected\n")
    with pytest.raises(DatasetError, match=r"unsupported file type '\.csv'"):
        load_preferences(tmp_path / "p.csv")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="holds no rows"):
        load_preferences(tmp_path / "empty.jsonl")
    (tmp_path / "obj.json").write_text('{"prompt": "q"}')
    with pytest.raises(DatasetError, match="must hold a JSON list"):
        load_preferences(tmp_path / "obj.json")
    (tmp_path / "bad.jsonl").write_bytes(b'{"prompt": "q", "chosen": "a", "rejected": "b"}\n{"prompt": "\xff"}\n')
    with pytest.raises(DatasetError, match="line 2 is not valid UTF-8"):
        load_preferences(tmp_path / "bad.jsonl")


def test_nothing_is_half_loaded(tmp_path: Path) -> None:
    """A bad last row (or a broken last line) fails the whole load, so a caller can never train on the good
    prefix of a dataset by accident; fixing the row loads everything."""
    rows: list[Any] = [*PAIRS, {"prompt": "q", "chosen": "a"}]
    path = _jsonl(tmp_path / "p.jsonl", rows)
    result: list[PreferencePair] | None = None
    with pytest.raises(DatasetError, match="line 4 has no 'rejected' field"):
        result = load_preferences(path)
    assert result is None
    path.write_text(path.read_text() + '{"prompt": "q", "chosen": "a", "rejected": "b"\n')  # truncated last line
    with pytest.raises(DatasetError, match="line 5 is not valid JSON"):
        load_preferences(path)
    rows[-1]["rejected"] = "b"
    assert len(load_preferences(_jsonl(path, rows))) == 4
