"""The layering issue 13 asks for: stages without TFX, components thin and independent."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STAGES = sorted((ROOT / "dpbert" / "stages").glob("*.py"))
COMPONENTS = sorted(p for p in (ROOT / "components").glob("*.py") if p.name not in ("__init__.py", "artifacts.py"))
#: Shared adapter infrastructure every component may import.
SHARED = {"components", "components.artifacts", "components.common"}
MAX_LOGIC_LINES = 60


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def logic_lines(path: Path) -> int:
    """Lines of code, without docstrings, comments, blank lines, imports and def signatures."""
    text = path.read_text(encoding="utf-8")
    skipped = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            skipped.update(range(node.lineno, node.end_lineno + 1))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                skipped.update(range(body[0].lineno, body[0].end_lineno + 1))
            if not isinstance(node, ast.Module):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                skipped.update(range(first, body[0].lineno))
    return sum(1 for i, line in enumerate(text.splitlines(), 1)
               if i not in skipped and line.strip() and not line.strip().startswith("#"))


@pytest.mark.parametrize("path", STAGES, ids=lambda p: p.name)
def test_stages_import_no_tfx(path):
    assert not [m for m in _imports(path) if m == "tfx" or m.startswith(("tfx.", "components", "pipeline"))]


@pytest.mark.parametrize("path", COMPONENTS, ids=lambda p: p.name)
def test_components_are_thin_and_import_no_other_component(path):
    others = [m for m in _imports(path) if m.startswith("components") and m not in SHARED]
    assert not others, f"{path.name} imports another component: {others}"
    assert logic_lines(path) <= MAX_LOGIC_LINES


def test_logic_lines_counts_code_only(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text('"""doc"""\nimport os\n\n@decorator\ndef f(\n    a,\n):\n    """doc\n    more"""\n'
                      '    # comment\n    return a\n', encoding="utf-8")
    assert logic_lines(sample) == 1


@pytest.mark.parametrize("path", STAGES, ids=lambda p: p.name)
def test_no_stage_imports_another_stage(path):
    """Stages sit side by side: what two stages share lives below them (``dpbert.engine``,
    ``dpbert.evaluate``, ``dpbert.privacy``); only the shared result type is allowed."""
    own = f"dpbert.stages.{path.stem}"
    others = [m for m in _imports(path) if m.startswith("dpbert.stages") and m not in (own, "dpbert.stages.result")]
    assert not others, f"{path.name} imports another stage: {others}"
