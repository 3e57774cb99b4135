"""Kill ratio per module from ``mutmut results --all true`` output: ``python summary.py RESULTS [SECONDS]``."""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*(?P<module>[\w.]+)\.x\w*?__mutmut_\d+: (?P<status>.+)$")
LINE_CLASS = re.compile(r"^\s*(?P<module>[\w.]+?)\.x[ǁ\w]*__mutmut_\d+: (?P<status>.+)$")


def main() -> int:
    """Print one row per module: killed / (killed + survived), then the other statuses."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for line in Path(sys.argv[1]).read_text().splitlines():
        m = LINE_CLASS.match(line) or LINE.match(line)
        if m:
            counts[m["module"]][m["status"].strip()] += 1
    if len(sys.argv) > 2:
        print(f"wall time: {int(sys.argv[2]) / 60:.1f} min")
    print(f"{'module':32s} {'killed':>7s} {'survived':>9s} {'ratio':>6s}  other")
    total: Counter[str] = Counter()
    for module in sorted(counts):
        c = counts[module]
        total.update(c)
        tested = c["killed"] + c["survived"]
        ratio = f"{c['killed'] / tested:.0%}" if tested else "-"
        other = ", ".join(f"{k} {v}" for k, v in sorted(c.items()) if k not in ("killed", "survived"))
        print(f"{module:32s} {c['killed']:7d} {c['survived']:9d} {ratio:>6s}  {other}")
    tested = total["killed"] + total["survived"]
    if tested:
        print(f"{'all':32s} {total['killed']:7d} {total['survived']:9d} {total['killed'] / tested:6.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
