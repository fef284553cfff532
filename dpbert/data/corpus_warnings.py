"""Warnings about a run's corpus and its DP vocabulary, from the properties the stages recorded:
the ingest stage logs them, the report (``dpbert.report``) shows them. Computed from exact counts,
they are operator-only; their messages give fractions and averages rounded, never a count."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

#: Warn when more than this fraction of the corpus's bytes were not UTF-8 and were replaced by
#: U+FFFD. Real clinical text in UTF-8 has none; a few stray Latin-1 bytes in a large export stay
#: far below 1 %, while a file in another encoding, a binary file or random bytes replaces a
#: large share (random bytes: 8,683 of 20,000 = 43 %) and trains on noise.
REPLACED_FRACTION_WARNING = 0.01
#: Warn when the documents hold fewer words than this on average. Clinical notes hold hundreds of
#: words; documents of a handful of words (titles, codes, a mis-split file: 3-word documents) make
#: tuples far shorter than N, so the MLM sees almost no context and the DP vocabulary's per-tuple
#: counts are dominated by its noise.
MIN_WORDS_PER_DOCUMENT = 20
#: Warn when the whole corpus holds fewer words than this. The DP vocabulary keeps a word only
#: when its noisy count clears a threshold of tens of occurrences (C = 12.5 at σ = 2 for the
#: tiny test runs, hundreds at paper scale); below ~10,000 words almost no word clears it and the
#: vocabulary falls back to characters and sub-words.
MIN_CORPUS_WORDS = 10_000
#: Warn when the DP vocabulary kept fewer words than this (a released DP value): with so few
#: whole words the WordPiece vocabulary is mostly characters and the model learns little.
MIN_VOCAB_WORDS = 100


#: The warnings about a DP vocabulary: none when ``vocab.source`` is public (no DP vocabulary built).
VOCABULARY_WARNINGS = ("tiny_corpus", "tiny_vocabulary")


def corpus_warnings(props: Mapping[str, Any], words_kept: Any = None,
                    vocab_source: Optional[str] = None) -> List[Dict[str, str]]:
    """Warnings about the corpus (the WordTuples properties written by ``ingest``) and the DP
    vocabulary's ``words_kept``: ``[{"code", "message"}]``. The corpus warnings are computed from
    exact counts: operator-only, like the counts; their messages give fractions and averages
    rounded, never an exact count. Missing properties (older runs) give no warning.
    ``vocab_source`` (the DPVocabulary's ``vocab_source``; None: an older run, ``dp``): ``public``
    builds no DP vocabulary, so neither ``VOCABULARY_WARNINGS`` applies; ``public+dp`` appends the
    DP words to the public vocabulary, which stays whole words."""
    out: List[Dict[str, str]] = []
    source = vocab_source or "dp"

    def num(key):
        value = props.get(key)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    replaced, size = num("replaced_bytes"), num("corpus_bytes")
    if replaced and size and replaced / size > REPLACED_FRACTION_WARNING:
        out.append({"code": "replaced_bytes", "message": (
            f"{100 * replaced / size:.0f} % of the corpus's bytes are not UTF-8 and were replaced by U+FFFD "
            f"(> {100 * REPLACED_FRACTION_WARNING:g} %): is it UTF-8 text? (binary or another encoding)")})
    documents, words = num("num_documents"), num("num_words")
    if documents and words is not None and words / documents < MIN_WORDS_PER_DOCUMENT:
        out.append({"code": "short_documents", "message": (
            f"the documents hold {words / documents:.1f} words on average (< {MIN_WORDS_PER_DOCUMENT}): "
            "tuples this short give the model almost no context")})
    if source == "public":
        return out
    appended = source == "public+dp"
    if words is not None and words < MIN_CORPUS_WORDS:
        effect = ("can append almost no domain word to the public vocabulary" if appended else
                  "can keep almost no word (its threshold is tens of occurrences) and the model learns little")
        out.append({"code": "tiny_corpus", "message": (
            f"the corpus holds fewer than {MIN_CORPUS_WORDS:,} words: the DP vocabulary {effect}")})
    if isinstance(words_kept, (int, float)) and not isinstance(words_kept, bool) and words_kept < MIN_VOCAB_WORDS:
        effect = ("few domain words are appended to the public vocabulary" if appended else
                  "the WordPiece vocabulary is mostly characters and sub-words")
        out.append({"code": "tiny_vocabulary", "message": (
            f"the DP vocabulary kept {int(words_kept)} words (< {MIN_VOCAB_WORDS}): {effect}; use a larger corpus "
            "or less vocabulary noise")})
    return out
