"""Streaming corpus readers: a directory of text files, JSONL, CSV (MIMIC-III NOTEEVENTS).

Every reader is a generator: one document at a time, never the whole corpus in memory.
Bytes are decoded in the declared encoding (``corpus.encoding``, :func:`parse_encoding`): by
default a byte that is not valid there is a ``CorpusError`` naming ``file:line`` (a Latin-1 note
read as UTF-8 would otherwise train on U+FFFD); with ``:replace`` (and for a reader called without
an encoding) it is replaced by U+FFFD and counted (``DecodeStats``; the count, never the bytes, is
reported). Errors raise ``CorpusError`` naming the file and, where there is one, the line (and
column); error messages never quote the text of a note.
"""
from __future__ import annotations

import codecs
import csv
import dataclasses
import json
import sys
from pathlib import Path
from typing import Iterator, Optional, Tuple

from dpbert.config import CorpusConfig

FORMATS = ("text", "jsonl", "csv")


class CorpusError(ValueError):
    """Bad corpus input; the message names the file (and line) at fault."""

    def __init__(self, message: str, path=None, line: Optional[int] = None, column: Optional[int] = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}" if line is not None else f"{path}"
            where += f":{column}: " if line is not None and column is not None else ": "
        super().__init__(where + message)
        self.path = str(path) if path is not None else None
        self.line = line
        self.column = column


@dataclasses.dataclass(frozen=True)
class Document:
    doc_id: str
    text: str
    patient_id: Optional[str] = None
    admission_id: Optional[str] = None
    note_id: Optional[str] = None


@dataclasses.dataclass
class DecodeStats:
    """What the readers saw besides documents: replaced bytes, skipped rows."""

    replaced_bytes: int = 0
    skipped_error_rows: int = 0
    skipped_empty: int = 0
    documents: int = 0


#: What a reader decodes with when it is given no encoding: UTF-8, undecodable bytes replaced.
LENIENT = "utf-8:replace"


def parse_encoding(spec: Optional[str]) -> Tuple[str, str]:
    """(codec, errors) of a ``corpus.encoding`` value: a Python codec name (``utf-8``,
    ``latin-1``, ``cp1252``, …), strict, or ``<codec>:replace`` (undecodable bytes become U+FFFD and
    are counted). None: :data:`LENIENT`. ``ValueError`` naming the value for an unknown codec."""
    codec, _, errors = (spec or LENIENT).partition(":")
    errors = errors or "strict"
    if errors not in ("strict", "replace"):
        raise ValueError(f"unknown error mode {errors!r} in {spec!r} (use <codec> or <codec>:replace)")
    try:
        codecs.lookup(codec)
    except LookupError:
        raise ValueError(f"unknown encoding {codec!r}") from None
    return codec, errors


def _decode(raw: bytes, stats: DecodeStats, encoding: Tuple[str, str] = ("utf-8", "replace"),
            path=None, line: Optional[int] = None) -> str:
    """``raw`` decoded with ``encoding`` (:func:`parse_encoding`). Strict: an invalid byte is a
    ``CorpusError`` at ``path:line`` (``line``: of the byte, counted from ``line`` when ``raw``
    spans several lines), naming the byte's value and ``corpus.encoding``, never the text.
    Replace: undecodable bytes become U+FFFD and are counted in ``stats``.

    Stateless on purpose (no global codec error handler), so interleaved readers and Beam
    workers count correctly.
    """
    codec, errors = encoding
    try:
        return raw.decode(codec)
    except UnicodeDecodeError as err:
        if errors == "strict":
            at = (line or 1) + raw.count(b"\n", 0, err.start)
            column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
            raise CorpusError(
                f"byte 0x{raw[err.start]:02x} at column {column} is not valid {codec} text: declare the "
                f"file's encoding (corpus.encoding, e.g. latin-1 or cp1252), convert it to {codec}, or set "
                f"corpus.encoding = {codec}:replace to replace such bytes by U+FFFD", path, at) from None
        stats.replaced_bytes += len(raw) - len(raw.decode(codec, "ignore").encode(codec))
        return raw.decode(codec, "replace")


def _decoded_lines(path: Path, stats: DecodeStats, encoding=("utf-8", "replace")) -> Iterator[str]:
    """The lines of ``path`` (newlines kept), decoded one at a time."""
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            yield _decode(raw, stats, encoding, path, line_no)


def _read_text(path: Path, stats: DecodeStats, encoding=("utf-8", "replace")) -> str:
    with open(path, "rb") as handle:
        return _decode(handle.read(), stats, encoding, path, 1)


def _opt(value) -> Optional[str]:
    if value is None:
        return None
    value = str(value).strip()
    return value or None


#: The files a folder corpus reads by default (``corpus.glob``, defined in ``dpbert.config``):
#: its ``*.txt`` files, at any depth.
DEFAULT_GLOB = CorpusConfig.glob


