"""The corpus fingerprint: what CorpusIngest's cache key knows of its input, as TFX's ExampleGen does.

TFX re-uses a component's outputs when its inputs, parameters and code are unchanged. CorpusIngest
has no input artifact: its input is a path in the configuration, so without this a corpus edited
in place (12 notes appended) would be served from the cache with every downstream artifact. The
local runner passes the fingerprint as a parameter of CorpusIngest (``pipeline/pipeline.py``): a
changed corpus changes it, so the ingest and everything downstream re-run; an unchanged corpus
stays cached.

KEYED: HMAC-SHA256 under a 32-byte salt from ``os.urandom`` (``load_or_create_salt``), kept in the
operator's private state (``<pipeline_root>/_trainer_state/fingerprint_salt.json``, mode 0600,
created once). An unkeyed hash of the content is an ε = ∞ oracle: whoever reads it and knows the
rest of the corpus tries candidate notes until one reproduces it (one lab value of one patient out
of 1,000 candidates, ``tests/data/test_fingerprint.py``). Without the salt every candidate is
equally (un)likely: HMAC under an unknown uniform key is a pseudo-random function. The salt goes to
no spec, ML Metadata property, log line or release bundle; the fingerprint only to the LOCAL
runner's private ML Metadata store (CorpusIngest's execution parameters). A compiled Vertex AI /
Kubeflow spec carries no fingerprint at all (``kubeflow/runner.py``: CorpusIngest runs uncached
there instead).

What is keyed:
- a corpus path on this machine: the sorted ``(relative path, size, content)`` of the files the
  reader reads (a directory: ``readers.text_dir_files``; JSONL / CSV / one text file: the file)
  when they total at most ``CONTENT_HASH_MAX_BYTES`` (an in-place edit that keeps size and mtime
  is still seen), else their sorted ``(relative path, size, mtime_ns)`` (``stat`` only);
- the embedded synthetic corpus: its generator parameters (its code is covered by the
  component's ``code_version``);
- a path this machine cannot stat (``gs://``): the path string only (a corpus changed in place
  there is not seen: write it to a new path, or run with ``pipeline.enable_cache=false``).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import List, Tuple

from dpbert.config import CorpusConfig

#: At or below this total size the files' contents are keyed (≈ 0.1 s per 64 MiB); above it,
#: their sizes and modification times.
CONTENT_HASH_MAX_BYTES = 64 * 2**20
_CHUNK = 1 << 20
#: The salt's file name, in the operator's private state directory (``pipeline/pipeline.py``).
SALT_FILE = "fingerprint_salt.json"
SALT_BYTES = 32


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


def corpus_fingerprint(config: CorpusConfig, salt: bytes) -> str:
    """``KIND:hex(HMAC-SHA256(salt, corpus))`` of the corpus of ``config`` (module docstring);
    KIND is ``content``, ``stat``, ``synthetic`` or ``path`` (the path string only)."""
    if not isinstance(salt, bytes) or len(salt) < 16:
        raise ValueError("corpus_fingerprint needs the operator's salt (load_or_create_salt): "
                         "an unkeyed corpus hash is an oracle for the corpus's content")
    h = hmac.new(salt, digestmod=hashlib.sha256)
    if config.path is None:
        h.update(json.dumps({"synthetic": _synthetic_params(config)}, sort_keys=True).encode("utf-8"))
        return "synthetic:" + h.hexdigest()
    path = str(config.path)
    try:
        if _remote(path):
            raise FileNotFoundError(path)
        stats = [(rel, p, p.stat()) for rel, p in corpus_files(config)]
    except OSError:
        h.update(json.dumps({"path": path}).encode("utf-8"))
        return "path:" + h.hexdigest()
    if sum(st.st_size for _, _, st in stats) > CONTENT_HASH_MAX_BYTES:
        for rel, _, st in stats:
            h.update(json.dumps([rel, st.st_size, st.st_mtime_ns]).encode("utf-8"))
        return "stat:" + h.hexdigest()
    for rel, p, st in stats:
        h.update(json.dumps([rel, st.st_size]).encode("utf-8"))
        try:
            with open(p, "rb") as handle:
                for chunk in iter(lambda: handle.read(_CHUNK), b""):
                    h.update(chunk)
        except OSError:  # unreadable: the reader will say so (exit 2); its stat still counts
            h.update(json.dumps(["unreadable", st.st_mtime_ns]).encode("utf-8"))
    return "content:" + h.hexdigest()


def _synthetic_params(config: CorpusConfig) -> dict:
    import dataclasses

    return dataclasses.asdict(config.synthetic)


# --------------------------------------------------------------------------- the salt
def load_or_create_salt(state_root: str) -> bytes:
    """The salt in ``<state_root>/SALT_FILE``, created once (32 bytes of ``os.urandom``) when
    missing. ``state_root`` is the operator's private state directory. Concurrent first calls
    agree: the file is created exclusively and the loser reads the winner's salt. Raises
    ``ValueError`` naming the file when it exists but holds no valid salt (never overwritten
    here: the operator decides)."""
    uri = state_root.rstrip("/") + "/" + SALT_FILE
    text = _read(uri)
    if text is None:
        payload = json.dumps({"salt": base64.b64encode(os.urandom(SALT_BYTES)).decode("ascii"),
                              "purpose": "HMAC key of the corpus fingerprint (dpbert.data.fingerprint): "
                                         "operator-only, never release"})
        _create(uri, payload)
        text = _read(uri)
    try:
        salt = base64.b64decode(json.loads(text)["salt"], validate=True)
    except (ValueError, KeyError, TypeError):
        salt = b""
    if len(salt) != SALT_BYTES:
        raise ValueError(f"{uri}: not a fingerprint salt (expected JSON {{\"salt\": base64 of {SALT_BYTES} "
                         f"bytes}}); move it away to create a new one (the next run re-reads the corpus)")
    return salt


def _read(uri: str):
    """The file's text, or None when missing."""
    from dpbert import storage

    try:
        return storage.read_text(uri)
    except FileNotFoundError:
        return None


def _create(uri: str, text: str) -> None:
    """Create ``uri`` with ``text`` unless it exists (then keep it): a create-only write
    (generation 0), so concurrent first runs agree on one salt. ``private``: mode 0600 from the
    first byte on a local disk; on a bucket its IAM governs access."""
    from dpbert import storage

    try:
        storage.write_text(uri, text, if_generation_match=0, private=True)
    except storage.PreconditionFailed:
        pass  # another process created it first: its salt is the salt
