"""CorpusIngest's stage: corpus → N-word tuples (the privacy unit), written as TFRecord shards."""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Mapping, Optional

from dpbert import schema
from dpbert.config import CorpusConfig
from dpbert.stages.result import StageResult

log = logging.getLogger("dpbert.ingest")

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


def _corpus_bytes(config: CorpusConfig) -> Optional[int]:
    """The size on disk of the corpus (its file, or the non-hidden files of its directory, as
    ``read_text_dir`` reads them); None for the embedded synthetic corpus or when unreadable."""
    from dpbert.data.fingerprint import corpus_files

    if config.path is None:
        return None
    try:
        return sum(path.stat().st_size for _, path in corpus_files(config))
    except OSError:
        return None


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


#: Seconds between two ingest progress lines.
PROGRESS_INTERVAL_S = 30.0


def _with_progress(tuples, interval: float = PROGRESS_INTERVAL_S, clock=time.monotonic):
    """Yield ``tuples``, logging a line every ``interval`` seconds with the elapsed time ONLY: a
    line every k tuples, or a words/s rate, would reveal (a rounding of) the exact counts."""
    start = last = clock()
    for t in tuples:
        yield t
        now = clock()
        if now - last >= interval:
            last = now
            log.info("ingest: still reading (%.0f s elapsed)", now - start)


def ingest(config: CorpusConfig, tuples_dir: str, tuple_words: int, num_shards: int = 4,
           unit: str = "tuple") -> StageResult:
    """Check every record (``dpbert.data.validate``: the same checks as the CLI's preflight, here
    before the first write, as a run on Kubeflow/Dataflow did not pass the CLI's), then stream
    the corpus, cut each document into tuples of ``tuple_words`` words, write them.

    The properties are EXACT counts of units (documents, tuples, patients): they stay on this
    private artifact; planning uses a public ``training.dataset_size`` or a DP count
    (``dpbert.privacy.count``), never these.
    """
    from dpbert.data.corpus import PartitionStats, corpus_description, iter_tuples
    from dpbert.data.splits import write_holdout_key
    from dpbert.data.tfrecord import write_tuples
    from dpbert.data.validate import validate_corpus

    log.info("ingest: checking %s", corpus_description(config))
    validate_corpus(config, unit)  # raises CorpusError / ConfigError before anything is written
    log.info("ingest: reading %s, N = %d", corpus_description(config), tuple_words)
    stats = PartitionStats()
    n = write_tuples(_with_progress(iter_tuples(config, tuple_words, stats)), tuples_dir, num_shards)
    if stats.replaced_bytes:
        # No count in a log line (the exact count is the private artifact's replaced_bytes).
        log.warning("ingest: undecodable bytes were replaced by U+FFFD (replaced_bytes on the WordTuples artifact)")
    corpus_bytes = _corpus_bytes(config)
    # The secret key of the per-patient holdout (dpbert.data.splits), drawn without looking at the
    # data and kept only in this private artifact.
    write_holdout_key(tuples_dir)
    # Exact counts go to this private artifact's properties only, never to a log line.
    log.info("ingest: wrote the tuples to %s (exact counts on the private WordTuples artifact)", tuples_dir)
    properties = {
        schema.NUM_TUPLES: n,
        "num_documents": stats.documents,
        "num_patients": stats.patients,
        "num_words": stats.words,
        schema.TUPLE_WORDS: tuple_words,
        "replaced_bytes": stats.replaced_bytes,
        "corpus_bytes": corpus_bytes,
        "skipped_error_rows": stats.skipped_error_rows,
        "skipped_empty_documents": stats.skipped_empty,
        "corpus": corpus_description(config),
        schema.PRIVATE: 1,
    }
    # Rounded fractions only: no exact count in a log line. At INFO: `dpbert run` prints the run's
    # report warnings once at its end (and the report and dashboard carry them); the ones about
    # the DP vocabulary wait for it (the ingest does not know vocab.source).
    for warning in corpus_warnings(properties):
        if warning["code"] not in VOCABULARY_WARNINGS:
            log.info("ingest: %s (a warning of the run's report)", warning["message"])
    return StageResult(properties=properties)
