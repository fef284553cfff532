"""CorpusIngest's stage: corpus → N-word tuples (the privacy unit), written as TFRecord shards."""
from __future__ import annotations

import logging
import time
from typing import Optional

from dpbert import schema
from dpbert.config import CorpusConfig
from dpbert.data.corpus_warnings import VOCABULARY_WARNINGS, corpus_warnings
from dpbert.stages.result import StageResult

log = logging.getLogger("dpbert.ingest")

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
