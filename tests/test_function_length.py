"""Functions short enough to read on one screen: none longer than 120 lines in the core's model,
stages, evaluate and privacy packages, and ``train_mlm`` a short factory (≤ 80 lines) over the
training engine. Positive control: the same scan flags a long function in a synthetic module."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dpbert/model", "dpbert/stages", "dpbert/evaluate", "dpbert/privacy")
LIMIT = 120


def long_functions(source: str, limit: int):
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                out.append((node.name, length))
    return out


def test_no_function_in_the_core_is_longer_than_120_lines():
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name, length in long_functions(path.read_text(encoding="utf-8"), LIMIT):
                found[f"{path.relative_to(ROOT)}::{name}"] = length
    assert not found, f"split these functions (> {LIMIT} lines): {found}"


def test_train_mlm_is_a_short_factory():
    tree = ast.parse((ROOT / "dpbert/model/train.py").read_text(encoding="utf-8"))
    (fn,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "train_mlm"]
    assert fn.end_lineno - fn.lineno + 1 <= 80


def test_the_scan_flags_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT + 5))
    assert long_functions(f"def long():\n{body}\n", LIMIT) == [("long", LIMIT + 6)]
    assert long_functions("def short():\n    return 1\n", LIMIT) == []