def read_text_dir(path, stats: Optional[DecodeStats] = None, pattern: str = DEFAULT_GLOB,
                  encoding: Optional[str] = None) -> Iterator[Document]:
    """Every file under ``path`` matching ``pattern`` (``text_dir_files``) is one document.

    The document id is the file's path relative to ``path``. Hidden files are skipped.
    ``encoding``: ``corpus.encoding`` (:func:`parse_encoding`).
    """
    stats = stats if stats is not None else DecodeStats()
    root = Path(path)
    codec = parse_encoding(encoding)
    for file in text_dir_files(root, pattern):
        text = _read_text(file, stats, codec)
        if not text.strip():
            stats.skipped_empty += 1
            continue
        stats.documents += 1
        yield Document(doc_id=str(file.relative_to(root)), text=text)


def text_dir_files(root, pattern: str = DEFAULT_GLOB) -> list:
    """The files ``read_text_dir`` reads (the one definition, ``fingerprint.corpus_files`` too):
    every regular file under ``root`` whose name matches ``pattern`` (``corpus.glob``, default
    ``*.txt``: a README.md or a notes.csv next to the notes is not a note), at any depth, sorted;
    hidden files and directories skipped."""
    root = Path(root)
    return sorted(
        p for p in root.rglob(pattern or DEFAULT_GLOB)
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )


def read_jsonl(path, stats: Optional[DecodeStats] = None, encoding: Optional[str] = None) -> Iterator[Document]:
    """One JSON object per line with ``text`` and optional ``patient_id``, ``admission_id``,
    ``note_id``. Blank lines are allowed."""
    for _, document in _jsonl_records(Path(path), stats if stats is not None else DecodeStats(), encoding):
        yield document


def _jsonl_records(path: Path, stats: DecodeStats, encoding: Optional[str] = None) -> Iterator[Tuple[int, Document]]:
    """(line number, document) of every non-empty record of a JSONL file."""
    for line_no, line in enumerate(_decoded_lines(path, stats, parse_encoding(encoding)), start=1):
        if not line.strip():
            continue
        # Without its line ending: json reports an error at the end of a line cut mid-record as
        # "line 2 column 1" of the text it was given; on the line alone, pos + 1 is its column.
        line = line.rstrip("\r\n")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            end = " (the line ends inside the record: cut mid-record?)" if err.pos >= len(line.rstrip()) else ""
            raise CorpusError(f"not valid JSON: {err.msg}{end}", path, line_no, err.pos + 1) from None
        if not isinstance(record, dict):
            raise CorpusError("expected a JSON object per line", path, line_no)
        if "text" not in record:
            raise CorpusError("JSON object has no 'text' field", path, line_no)
        if not isinstance(record["text"], str):
            raise CorpusError("'text' must be a string", path, line_no)
        if not record["text"].strip():
            stats.skipped_empty += 1
            continue
        note_id = _opt(record.get("note_id"))
        stats.documents += 1
        yield line_no, Document(
            doc_id=note_id or f"{path.name}:{line_no}",
            text=record["text"],
            patient_id=_opt(record.get("patient_id")),
            admission_id=_opt(record.get("admission_id")),
            note_id=note_id,
        )


# MIMIC-III NOTEEVENTS column names (case-insensitive); generic CSVs may use the lower-case
# names of the JSONL format instead.
_CSV_ALIASES = {
    "text": ("text",),
    "patient_id": ("subject_id", "patient_id"),
    "admission_id": ("hadm_id", "admission_id"),
    "note_id": ("row_id", "note_id"),
    "iserror": ("iserror",),
}


def read_csv(path, stats: Optional[DecodeStats] = None, encoding: Optional[str] = None) -> Iterator[Document]:
    """A CSV with a header and a TEXT column, e.g. MIMIC-III ``NOTEEVENTS.csv``.

    TEXT may be quoted and span several lines. Rows with ISERROR = 1 are skipped (MIMIC marks
    notes a physician identified as erroneous). SUBJECT_ID / HADM_ID / ROW_ID become the
    patient, admission and note ids.
    """
    for _, document in _csv_records(Path(path), stats if stats is not None else DecodeStats(), encoding):
        yield document


def _csv_records(path: Path, stats: DecodeStats, encoding: Optional[str] = None) -> Iterator[Tuple[int, Document]]:
    """(the row's first line, document) of every kept row of a CSV file."""
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    # strict: a quote that never closes, or a closing quote followed by more text, is an error
    # naming the row's first line (never a note silently swallowing the rows after it).
    reader = csv.reader(_decoded_lines(path, stats, parse_encoding(encoding)), strict=True)
    try:
        header = next(reader)
    except StopIteration:
        raise CorpusError("CSV file is empty (no header row)", path, 1) from None
    except csv.Error as err:
        raise _malformed(err, path, 1, reader.line_num) from None
    lower = [h.strip().lower() for h in header]
    columns = {}
    for key, names in _CSV_ALIASES.items():
        for name in names:
            if name in lower:
                columns[key] = lower.index(name)
                break
    if "text" not in columns:
        raise CorpusError(
            f"CSV header has no TEXT column (columns: {', '.join(h.strip() for h in header)})",
            path, 1)
    row_start = reader.line_num + 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as err:
            raise _malformed(err, path, row_start, reader.line_num) from None
        line_no, row_start = row_start, reader.line_num + 1
        if not row:
            continue
        if len(row) != len(header):
            raise CorpusError(
                f"row has {len(row)} fields, header has {len(header)}", path, line_no)

        def get(key):
            return row[columns[key]] if key in columns else None

        if (get("iserror") or "").strip() == "1":
            stats.skipped_error_rows += 1
            continue
        text = get("text")
        if not text.strip():
            stats.skipped_empty += 1
            continue
        note_id = _opt(get("note_id"))
        stats.documents += 1
        yield line_no, Document(
            doc_id=note_id or f"{path.name}:{line_no}",
            text=text,
            patient_id=_opt(get("patient_id")),
            admission_id=_opt(get("admission_id")),
            note_id=note_id,
        )


