"""The on-disk form of a word histogram: JSON Lines, one ``{"word": ..., "count": ...}`` per line.

Written by ``dpbert.vocab.beam_histogram`` (``run_dp_histogram`` / ``run_exact_histogram``) and read by
the WordPiece trainer. JSON rather than TSV because a word is an arbitrary string (the job does
not rely on the pre-tokenizer having removed tabs and newlines); each line is one self-contained
JSON object, so the file can be streamed and split.

- A DP histogram's ``count`` is the noisy count (a float) of a word whose noisy count passed the
  threshold; words that did not pass are absent. This is the only form in which the mechanism's
  output leaves the Beam job.
- An exact (non-private, ε = ∞) histogram's ``count`` is an integer: the number of tuples that
  contain the word. Only the BERT-M baseline uses it.

Lines are sorted by decreasing count, then by word, so a run's file does not depend on how the
runner partitioned the work.
"""
from __future__ import annotations

import json
import math
from typing import Iterable, List, Tuple

FORMAT = "jsonl"


def sort_key(pair: Tuple[str, float]):
    word, count = pair
    return (-count, word)


def format_line(word: str, count) -> str:
    """One line of the file (without the newline)."""
    if isinstance(count, (int,)) and not isinstance(count, bool):
        value = int(count)
    else:
        value = float(count)
    return json.dumps({"word": word, "count": value}, ensure_ascii=False)


def write_histogram(pairs: Iterable[Tuple[str, float]], path: str) -> int:
    """Write ``(word, count)`` pairs (sorted as documented) to ``path``; returns the line count."""
    from dpbert import storage

    rows = sorted(((str(w), c) for w, c in pairs), key=sort_key)
    storage.write_text(path, "".join(format_line(word, count) + "\n" for word, count in rows))
    return len(rows)


def read_histogram(path: str) -> List[Tuple[str, float]]:
    """Read a histogram file back as ``[(word, count), ...]`` in file order.

    Raises ``ValueError`` naming the file and line on a malformed line (the message never quotes
    the line: it may hold a word of the private corpus that did not pass a threshold elsewhere).
    """
    from dpbert import storage

    pairs: List[Tuple[str, float]] = []
    # split("\n"), not splitlines(): a word may hold U+2028 and the like (ensure_ascii=False).
    for line_no, line in enumerate(storage.read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            word, count = record["word"], record["count"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f"{path}:{line_no}: not a histogram line "
                             '(expected {"word": ..., "count": ...})') from None
        if not isinstance(word, str) or isinstance(count, bool) or not isinstance(count, (int, float)) \
                or not math.isfinite(count):
            raise ValueError(f"{path}:{line_no}: word must be a string and count a finite number")
        pairs.append((word, count))
    return pairs
