"""Where the documents come from: a user's corpus path or the embedded synthetic generator."""
from __future__ import annotations

import dataclasses
from typing import Iterator, Optional

from dpbert.config import CorpusConfig
from dpbert.data import readers, synthetic
from dpbert.data.readers import CorpusError, DecodeStats, Document
from dpbert.data.tuples import WordTuple, corpus_tuples


def corpus_description(config: CorpusConfig) -> str:
    """A log-safe description of the corpus (its location, never its content)."""
    if config.path is None:
        s = config.synthetic
        if s.shape == "hospital":
            return f"embedded synthetic corpus (hospital shape, patients={s.patients}, seed={s.seed})"
        return (f"embedded synthetic corpus (patients={s.patients}, admissions/patient="
                f"{s.admissions_per_patient}, notes/admission={s.notes_per_admission}, seed={s.seed})")
    return f"{config.path} (format {config.format or readers.detect_format(config.path)})"


def iter_documents(config: CorpusConfig, stats: Optional[DecodeStats] = None) -> Iterator[Document]:
    """Stream the configured corpus; raises ``CorpusError`` (naming the path) if it is empty."""
    if config.path is None:
        return readers.require_nonempty(synthetic.corpus_notes(config.synthetic), "<synthetic corpus>")
    documents = readers.read_corpus(config.path, config.format, stats, config.glob, config.encoding)
    return readers.require_nonempty(documents, config.path)


@dataclasses.dataclass
class PartitionStats:
    documents: int = 0
    tuples: int = 0
    words: int = 0
    patients: int = 0
    replaced_bytes: int = 0
    skipped_error_rows: int = 0
    skipped_empty: int = 0


def iter_tuples(config: CorpusConfig, tuple_words: int, stats: Optional[PartitionStats] = None
                ) -> Iterator[WordTuple]:
    """Stream the N-word tuples of the configured corpus, filling ``stats`` as it goes.

    Raises ``CorpusError`` when the corpus yields no tuple at all (e.g. documents of
    whitespace and control characters only).
    """
    stats = stats if stats is not None else PartitionStats()
    decode = DecodeStats()
    patients = set()
    last_doc = None
    for t in corpus_tuples(iter_documents(config, decode), tuple_words):
        if t.doc_id != last_doc:
            stats.documents += 1
            last_doc = t.doc_id
        if t.patient_id is not None:
            patients.add(t.patient_id)
        stats.tuples += 1
        stats.words += len(t.words)
        stats.patients = len(patients)
        yield t
    stats.replaced_bytes = decode.replaced_bytes
    stats.skipped_error_rows = decode.skipped_error_rows
    stats.skipped_empty = decode.skipped_empty
    if stats.tuples == 0:
        where = config.path or "<synthetic corpus>"
        raise CorpusError("corpus has zero tuples (no words after normalization)", where)


def count_tuples(config: CorpusConfig, tuple_words: int) -> int:
    """n, the number of privacy units, for planning (reads the corpus, writes nothing)."""
    stats = PartitionStats()
    for _ in iter_tuples(config, tuple_words, stats):
        pass
    return stats.tuples
