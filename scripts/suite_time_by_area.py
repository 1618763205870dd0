"""Where the test suite's time goes: pytest's `--durations=0` report summed by area (the folder under tests/).

    .venv/bin/python -m pytest -q -n 2 --durations=0 --durations-min=0 > durations.txt
    .venv/bin/python scripts/suite_time_by_area.py durations.txt [before.txt]

Prints one Markdown table: seconds (setup, call and teardown of every test, summed over the workers, so the
total is about twice the wall time on two workers), tests, and the share of the total; with a second report,
its seconds beside them and the ratio. The slowest files follow.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

LINE = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(tests/[^:\s]+)::")


def by_area(report: Path) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """(seconds by area, tests by area, seconds by file) of one `--durations=0` report."""
    seconds: Counter[str] = Counter()
    tests: Counter[str] = Counter()
    files: Counter[str] = Counter()
    for line in report.read_text().splitlines():
        match = LINE.match(line)
        if not match:
            continue
        duration, phase, path = float(match.group(1)), match.group(2), match.group(3)
        parts = path.split("/")
        area = parts[1] if len(parts) > 2 else parts[1].removesuffix(".py")
        seconds[area] += duration
        files[path] += duration
        tests[area] += phase == "call"
    return seconds, tests, files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="pytest --durations=0 output")
    parser.add_argument("before", type=Path, nargs="?", help="an earlier report to compare with")
    parser.add_argument("--files", type=int, default=10, help="how many of the slowest files to list")
    args = parser.parse_args()
    seconds, tests, files = by_area(args.report)
    before = by_area(args.before)[0] if args.before else None
    total = sum(seconds.values())
    header = "| area | seconds | tests | share |" + (" before | ratio |" if before else "")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for area, value in seconds.most_common():
        row = f"| {area} | {value:.0f} | {tests[area]} | {value / total:.0%} |"
        if before is not None:
            row += f" {before[area]:.0f} | {value / before[area]:.2f} |" if before[area] else " – | – |"
        print(row)
    row = f"| total | {total:.0f} | {sum(tests.values())} | 100% |"
    if before is not None:
        row += f" {sum(before.values()):.0f} | {total / sum(before.values()):.2f} |"
    print(row)
    print()
    for path, value in files.most_common(args.files):
        print(f"- {path}: {value:.0f} s")


if __name__ == "__main__":
    main()
