"""The corpus fingerprint: what CorpusIngest's cache key knows of its input, as TFX's ExampleGen does.

TFX re-uses a component's outputs when its inputs, parameters and code are unchanged. CorpusIngest
has no input artifact: its input is a path in the configuration, so without this a corpus edited
in place (12 notes appended) would be served from the cache with every downstream artifact. The
fingerprint is a parameter of CorpusIngest (``pipeline/pipeline.py``) computed in the process that
builds the DAG: a changed corpus changes it, so the ingest and everything downstream re-run (new
artifacts); an unchanged corpus stays cached.

- a corpus path on this machine: sha256 over the sorted ``(relative path, size, content)`` of
  the files the reader reads (a directory: ``readers.text_dir_files``; JSONL / CSV / one text
  file: the file) when they total at most ``CONTENT_HASH_MAX_BYTES`` (a full read: cheap at that
  size, and an in-place edit that keeps size and mtime is still seen), else over the sorted
  ``(relative path, size, mtime_ns)`` (``stat`` only);
- the embedded synthetic corpus: a hash of its generator parameters (its code is covered by the
  component's ``code_version``);
- a path this machine cannot stat (``gs://``, a Vertex AI ``/gcs/`` FUSE path compiled elsewhere):
  a hash of the path string only. Such a compiled DAG does NOT see a corpus changed in place:
  write a changed corpus to a new path, or compile with ``pipeline.enable_cache=false``.

Operator-only: it is a function of the file sizes (and contents), so it is a component parameter
(ML Metadata's execution record) and never a property of a released artifact. It is not logged.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import List, Tuple

from dpbert.config import CorpusConfig

#: At or below this total size the files' contents are hashed (≈ 0.1 s per 64 MiB); above it,
#: their sizes and modification times.
CONTENT_HASH_MAX_BYTES = 64 * 2**20
_CHUNK = 1 << 20


def corpus_files(config: CorpusConfig) -> List[Tuple[str, Path]]:
    """``(relative path, path)`` of the files the reader of ``config`` reads, sorted; [] for the
    synthetic corpus. Raises ``OSError`` when ``config.path`` does not exist."""
    from dpbert.data import readers

    if config.path is None:
        return []
    root = Path(config.path)
    if root.is_dir():
        return [(str(p.relative_to(root)), p) for p in readers.text_dir_files(root, config.glob)]
    if not root.exists():
        raise FileNotFoundError(str(root))
    return [(root.name, root)]


def _remote(path: str) -> bool:
    return "://" in path


def corpus_fingerprint(config: CorpusConfig) -> str:
    """``KIND:sha256`` of the corpus of ``config`` (module docstring); KIND is ``content``,
    ``stat``, ``synthetic`` or ``path`` (the path string only: not stat-able here)."""
    h = hashlib.sha256()
    if config.path is None:
        h.update(json.dumps({"synthetic": _synthetic_params(config)}, sort_keys=True).encode("utf-8"))
        return "synthetic:" + h.hexdigest()
    path = str(config.path)
    try:
        if _remote(path):
            raise FileNotFoundError(path)
        files = corpus_files(config)
        stats = [(rel, p, p.stat()) for rel, p in files]
    except OSError:
        h.update(json.dumps({"path": path}).encode("utf-8"))
        return "path:" + h.hexdigest()
    total = sum(st.st_size for _, _, st in stats)
    if total <= CONTENT_HASH_MAX_BYTES:
        kind = "content"
        for rel, p, st in stats:
            h.update(json.dumps([rel, st.st_size]).encode("utf-8"))
            try:
                with open(p, "rb") as handle:
                    for chunk in iter(lambda: handle.read(_CHUNK), b""):
                        h.update(chunk)
            except OSError:  # unreadable: the reader will say so (exit 2); its stat still counts
                h.update(json.dumps(["unreadable", st.st_mtime_ns]).encode("utf-8"))
    else:
        kind = "stat"
        for rel, _, st in stats:
            h.update(json.dumps([rel, st.st_size, st.st_mtime_ns]).encode("utf-8"))
    return f"{kind}:{h.hexdigest()}"


def _synthetic_params(config: CorpusConfig) -> dict:
    import dataclasses

    return dataclasses.asdict(config.synthetic)
