"""Paths of the public data shipped inside the package (``dpbert/resources/ner/bc5cdr``: a BC5CDR
subset, CC BY 4.0, README in that folder). The NER evaluator (``dpbert.evaluate.ner``) and the
public MLM-head warm-up (``dpbert.engine.public_warmup``) both read it; the path is defined here,
below both."""
from __future__ import annotations

from pathlib import Path

NER_DIR = Path(__file__).resolve().parent / "ner"


def bundled_bc5cdr_path(split: str) -> Path:
    """Path of the BC5CDR subset shipped in ``dpbert/resources/ner/bc5cdr`` (train or test)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return NER_DIR / "bc5cdr" / f"{split}.tsv"
