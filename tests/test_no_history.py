"""The shipped tree holds no history and no treatise: history belongs in git, derivations in docs/.

* No issue numbers, "turn N", "round N" or "used to" in any text file of the shipped folders
  (code, comments, docstrings, templates, configuration): ``HISTORY``, matched as whole words, so
  ``return 0`` is code and not "turn 0".
* Every module docstring is at most ``MAX_DOCSTRING_LINES`` lines: purpose, contract and a link to
  docs/; the derivations live in docs/*.md.

Both checkers are plain functions over text, so the positive controls at the end feed them a
made-up snippet and see it caught.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("dpbert", "dpbert_cli", "components", "pipeline", "kubeflow", "dashboard", "beam_jobs", "benchmarks")
HISTORY = re.compile(r"\b(issue #?[0-9]+|turn [0-9]+|round [0-9]+|used to)\b", re.IGNORECASE)
MAX_DOCSTRING_LINES = 40
#: Files exempt from a rule, with the rule: this list may only shrink (an entry whose file is
#: clean fails the test: take it out). Empty: every shipped file keeps both rules.
BEING_REWRITTEN: Dict[str, str] = {}


def shipped_files(root: Path = ROOT) -> Iterator[Path]:
    """Every text file of the shipped folders (bytecode and binary files skipped)."""
    for folder in SHIPPED:
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                yield path


def history_lines(text: str) -> List[Tuple[int, str]]:
    """(line number, line) of every line that names an issue, a turn, a round or what code used to do."""
    return [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1) if HISTORY.search(line)]


def docstring_lines(source: str) -> int:
    """The number of source lines of the module docstring (0 without one)."""
    body = ast.parse(source).body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first.end_lineno - first.lineno + 1
    return 0


def _text(path: Path):
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None  # a binary file (an image, a committed store)


def test_no_history_in_the_shipped_tree():
    found = []
    for path in shipped_files():
        text = _text(path)
        if text is not None:
            found += [f"{path.relative_to(ROOT)}:{i}: {line}" for i, line in history_lines(text)]
    assert found == []


def test_module_docstrings_are_at_most_40_lines():
    long = {}
    for path in shipped_files():
        if path.suffix == ".py":
            lines = docstring_lines(path.read_text(encoding="utf-8"))
            if lines > MAX_DOCSTRING_LINES:
                long[path.relative_to(ROOT).as_posix()] = lines
    known = {p for p, what in BEING_REWRITTEN.items() if what == "docstring"}
    assert {p: n for p, n in long.items() if p not in known} == {}, "move the derivation to docs/*.md"
    assert sorted(p for p in known if (ROOT / p).exists() and p not in long) == [], "clean now: drop from BEING_REWRITTEN"


# ------------------------------------------------------------------------- positive controls
def test_the_history_check_catches_issue_turn_round_and_used_to_and_spares_code():
    snippet = ("x = 1  # fixed in issue #12\n"
               "def f():\n    return 0\n"
               '"""As asked in turn 3, the step used to round 2 ways."""\n'
               "# accumulation round 0 of T\n"
               "y = focused to\n")
    assert [i for i, _ in history_lines(snippet)] == [1, 4, 5]


def test_the_docstring_check_counts_the_module_docstrings_lines_only():
    long = '"""' + "line\n" * 41 + '"""\n' + "def f():\n    " + '"""' + "x\n" * 99 + '"""\n'
    assert docstring_lines(long) == 42 > MAX_DOCSTRING_LINES
    assert docstring_lines('"""One line."""\nimport os\n') == 1
    assert docstring_lines("import os\n" + long) == 0
