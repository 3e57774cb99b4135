"""Test helper: a ``pickaxe train`` that must be refused as bad input (one line on stderr, exit status 2)."""

from __future__ import annotations

import pytest

from pickaxe.cli import main


def train_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run ``pickaxe train ARGS --no-progress``; assert it exits 2 with exactly one line on stderr; that line."""
    code = main(["train", *args, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    return err