def _malformed(err: csv.Error, path: Path, row_start: int, line_num: int) -> CorpusError:
    """``file:line`` of the row where the csv module failed (the row's first line: where an
    unterminated quote opened), what went wrong, and where it was noticed."""
    text = str(err)
    if "unexpected end of data" in text or "EOF" in text:
        what = "unterminated quote: a quoted field opened in this row never closes (end of file reached)"
    elif "expected after" in text:
        what = ("malformed quote: a closing quote is followed by more text (a quote inside a quoted "
                "field must be doubled, \"\"; or a quote opened in this row is unterminated)")
    else:
        what = f"malformed CSV ({text})"
    if line_num > row_start:
        what += f"; detected at line {line_num}"
    return CorpusError(what, path, row_start)


def detect_format(path) -> str:
    path = Path(path)
    if path.is_dir():
        return "text"
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".csv":
        return "csv"
    if suffix in (".txt", ".text"):
        return "text"
    raise CorpusError(
        f"cannot tell the corpus format from the name; use one of {', '.join(FORMATS)} "
        "explicitly (corpus.format)", path)


def _checked_format(path: Path, fmt: Optional[str]) -> str:
    if not path.exists():
        raise CorpusError("corpus path does not exist", path)
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise CorpusError(f"unknown corpus format {fmt!r}; expected one of {', '.join(FORMATS)}", path)
    if fmt != "text" and path.is_dir():
        raise CorpusError(f"format {fmt!r} needs a file, got a directory", path)
    return fmt


def read_corpus(path, fmt: Optional[str] = None, stats: Optional[DecodeStats] = None,
                pattern: str = DEFAULT_GLOB, encoding: Optional[str] = None) -> Iterator[Document]:
    """Stream the documents of ``path`` in format ``fmt`` (detected from the name if None).

    A single ``.txt`` file in ``text`` format is one document; a folder's files matching
    ``pattern`` (``corpus.glob``) are one document each. ``encoding``: ``corpus.encoding``
    (:func:`parse_encoding`; None: UTF-8 with replacement).
    """
    path = Path(path)
    fmt = _checked_format(path, fmt)
    if fmt == "text":
        if path.is_dir():
            return read_text_dir(path, stats, pattern, encoding)
        return _single_text_file(path, stats, encoding)
    return read_jsonl(path, stats, encoding) if fmt == "jsonl" else read_csv(path, stats, encoding)


def read_records(path, fmt: Optional[str] = None, stats: Optional[DecodeStats] = None,
                 pattern: str = DEFAULT_GLOB, encoding: Optional[str] = None
                 ) -> Iterator[Tuple[Path, Optional[int], Document]]:
    """The documents of :func:`read_corpus` (the same readers, in the same order) with where each
    one is: ``(file, line, document)``; ``line`` is the record's (first) line in a JSONL or CSV
    file, None for a text file (one document per file). For ``dpbert.data.validate``."""
    path = Path(path)
    fmt = _checked_format(path, fmt)
    stats = stats if stats is not None else DecodeStats()
    if fmt == "text":
        if path.is_dir():
            return ((path / document.doc_id, None, document)
                    for document in read_text_dir(path, stats, pattern, encoding))
        return ((path, None, document) for document in _single_text_file(path, stats, encoding))
    records = _jsonl_records(path, stats, encoding) if fmt == "jsonl" else _csv_records(path, stats, encoding)
    return ((path, line, document) for line, document in records)


def _single_text_file(path: Path, stats: Optional[DecodeStats], encoding: Optional[str] = None) -> Iterator[Document]:
    stats = stats if stats is not None else DecodeStats()
    text = _read_text(path, stats, parse_encoding(encoding))
    if text.strip():
        stats.documents += 1
        yield Document(doc_id=path.name, text=text)
    else:
        stats.skipped_empty += 1


def require_nonempty(documents: Iterator[Document], path) -> Iterator[Document]:
    """Yield ``documents``; raise ``CorpusError`` naming ``path`` if there were none."""
    empty = True
    for document in documents:
        empty = False
        yield document
    if empty:
        raise CorpusError("corpus is empty: no document with text", path)
