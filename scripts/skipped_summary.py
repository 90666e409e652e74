"""What a pytest run skipped, read from its JUnit XML report, said last so it cannot be missed.

Usage: ``python scripts/skipped_summary.py REPORT.xml``. Prints one line per skip reason (the
tests it skipped, where) and ends with one summary line. A skip reason may name the command that
enables the test as ``(enable: COMMAND)``; that command is repeated in the summary line. Always
exits 0: the summary informs, the pytest exit code decides.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ENABLE = re.compile(r"\(enable: ([^)]+)\)")
PREFIX = "scripts/test.sh:"


@dataclass(frozen=True)
class Skip:
    """Tests skipped for one reason: where, how many, and the command that enables them."""

    reason: str
    files: tuple[str, ...]
    count: int

    @property
    def enable(self) -> str | None:
        match = ENABLE.search(self.reason)
        return match.group(1).strip() if match else None


def _reason(element: ET.Element) -> str:
    text = element.get("message") or element.text or "no reason given"
    # pytest writes "Skipped: REASON" in the message, "path:line: REASON" in the text
    text = text.strip().removeprefix("Skipped: ")
    return re.sub(r"^\S+:\d+: ", "", text)


def _file(case: ET.Element) -> str:
    name = case.get("file")
    if name:
        return name
    classname = case.get("classname") or "?"
    parts = classname.split(".")
    while parts and parts[-1][:1].isupper():  # a test class
        parts.pop()
    return "/".join(parts) + ".py" if parts else classname


def read_skips(report: Path) -> list[Skip]:
    """The skips of a JUnit XML report, grouped by reason, in the order first seen."""
    files: dict[str, list[str]] = defaultdict(list)
    for case in ET.parse(report).getroot().iter("testcase"):
        skipped = case.find("skipped")
        if skipped is None or skipped.get("type") == "pytest.xfail":
            continue
        files[_reason(skipped)].append(_file(case))
    return [
        Skip(reason, tuple(dict.fromkeys(where)), len(where)) for reason, where in files.items()
    ]


def summary_lines(skips: list[Skip]) -> list[str]:
    """The lines to print: one per reason, then the summary line (always last)."""
    if not skips:
        return [f"{PREFIX} nothing skipped"]
    lines = [f"{PREFIX} SKIPPED, not run:"]
    for skip in skips:
        tests = "1 test" if skip.count == 1 else f"{skip.count} tests"
        lines.append(f"  {', '.join(skip.files)} ({tests}): {skip.reason}")
    total = sum(s.count for s in skips)
    what = "; ".join(
        ", ".join(s.files) + (f" (to run it: {s.enable})" if s.enable else "") for s in skips
    )
    tests = "1 test was" if total == 1 else f"{total} tests were"
    last = f"{PREFIX} {tests} SKIPPED: {what}"
    lines.append(last)
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/skipped_summary.py REPORT.xml", file=sys.stderr)
        return 2
    report = Path(argv[0])
    try:
        skips = read_skips(report)
    except (OSError, ET.ParseError) as err:
        print(f"{PREFIX} cannot tell what was skipped: {report}: {err}")
        return 0
    print("\n".join(summary_lines(skips)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
