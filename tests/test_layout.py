"""The core's layers point one way (issue 24): no import cycle among ``dpbert`` modules (imports
inside functions count), a one-way order among its packages, and ``dpbert.privacy`` — the math
layer — imports nothing from the layers built on it. The same for the command line's modules.

The graph is read from the code with ``ast``: every ``import`` / ``from … import`` in a file, at
module level or in a function body, whether or not it runs, relative imports resolved; ``from
a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``. A package's
``__init__`` is the node of the package itself.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: dpbert's packages and top-level modules, bottom first: an import may only point to an EARLIER
#: entry (or stay inside its own package). ``dpbert`` is the package's ``__init__``.
ORDER = (
    "dpbert", "exit_codes",
    "storage",          # the one storage layer (local, gs://, ram://, fake://): imports no other dpbert
    "schema", "config", "resources", "metadata",   # contracts and locators
    "pipeline_root",    # a run read from a pipeline root's executor outputs (no ML Metadata store)
    "privacy",          # the DP math: mechanisms, events, accountant, audit bounds
    "ledger",           # one privacy budget per dataset: the ledger document, its records, identity
    "accounting",       # THE owner of ε decisions: accounted σ, ε → σ solver, the budget gate, reserve
    "data",             # readers, tuples, the synthetic corpus
    "vocab",            # WordPiece from a DP histogram, public vocabularies
    "model",            # BERT, DP-SGD, training
    "evaluate",         # canaries, NER, membership, the white-box audit's harness
    "local_privacy",    # dχ-privacy (uses the model and the evaluators)
    "stages",           # the DAG's stages
    "trainer_workers",  # the trainer stage in W worker processes (python -m dpbert.trainer_workers)
    "release", "report",  # what leaves the trust boundary; the run's report
)
#: What the math layer must never import.
ABOVE_PRIVACY = ("model", "evaluate", "stages", "data", "vocab", "local_privacy")


def module_graph(root: Path, package: str) -> Dict[str, Set[str]]:
    """{module: the modules of ``package`` it imports} for every ``.py`` under ``root/package``."""
    files = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        files[".".join(parts[:-1] if is_init else parts)] = (path, is_init)

    def resolve(name: str):
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: Dict[str, Set[str]] = {}
    for module, (path, is_init) in files.items():
        here = module if is_init else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                         for alias in node.names]
            else:
                continue
            targets.update(resolve(n) for n in names if n.split(".")[0] == package)
        targets.discard(None)
        targets.discard(module)
        graph[module] = targets
    return graph


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    cycles: List[List[str]] = []

    def visit(v: str):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def layer(module: str) -> str:
    """``dpbert.privacy.events`` → ``privacy``; ``dpbert`` → ``dpbert``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(graph: Dict[str, Set[str]], order=ORDER) -> List[str]:
    """``"a -> b"`` for every import whose target's layer is not below its importer's."""
    rank = {name: i for i, name in enumerate(order)}
    bad = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = layer(module), layer(target)
            if a != b and rank[b] >= rank[a]:
                bad.append(f"{module} -> {target}")
    return bad


@pytest.fixture(scope="module")
def graph():
    return module_graph(ROOT, "dpbert")


def test_no_import_cycle_among_dpbert_modules(graph):
    assert len(graph) > 50 and find_cycles(graph) == []


def test_every_dpbert_package_has_its_place_in_the_order(graph):
    assert {layer(m) for m in graph} == set(ORDER)


def test_dpbert_packages_import_one_way(graph):
    assert upward_imports(graph) == []


def test_privacy_imports_nothing_from_the_layers_above_it(graph):
    bad = [f"{m} -> {t}" for m, ts in graph.items() if layer(m) == "privacy" for t in ts
           if layer(t) in ABOVE_PRIVACY]
    assert bad == []


def test_no_import_cycle_among_the_cli_modules():
    cli = module_graph(ROOT, "dpbert_cli")
    assert "dpbert_cli.args" in cli and find_cycles(cli) == []


# ------------------------------------------------------------------------- positive controls
def _write(root: Path, files: Dict[str, str]):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")


def test_the_checker_finds_a_cycle_through_a_function_level_import(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "def f():\n    from pkg.c import g\n    return g\n",
        "pkg/c.py": "from . import a\n",          # relative import closes the cycle
        "pkg/d.py": "import pkg.a\nimport os\n",  # reaches the cycle, is not in it
    })
    graph = module_graph(tmp_path, "pkg")
    assert graph["pkg.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"} and graph["pkg.d"] == {"pkg.a"}
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_the_checker_finds_an_upward_import_and_one_into_the_math_layer(tmp_path):
    _write(tmp_path, {
        "dpbert/__init__.py": "",
        "dpbert/privacy/__init__.py": "",
        "dpbert/privacy/bound.py": "def f():\n    from dpbert.model.train import step\n",
        "dpbert/model/__init__.py": "",
        "dpbert/model/train.py": "from dpbert.privacy import bound\n",
    })
    graph = module_graph(tmp_path, "dpbert")
    assert upward_imports(graph, ("dpbert", "privacy", "model")) == ["dpbert.privacy.bound -> dpbert.model.train"]
    assert find_cycles(graph) == [["dpbert.model.train", "dpbert.privacy.bound"]]
