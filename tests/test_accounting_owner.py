"""Only ``dpbert.accounting`` asks dp-accounting for an ε: no ``get_epsilon`` call elsewhere in the
shipped tree (read with ``ast``), so every ε a verdict uses comes from the one owner."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("dpbert", "dpbert_cli", "pipeline", "components", "kubeflow", "dashboard", "beam_jobs", "benchmarks")
OWNER = ROOT / "dpbert" / "accounting"


def calls_of(source: str, name: str = "get_epsilon"):
    """Line numbers of calls ``<anything>.get_epsilon(...)`` or ``get_epsilon(...)`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr == name) or (isinstance(func, ast.Name) and func.id == name):
                found.append(node.lineno)
    return found


def offenders(root: Path = ROOT):
    out = []
    for package in SHIPPED:
        for path in sorted((root / package).rglob("*.py")):
            if OWNER in path.parents:
                continue
            text = path.read_text(encoding="utf-8")
            if "get_epsilon" in text:  # no call without the name: parse only the files that have it
                out += [f"{path.relative_to(root)}:{line}" for line in calls_of(text)]
    return out


def test_no_get_epsilon_outside_the_accounting_package():
    assert offenders() == []


def test_the_owner_itself_is_found_and_a_stray_call_fails(tmp_path):
    owner = (OWNER / "epsilon.py").read_text(encoding="utf-8")
    assert calls_of(owner), "the scan must see the owner's own call"
    # Positive control: a shipped module that asks dp-accounting directly is caught.
    stray = tmp_path / "dpbert" / "stages"
    stray.mkdir(parents=True)
    (stray / "rogue.py").write_text("def eps(acc):\n    return acc.compose(e).get_epsilon(1e-5)\n", encoding="utf-8")
    assert offenders(tmp_path) == ["dpbert/stages/rogue.py:2"]
