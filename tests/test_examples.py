"""The README's Python example runs and learns."""

import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_cartpole_ppo_example_solves(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "cartpole_ppo.py"), "50000"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    match = re.search(r"eval return ([\d.]+) after (\d+) env steps", proc.stdout)
    assert match and float(match.group(1)) >= 475.0, proc.stdout[-2000:]
    assert (tmp_path / "runs" / "example-cartpole-ppo" / "model.safetensors").is_file()
