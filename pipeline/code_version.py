"""Code versions for TFX's cache: a hash of exactly the source a component runs.

TFX's cache key does not notice edits to a Python-function component's body or to the library
code it calls. Each component gets a ``code_version`` parameter,
``component_code_version("components.trainer")``: a hash of the first-party files the component
module imports, transitively, so an edit re-runs exactly the components it can affect (and a
resumed run, or editing an experiment script, re-uses everything else).

The import graph is read statically: every file is parsed with ``ast`` and every ``import x`` /
``from x import y`` in it counts, at module level or inside a function body (components import
their dependencies inside the executor function) — whether or not that line runs. An import
resolves to a file under one of ``FIRST_PARTY`` (``x/__init__.py`` for a package, ``x.py`` for a
module; ``from x import y`` also reaches the submodule ``x/y.py`` if there is one); importing
``a.b.c`` also runs ``a/__init__.py`` and ``a/b/__init__.py``, so those count too. Third-party
imports are ignored (their versions are pinned by the lock and the image). ``DATA`` adds the
bundled non-Python files a module reads.
"""
from __future__ import annotations

import ast
import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Iterator, List, Optional, Set

ROOT = Path(__file__).resolve().parents[1]

#: Top-level packages whose files are hashed (everything else is third party).
FIRST_PARTY = ("dpbert", "components", "beam_jobs", "pipeline")

#: module -> repo-relative paths of the bundled data it reads (hashed when the module is reached).
DATA = {
    "dpbert.data.synthetic": ("dpbert/data/lexicons",),   # the embedded synthetic corpus
    "dpbert.resources.bundled": ("dpbert/resources/ner",),  # the bundled BC5CDR subset
}


def _module_file(module: str, root: Path) -> Optional[Path]:
    """The file ``module`` is loaded from, if it is first party and exists under ``root``."""
    parts = module.split(".")
    if parts[0] not in FIRST_PARTY:
        return None
    base = root.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _with_parents(module: str) -> Iterator[str]:
    """``a.b.c`` -> ``a``, ``a.b``, ``a.b.c`` (importing a module runs its packages' __init__)."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        yield ".".join(parts[:i])


@lru_cache(maxsize=None)
def _imported_names(path: str, mtime_ns: int, size: int, module: str) -> tuple:
    """Every module name ``path`` (the file of ``module``) may import, relative imports resolved;
    for ``from x import y`` both ``x`` and ``x.y`` (``y`` may be a submodule)."""
    is_package = path.endswith("__init__.py")
    package = module if is_package else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(Path(path).read_bytes(), filename=path)):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".") if package else []
                anchor = anchor[:len(anchor) - (node.level - 1)] if node.level > 1 else anchor
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base:
                names.append(base)
            names.extend(f"{base}.{alias.name}" if base else alias.name
                         for alias in node.names if alias.name != "*")
    return tuple(names)


def component_sources(module: str, root: Optional[Path] = None) -> List[str]:
    """The repo-relative paths (sorted, POSIX) of the first-party files ``module`` depends on:
    its own file, every first-party module it imports transitively (with their packages'
    ``__init__.py``), and the ``DATA`` of the modules reached."""
    root = Path(root if root is not None else ROOT)
    if _module_file(module, root) is None:
        raise ValueError(f"{module!r} is not a first-party module under {root} ({', '.join(FIRST_PARTY)})")
    seen: Set[str] = set()
    files: Set[Path] = set()
    todo = list(_with_parents(module))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(name, root)
        if path is None:
            continue
        files.add(path)
        for data in DATA.get(name, ()):
            base = root / data
            if base.is_dir():
                files.update(f for f in base.rglob("*") if f.is_file())
            else:
                files.add(base)
        stat = path.stat()
        for imported in _imported_names(str(path), stat.st_mtime_ns, stat.st_size, name):
            todo.extend(n for n in _with_parents(imported) if n not in seen)
    return sorted(f.relative_to(root).as_posix() for f in files
                  if "__pycache__" not in f.parts and f.suffix != ".pyc")


def component_code_version(module: str, root: Optional[Path] = None) -> str:
    """sha256 (16 hex digits) over the paths and contents of ``component_sources(module)``."""
    root = Path(root if root is not None else ROOT)
    digest = hashlib.sha256()
    for rel in component_sources(module, root):
        digest.update(rel.encode())
        digest.update((root / rel).read_bytes())
    return digest.hexdigest()[:16]
