"""The unit of privacy: consecutive N-word tuples of a document.

Every document is split into words (``dpbert.data.words``) and the words are cut into
consecutive, non-overlapping tuples of ``tuple_words`` words (N = 256 by default, as in Hoory et
al. 2021). The last tuple of a document keeps whatever is left (1..N words); a document with no
words yields no tuple. The split depends only on the document's text and ``tuple_words``: it is
deterministic and identical in the vocabulary job and in the training examples, which is what
lets the accountant compose their privacy losses over the same unit.

One tuple is one privacy unit: adding or removing one tuple changes at most N distinct words of
the histogram by one each, and one training example.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator, List, Optional

from dpbert.data.words import split_words

DEFAULT_TUPLE_WORDS = 256


@dataclasses.dataclass(frozen=True)
class WordTuple:
    """One privacy unit: up to N consecutive words of one document, with its provenance."""

    doc_id: str
    index: int  # position of the tuple inside its document, from 0
    words: tuple
    patient_id: Optional[str] = None
    admission_id: Optional[str] = None

    @property
    def tuple_id(self) -> str:
        return f"{self.doc_id}#{self.index}"

    @property
    def record_id(self) -> int:
        """A 63-bit integer id of this record (``tuple_id`` hashed): it belongs to the record, not
        to the row it is read into, so per-example randomness keyed by it (MLM masks) does not
        move when another record is added or removed."""
        return record_id(self.tuple_id)


def record_id(text_id: str) -> int:
    """63-bit integer id from a string id (BLAKE2b): stable across runs and machines."""
    import hashlib

    return int.from_bytes(hashlib.blake2b(text_id.encode("utf-8"), digest_size=8).digest(), "big") >> 1


def partition_words(words: List[str], tuple_words: int = DEFAULT_TUPLE_WORDS) -> List[List[str]]:
    """Cut ``words`` into consecutive chunks of ``tuple_words``; the last may be shorter."""
    if not isinstance(tuple_words, int) or isinstance(tuple_words, bool) or tuple_words < 1:
        raise ValueError(f"tuple_words must be an integer >= 1, got {tuple_words!r}")
    return [words[i:i + tuple_words] for i in range(0, len(words), tuple_words)]


def document_tuples(document, tuple_words: int = DEFAULT_TUPLE_WORDS) -> Iterator[WordTuple]:
    """The tuples of one ``dpbert.data.readers.Document``."""
    for index, chunk in enumerate(partition_words(split_words(document.text), tuple_words)):
        yield WordTuple(
            doc_id=document.doc_id,
            index=index,
            words=tuple(chunk),
            patient_id=document.patient_id,
            admission_id=document.admission_id,
        )


def corpus_tuples(documents: Iterable, tuple_words: int = DEFAULT_TUPLE_WORDS) -> Iterator[WordTuple]:
    """Stream the tuples of every document, in corpus order."""
    for document in documents:
        yield from document_tuples(document, tuple_words)


def distinct_words(word_tuple: WordTuple) -> frozenset:
    """f_v: the set of distinct words of a tuple (each counts once in the DP histogram)."""
    return frozenset(word_tuple.words)
