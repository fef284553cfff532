"""README.md and docs/*.md stay true to the repository.

* Every repository path they name — in inline code (`dpbert/mechanism/gaussian.py`, also inside a
  command such as `python benchmarks/vocab_bench.py`) or as a link target — exists. A path a
  recipe asks the reader to write is marked where it is written (`` `my.yaml` <!-- to write --> ``)
  or listed in ``TO_WRITE``; source paths of other projects (TFX's) are in ``OTHER_PROJECTS``.
* Every ``dpbert …`` command in a fenced code block parses with the real argument parser
  (``dpbert_cli.main.build_parser``): parsed, never executed. Blocks fenced as ```` ```text ````
  are pictures (the DAG) or printed output and are not read as commands.
* The README is the front door: at most 200 lines, and it links every page under docs/.

The checkers are plain functions over text so that the positive controls at the end can feed them
a made-up path and an unknown subcommand and see them caught.
"""
from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README] + DOCS
README_MAX_LINES = 200

#: Paths that recipes ask the reader to create (not in the repository by design).
TO_WRITE = {
    "components/vertex_ui.py",   # docs/running-on-vertex.md §8: the Vertex UI artifact types
    "system/__init__.py",        # docs/running-on-vertex.md §8: the package the V2 entrypoint imports
}
#: First path components that are not this repository's: other projects' sources the docs cite
#: (read in their own repositories) and folders a run creates under its output directory.
OTHER_PROJECTS = {"tfx", "apache", "tensorflow", "apache_beam"}
RUN_OUTPUTS = {"_trainer_state"}
#: Fenced blocks of these info strings are pictures or printed output, not commands to run.
DIAGRAM_LANGUAGES = {"text"}
#: File endings that make an unknown first component suspicious (a misspelt top-level directory).
SOURCE_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".json", ".png", ".cfg", ".ini")

_FENCE = re.compile(r"^(```|~~~)[^\n]*\n.*?^\1[ \t]*$", re.M | re.S)
_INLINE = re.compile(r"`([^`]+)`([ \t]*<!--\s*to write\s*-->)?")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_PATHLIKE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.\-]*)+$")


def top_level_entries(repo: Path = REPO) -> set:
    """The repository's tracked top-level files and folders (``git ls-files``), else its listing."""
    try:
        files = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True,
                               check=True, timeout=60).stdout.split()
    except (OSError, subprocess.SubprocessError):
        files = []
    names = {f.split("/", 1)[0] for f in files}
    return names or {p.name for p in repo.iterdir() if not p.name.startswith(".")}


def _without_fences(text: str) -> str:
    """``text`` with fenced code blocks blanked (line numbers kept)."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def _tokens(span: str) -> Iterator[str]:
    for token in re.split(r"[\s=,]+", span):
        token = token.strip("()[]{}'\";:")
        token = token.split("::", 1)[0]          # tests/x.py::test_name
        if token:
            yield token


def named_paths(text: str) -> Iterator[Tuple[int, str, bool]]:
    """(line, path, marked "to write") of every path-like token in inline code outside fences."""
    body = _without_fences(text)
    for match in _INLINE.finditer(body):
        line = body.count("\n", 0, match.start()) + 1
        for token in _tokens(match.group(1)):
            if ("://" in token or token.startswith(("/", "~", "$", ".")) or any(c in token for c in "*<>{}…")
                    or "..." in token or not _PATHLIKE.match(token)):
                continue
            yield line, token, bool(match.group(2))


def linked_paths(text: str) -> Iterator[Tuple[int, str]]:
    """(line, target) of every relative link (images included) outside fences."""
    body = _without_fences(text)
    for match in _LINK.finditer(body):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s):, mailto:, an anchor on the same page
        yield body.count("\n", 0, match.start()) + 1, target.split("#", 1)[0]


def missing_paths(page: Path, text: str, repo: Path = REPO, top: set = None) -> List[str]:
    """``page:line: path`` for every path ``text`` names that does not exist. Inline code is read
    from the repository root; links from the page's folder, as a Markdown viewer follows them."""
    top = top_level_entries(repo) if top is None else top
    errors = []
    for line, path, to_write in named_paths(text):
        clean = path.rstrip("/")
        first = clean.split("/", 1)[0]
        if to_write or clean in TO_WRITE:
            if (repo / clean).exists() and clean in TO_WRITE:
                errors.append(f"{page.name}:{line}: {path} exists now: drop it from TO_WRITE")
            continue
        if first in top:
            if not (repo / clean).exists():
                errors.append(f"{page.name}:{line}: {path} does not exist")
        elif first not in OTHER_PROJECTS | RUN_OUTPUTS and clean.endswith(SOURCE_SUFFIXES):
            errors.append(f"{page.name}:{line}: {path}: no top-level {first!r} in the repository")
    for line, target in linked_paths(text):
        if target and not (page.parent / target).exists():
            errors.append(f"{page.name}:{line}: link target {target} does not exist")
    return errors


