"""Code versions for TFX's cache.

TFX's cache key does not notice edits to a Python-function component's body or to the library
code it calls. Each component gets a ``code_version`` parameter: a hash of the source files it
depends on, so an edit re-runs exactly the components it can affect (and a resumed run re-uses
everything else).
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=None)
def code_version(*relative_paths: str) -> str:
    """sha256 (16 hex digits) over the .py files under the given repo-relative paths."""
    digest = hashlib.sha256()
    for rel in sorted(relative_paths):
        base = ROOT / rel
        files = [base] if base.is_file() else sorted(base.rglob("*.py"))
        for f in files:
            digest.update(str(f.relative_to(ROOT)).encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()[:16]
