"""Time ``make test`` and write the result into docs/development.md's timing table.

    python benchmarks/make_test_timing.py [--print] [--keep 5] [-- MAKE_ARGS]

Runs ``make test`` (the dev loop: ``-m "not slow"``, two xdist workers) as a child process and
measures its wall time and the CPU time (user + system) of the whole process tree, as ``time``
reports them; when ``make`` fails, the last 60 lines of its output (pytest's failures) are printed
before the row. Before the run it stamps the commit (``git rev-parse``; ``+dirty`` when the working
tree differs from it), the date (UTC) and the load average (1, 5 and 15 min, as ``uptime`` prints
it: other jobs on the machine slow the suite down, so a figure is comparable only with a similar
load). Afterwards: pytest's summary line (passed, failed, …) and the exit status.

The row replaces the oldest when the table holds ``--keep`` rows (newest first), between the
``<!-- timing:begin -->`` and ``<!-- timing:end -->`` markers of docs/development.md ("Timing of
make test"); ``--print`` prints the row without writing. The script exits with ``make``'s status.
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "development.md"
BEGIN, END = "<!-- timing:begin -->", "<!-- timing:end -->"
HEADER = ("| date (UTC) | commit | load before (1 / 5 / 15 min) | CPUs | wall | CPU user + sys | pytest | exit |\n"
          "|---|---|---|---|---|---|---|---|")
SUMMARY = re.compile(r"^=*\s*(\d[^=]*?\b(?:passed|failed|errors?|skipped|deselected)\b.*?) in [0-9.]+s\b")


def commit(repo: Path = REPO) -> str:
    """The checked-out commit's short hash, ``+dirty`` when tracked files differ from it."""
    head = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=repo, capture_output=True,
                          text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                           capture_output=True, text=True, check=True).stdout.strip()
    return head + ("+dirty" if dirty else "")


def minutes(seconds: float) -> str:
    """``4 min 17 s``: whole seconds, never rounded to a flattering minute."""
    whole = int(round(seconds))
    return f"{whole // 60} min {whole % 60:02d} s" if whole >= 60 else f"{whole} s"


def pytest_summary(output: str) -> str:
    """The counts of pytest's last summary line (``1,245 passed, 3 deselected``), or ``-``."""
    found = [m.group(1) for m in map(SUMMARY.match, output.splitlines()) if m]
    return found[-1] if found else "-"


def run_make(make_args: Sequence[str]):
    """(wall s, CPU s of the process tree, exit status, output) of ``make test MAKE_ARGS``."""
    before = os.times()
    start = time.monotonic()
    proc = subprocess.run(["make", "test", *make_args], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - start
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu, proc.returncode, proc.stdout


def table_row(stamp: dict, wall: float, cpu: float, code: int, output: str) -> str:
    load = " / ".join(f"{x:.2f}" for x in stamp["load"])
    return (f"| {stamp['date']} | `{stamp['commit']}` | {load} | {stamp['cpus']} | {minutes(wall)} | "
            f"{minutes(cpu)} | {pytest_summary(output)} | {code} |")


def write_row(row: str, keep: int, doc: Path = DOC):
    """Put ``row`` first in the table between the markers, keeping at most ``keep`` rows."""
    text = doc.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc}: no {BEGIN} … {END} markers to write the timing table between")
    head, rest = text.split(BEGIN, 1)
    body, tail = rest.split(END, 1)
    rows = [line for line in body.splitlines() if line.startswith("| ") and not line.startswith("| date")]
    table = "\n".join([HEADER, row, *rows[: max(keep - 1, 0)]])
    doc.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}", encoding="utf-8")


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    make_args = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the row; do not write the doc")
    parser.add_argument("--keep", type=int, default=5, help="rows the table keeps (newest first)")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    stamp = {"commit": commit(), "load": os.getloadavg(), "cpus": os.cpu_count(),
             "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")}
    wall, cpu, code, output = run_make(make_args)
    row = table_row(stamp, wall, cpu, code, output)
    if code:  # a failing run's row is not the whole story: show pytest's failures and the tail
        print("\n".join(output.splitlines()[-60:]))
    print(row)
    if not args.print:
        write_row(row, args.keep)
    return code


if __name__ == "__main__":
    sys.exit(main())
