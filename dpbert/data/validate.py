"""The whole corpus checked before anything is written: a streaming pre-pass over every record.

``validate_corpus(corpus_config, unit)`` reads every record with the readers the ingest uses
(``dpbert.data.readers`` through ``read_records``: the same parsing, the same order) and raises
``CorpusError`` at the first record at fault, naming ``file:line`` (a text file: the file) and the
problem, never the record's text or ids:

- the text encoding (``corpus.encoding``, default UTF-8): a byte not valid in it, naming its line;
- JSONL syntax and fields (a line that is not a JSON object, no string ``text``; ``file:line:column``);
- CSV quoting (an unterminated quote, a closing quote followed by text) and row widths;
- ``privacy.unit: patient``: a patient id on EVERY record (JSONL ``patient_id``, CSV ``SUBJECT_ID``
  or ``patient_id``); a corpus format that cannot carry one (text files) is a ``ConfigError``;
- duplicate record ids (JSONL ``note_id``, CSV ``ROW_ID`` / ``note_id``: the document id every
  tuple id, MLM mask and canary key derives from): refused, naming both lines;
- a corpus with no document with text.

It runs twice: in the CLI process before the DAG exists (``pipeline.guard.preflight_corpus``: a
bad corpus leaves no output directory and no run in ML Metadata), and at the start of the ingest
stage before its first write (``dpbert.stages.ingest.ingest``: on Kubeflow/Dataflow, where the
CLI's pass did not run on the same machine). One pass, constant memory apart from the set of
record ids (a 12-byte digest and a line number per record: ≈ 100 bytes; MIMIC-III's 2.1M notes ≈
0.2 GB). Writes nothing, logs nothing.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Dict, Optional

from dpbert.config import ConfigError, CorpusConfig
from dpbert.data import readers, synthetic
from dpbert.data.readers import CorpusError, DecodeStats

#: The ``privacy.unit`` values that need a patient id on every record.
PATIENT_UNIT = "patient"


def patient_ids_missing_message(corpus: str) -> str:
    """A corpus format with no patient ids under ``privacy.unit: patient`` (a configuration error)."""
    return (f"privacy.unit = patient needs a patient id on every document, and this corpus ({corpus}) "
            f"has none: use JSONL with a patient_id field, a MIMIC NOTEEVENTS CSV (SUBJECT_ID) or the "
            f"synthetic corpus — or set privacy.unit = tuple")


@dataclasses.dataclass
class ValidationSummary:
    """What the pre-pass read (operator-only: an exact count; never logged by this module)."""

    documents: int = 0
    #: distinct patient ids among the records (0 when no record has one)
    patients: int = 0


def _digest(doc_id: str) -> bytes:
    return hashlib.blake2b(doc_id.encode("utf-8"), digest_size=12).digest()


def validate_corpus(config: CorpusConfig, unit: str = "tuple") -> ValidationSummary:
    """Read every record of the configured corpus and check it (module docstring); raises
    ``CorpusError`` (``file:line: problem``) or ``ConfigError`` (patient unit on a format without
    patient ids). Returns what it read (``ValidationSummary``)."""
    need_patient = unit == PATIENT_UNIT
    summary = ValidationSummary()
    if config.path is None:
        where = "<synthetic corpus>"
        records = ((where, None, d) for d in synthetic.corpus_notes(config.synthetic))
    else:
        fmt = config.format or readers.detect_format(config.path)
        if need_patient and fmt == "text":
            raise ConfigError(patient_ids_missing_message(config.path))
        records = readers.read_records(config.path, fmt, DecodeStats(), config.glob, config.encoding)
    seen: Dict[bytes, Optional[int]] = {}
    patients = set()  # 12-byte digests: ≈ 100 bytes a patient (MIMIC-III's 46.5k ≈ 5 MB)
    for path, line, document in records:
        summary.documents += 1
        if need_patient and not document.patient_id:
            raise CorpusError(
                "privacy.unit = patient needs a patient id on every document, and this record has none "
                "(JSONL: a non-empty patient_id; CSV: SUBJECT_ID or patient_id) — add it, drop the record "
                "or set privacy.unit = tuple", path, line)
        key = _digest(document.doc_id)
        if key in seen:
            first = seen[key]
            also = f" (first at line {first})" if first is not None else ""
            raise CorpusError(
                f"duplicate record id (note_id / ROW_ID){also}: record ids key the tuples, MLM masks and "
                f"canaries and must be unique; remove or renumber the duplicate", path, line)
        seen[key] = line
        if document.patient_id:
            patients.add(_digest(str(document.patient_id)))
    summary.patients = len(patients)
    if summary.documents == 0:
        raise CorpusError("corpus is empty: no document with text", config.path or "<synthetic corpus>")
    return summary
