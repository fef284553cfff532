"""The whole tree's layers point one way: no import cycle among the shipped modules (imports
inside functions count), a one-way order among the top-level packages (``TREE``) and among the
core's packages (``ORDER``), no stage importing another stage, and no adapter reaching into the
core's model: components, pipeline and kubeflow ask a stage (or a contract package), and
``dpbert.privacy`` — the math layer — imports nothing from the layers built on it.

The graph is read from the code with ``ast``: every ``import`` / ``from … import`` in a file, at
module level or in a function body, whether or not it runs, relative imports resolved; ``from
a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``. A package's
``__init__`` is the node of the package itself. docs/development.md ("Layers").
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Dict, Iterable, List, Set, Union

import pytest

ROOT = Path(__file__).resolve().parents[1]

# This file and tests/test_function_length.py scan the same tree (parsed once, :func:`parsed`): one
# xdist worker runs both, so the tree is parsed in one process, not in each.
pytestmark = pytest.mark.xdist_group("ast_scan")

#: The top-level packages, bottom first: an import may only point to an EARLIER entry (or stay
#: inside its own package).
TREE = (
    "dpbert",       # the core: plain Python, no TFX
    "beam_jobs",    # the Beam job's command-line entry (its code: dpbert.vocab.beam_histogram)
    "dashboard",    # reads runs through the core
    "components",   # TFX adapters: one stage each
    "pipeline",     # the DAG, its guard and the local runner
    "kubeflow",     # the Vertex AI compiler and its local rehearsal
    "dpbert_cli",   # the `dpbert` command
    "benchmarks",   # measurements: may import anything below
)
#: The top of the tree: it may import any core package; the adapters below it may not import
#: ``CORE_ONLY``.
TOP = (
    "dpbert_cli",
    "benchmarks",
)
#: Core packages that only the core (and ``TOP``) imports: the model and its training engine are
#: the stages' business.
CORE_ONLY = (
    "network",
    "mechanism",
    "engine",
    "diagnostics",
)

#: dpbert's packages and top-level modules, bottom first: an import may only point to an EARLIER
#: entry (or stay inside its own package). ``dpbert`` is the package's ``__init__``.
ORDER = (
    "dpbert",
    "exit_codes",
    "storage",          # the one storage layer (local, gs://, ram://, fake://): imports no other dpbert
    "launch",           # process plumbing: cluster layout, the one supervisor, launchers (knows no DP)
    "schema",           # contracts and locators
    "properties",       # the artifact properties as typed, versioned objects (one reader)
    "config",
    "resources",
    "metadata",
    "pipeline_root",    # a run read from a pipeline root's executor outputs (no ML Metadata store)
    "privacy",          # the DP math: mechanisms, events, accountant, audit bounds
    "ledger",           # one privacy budget per dataset: the ledger document, its records, identity
    "accounting",       # THE owner of ε decisions: accounted σ, ε → σ solver, the budget gate, reserve
    "data",             # readers, tuples, the synthetic corpus, the corpus's warnings
    "vocab",            # WordPiece from a DP histogram (its Beam job), public vocabularies
    "network",          # BERT and its public start: the encoder, the HF layout, which pieces train
    "mechanism",        # the DP-SGD step by role (mechanism, replica executor, step), its sampling, ghost clipping and run-time checks
    "engine",           # training: the loop, its chain and hooks, masking, optimizers, train_mlm
    "diagnostics",      # measurements of a run's mechanism (the noise check) and its loss curve
    "evaluate",         # canaries, NER, membership, the white-box audit's harness
    "tuning",           # lr and C chosen on a public proxy (the shipped loop, the evaluators; no ε)
    "local_privacy",    # dχ-privacy (uses the model and the evaluators)
    "report_model",     # the run's report as typed objects, and its one reader of the properties
    "report",           # the run's report: reads properties, imports no stage
    "release",          # what leaves the trust boundary
    "stages",           # the DAG's stages
    "trainer_workers",  # the trainer stage in W worker processes (python -m dpbert.trainer_workers)
)
#: What the math layer must never import.
ABOVE_PRIVACY = ("network", "mechanism", "engine", "diagnostics", "evaluate", "stages", "data", "vocab", "local_privacy")
#: The one module of ``dpbert.stages`` every stage may import (the result every stage returns).
STAGE_SHARED = ("dpbert.stages", "dpbert.stages.result")

#: Known upward arrows, each to be removed: this list may only shrink (empty: none is allowed).
KNOWN: Set[str] = set()


@functools.lru_cache(maxsize=None)
def parsed(path: Path) -> ast.Module:
    """The module at ``path``, parsed once per process (this file's graphs and the function-length
    scans of tests/test_function_length.py read the same files; each test's synthetic tree has
    paths of its own)."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _module_files(root: Path, packages: Iterable[str]) -> Dict[str, tuple]:
    """{dotted module: (path, is a package's __init__)} for every ``.py`` under ``root/<package>``."""
    files = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_init = parts[-1] == "__init__"
            files[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return files


def _imported_names(node, here: str, files) -> List[str]:
    """The dotted names an import statement names (relative ones resolved from package ``here``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
        base = ".".join(anchor + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]


def module_graph(root: Path, packages: Union[str, Iterable[str]]) -> Dict[str, Set[str]]:
    """{module: the modules of ``packages`` it imports} for every ``.py`` under ``root/<package>``."""
    packages = (packages,) if isinstance(packages, str) else tuple(packages)
    files = _module_files(root, packages)

    def resolve(name: str):
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: Dict[str, Set[str]] = {}
    for module, (path, is_init) in files.items():
        here = module if is_init else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(parsed(path)):
            targets.update(resolve(n) for n in _imported_names(node, here, files) if n.split(".")[0] in packages)
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
    """``"a -> b"`` for every import among dpbert's modules whose target's layer is not below its
    importer's (imports from outside dpbert: :func:`tree_violations`)."""
    rank = {name: i for i, name in enumerate(order)}
    bad = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if module.split(".")[0] != target.split(".")[0]:
                continue
            a, b = layer(module), layer(target)
            if a != b and a in rank and b in rank and rank[b] >= rank[a]:
                bad.append(f"{module} -> {target}")
    return bad


def tree_violations(graph: Dict[str, Set[str]], tree=TREE, top=TOP, core_only=CORE_ONLY) -> List[str]:
    """``"a -> b"`` for every import between top-level packages that points up ``tree`` (or
    sideways), and every import of a ``core_only`` package of ``tree[0]`` from below ``top``."""
    rank = {name: i for i, name in enumerate(tree)}
    bad = []
    for module, targets in sorted(graph.items()):
        a = module.split(".")[0]
        for target in sorted(targets):
            b = target.split(".")[0]
            upward = a != b and rank[b] >= rank[a]
            inside = b == tree[0] and a not in (tree[0], *top) and layer(target) in core_only
            if upward or inside:
                bad.append(f"{module} -> {target}")
    return bad


def stage_to_stage(graph: Dict[str, Set[str]]) -> List[str]:
    """``"a -> b"`` for every stage module importing another stage (the shared result excepted)."""
    return [f"{m} -> {t}" for m, ts in sorted(graph.items()) if layer(m) == "stages" and m not in STAGE_SHARED
            for t in sorted(ts) if layer(t) == "stages" and t not in STAGE_SHARED]


@pytest.fixture(scope="module")
def tree_graph():
    return module_graph(ROOT, TREE)


@pytest.fixture(scope="module")
def graph(tree_graph):
    return {m: {t for t in ts if t.split(".")[0] == "dpbert"} for m, ts in tree_graph.items()
            if m.split(".")[0] == "dpbert"}


def test_every_top_level_package_has_its_place_in_the_tree():
    shipped = {p.parent.name for p in ROOT.glob("*/__init__.py")} | {"benchmarks"}
    assert shipped - {"tests"} == set(TREE)


def test_no_import_cycle_in_the_tree(tree_graph):
    assert len(tree_graph) > 150 and find_cycles(tree_graph) == []


def test_the_tree_imports_one_way(tree_graph):
    bad = tree_violations(tree_graph)
    assert sorted(set(bad) - KNOWN) == [], "arrows up the tree (or into the core's model)"
    assert sorted(KNOWN - set(bad)) == [], "gone: take them out of KNOWN"


def test_every_dpbert_package_has_its_place_in_the_order(graph):
    assert {layer(m) for m in graph} == set(ORDER)


def test_dpbert_packages_import_one_way(graph):
    assert upward_imports(graph) == []


def test_no_stage_imports_another_stage(graph):
    assert stage_to_stage(graph) == []


def test_privacy_imports_nothing_from_the_layers_above_it(graph):
    bad = [f"{m} -> {t}" for m, ts in graph.items() if layer(m) == "privacy" for t in ts
           if layer(t) in ABOVE_PRIVACY]
    assert bad == []


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


def test_the_checker_finds_an_arrow_up_the_tree_a_reach_into_the_model_and_a_cycle_across_packages(tmp_path):
    _write(tmp_path, {
        "dpbert/__init__.py": "",
        "dpbert/model/__init__.py": "",
        "dpbert/model/engine.py": "",
        "dpbert/stages/__init__.py": "",
        "dpbert/stages/train.py": "from dpbert.model import engine\n",              # the core: allowed
        "dpbert/stages/vocab.py": "def f():\n    from beam_jobs import job\n",      # up the tree
        "beam_jobs/__init__.py": "",
        "beam_jobs/job.py": "from dpbert.stages import vocab\n",                  # closes a cycle
        "pipeline/__init__.py": "",
        "pipeline/guard.py": "from dpbert.model.engine import x\nfrom dpbert.stages import train\n",
        "dpbert_cli/__init__.py": "",
        "dpbert_cli/main.py": "import dpbert.model.engine\nimport pipeline.guard\n",  # the top: allowed
    })
    tree = ("dpbert", "beam_jobs", "pipeline", "dpbert_cli")
    graph = module_graph(tmp_path, tree)
    assert tree_violations(graph, tree, ("dpbert_cli",), ("model",)) == [
        "dpbert.stages.vocab -> beam_jobs.job", "pipeline.guard -> dpbert.model.engine"]
    assert find_cycles(graph) == [["beam_jobs.job", "dpbert.stages.vocab"]]


def test_the_checker_finds_a_stage_importing_another_stage(tmp_path):
    _write(tmp_path, {
        "dpbert/__init__.py": "",
        "dpbert/stages/__init__.py": "",
        "dpbert/stages/result.py": "",
        "dpbert/stages/ingest.py": "from dpbert.stages.result import StageResult\n",
        "dpbert/stages/report.py": "from .result import StageResult\nfrom .ingest import warnings\n",
    })
    assert stage_to_stage(module_graph(tmp_path, "dpbert")) == ["dpbert.stages.report -> dpbert.stages.ingest"]


def test_no_import_cycle_among_the_cli_modules():
    cli = module_graph(ROOT, "dpbert_cli")
    assert "dpbert_cli.args" in cli and find_cycles(cli) == []