def fenced_commands(text: str) -> Iterator[Tuple[int, List[str]]]:
    """(line, argv after ``dpbert``) of every ``dpbert …`` command line in a fenced code block:
    continuation lines joined, ``# comments`` and leading ``VAR=value`` assignments dropped;
    ``.venv/bin/dpbert`` and ``python -m dpbert_cli`` count as ``dpbert``."""
    for block in _FENCE.finditer(text):
        if block.group(0).split("\n", 1)[0].strip("`~ \t") in DIAGRAM_LANGUAGES:
            continue
        start = text.count("\n", 0, block.start()) + 2  # the line after the opening fence
        lines = block.group(0).split("\n")[1:-1]
        i = 0
        while i < len(lines):
            first, logical = i, lines[i]
            while logical.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                logical = logical.rstrip()[:-1] + " " + lines[i]
            i += 1
            try:
                words = shlex.split(logical, comments=True)
            except ValueError:
                continue  # not shell (JSON, YAML, Python)
            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                words = words[1:]
            if words[:3] in (["python", "-m", "dpbert_cli"], [".venv/bin/python", "-m", "dpbert_cli"]):
                words = ["dpbert"] + words[3:]
            if words and (words[0] == "dpbert" or words[0].endswith("/dpbert")):
                yield start + first, words[1:]


def parse_error(argv: List[str]) -> str:
    """'' when ``dpbert ARGV`` parses with the real parser, else argparse's message."""
    from dpbert_cli.main import build_parser

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as stop:
        if stop.code not in (0, None):
            return stderr.getvalue().strip().splitlines()[-1] if stderr.getvalue().strip() else f"exit {stop.code}"
    return ""


def unparsable_commands(page: Path, text: str) -> List[str]:
    errors = []
    for line, argv in fenced_commands(text):
        message = parse_error(argv)
        if message:
            errors.append(f"{page.name}:{line}: dpbert {' '.join(argv)}: {message}")
    return errors


# --- the documents -------------------------------------------------------------------------------


def test_there_are_pages_to_check():
    assert README.exists() and len(DOCS) >= 8, [p.name for p in DOCS]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_named_path_exists(page):
    errors = missing_paths(page, page.read_text(encoding="utf-8"))
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_dpbert_command_in_a_code_block_parses(page):
    errors = unparsable_commands(page, page.read_text(encoding="utf-8"))
    assert not errors, "\n".join(errors)


def test_the_commands_are_found():
    """The extractor sees the README's own-corpus commands (else the parse test checks nothing)."""
    commands = [argv[0] for _, argv in fenced_commands(README.read_text(encoding="utf-8"))]
    assert {"budget", "run", "report", "dashboard"} <= set(commands), commands


def test_readme_is_at_most_200_lines():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail under docs/"


def test_readme_links_every_docs_page():
    text = README.read_text(encoding="utf-8")
    unlinked = [p.name for p in DOCS if f"(docs/{p.name})" not in text]
    assert not unlinked, f"README.md does not link {unlinked}"


# --- positive controls: the same checkers catch what they exist to catch --------------------------


def test_control_a_made_up_path_is_caught():
    page = REPO / "docs" / "control.md"
    text = ("See `dpbert/model/no_such_module.py`, `dpbret/model/dpsgd.py` (a misspelt folder),\n"
            "[the guide](no-such-page.md) and `python benchmarks/no_such_bench.py`.\n"
            "Real ones pass: `dpbert/mechanism/gaussian.py`, [privacy](privacy.md), `my.yaml` <!-- to write -->.\n"
            "```\nnot checked: dpbert/inside/a/fence.py\n```\n")
    errors = missing_paths(page, text)
    assert len(errors) == 4, errors
    for bad in ("dpbert/model/no_such_module.py", "dpbret/model/dpsgd.py", "no-such-page.md",
                "benchmarks/no_such_bench.py"):
        assert any(bad in e for e in errors), (bad, errors)
    assert all("control.md:" in e for e in errors), errors


def test_control_an_unknown_subcommand_and_a_bad_value_are_caught():
    page = REPO / "docs" / "control.md"
    text = ("```bash\n"
            "dpbert frobnicate --config dpbert/configs/demo.yaml\n"
            ".venv/bin/dpbert budget --target-epsilon E   # a placeholder where a number must be\n"
            "dpbert run --config x.yaml \\\n    --no-such-option\n"
            "dpbert budget --target-epsilon 3 --json      # parses\n"
            "```\n")
    errors = unparsable_commands(page, text)
    assert len(errors) == 3, errors
    assert "frobnicate" in errors[0] and "invalid choice" in errors[0], errors
    assert "--target-epsilon" in errors[1] and "invalid float" in errors[1], errors
    assert "--no-such-option" in errors[2] and "control.md:4:" in errors[2], errors
