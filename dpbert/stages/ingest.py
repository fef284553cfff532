"""CorpusIngest's stage: corpus → N-word tuples (the privacy unit), written as TFRecord shards."""
from __future__ import annotations

import logging
import time

from dpbert import schema
from dpbert.config import CorpusConfig
from dpbert.stages.result import StageResult

log = logging.getLogger("dpbert.ingest")


def _with_progress(tuples, stats, every: int = 5000):
    start = time.time()
    for t in tuples:
        yield t
        if stats.tuples % every == 0:
            # Progress without counts: exact corpus counts never go to a log line.
            log.info("ingest: reading, %.0f words/s", stats.words / max(time.time() - start, 1e-9))


def ingest(config: CorpusConfig, tuples_dir: str, tuple_words: int, num_shards: int = 4) -> StageResult:
    """Stream the corpus, cut each document into tuples of ``tuple_words`` words, write them.

    The properties are EXACT counts of units (documents, tuples, patients): they stay on this
    private artifact; planning uses a public ``training.dataset_size`` or a DP count
    (``dpbert.privacy.count``), never these.
    """
    from dpbert.data.corpus import PartitionStats, corpus_description, iter_tuples
    from dpbert.data.splits import write_holdout_key
    from dpbert.data.tfrecord import write_tuples

    log.info("ingest: reading %s, N = %d", corpus_description(config), tuple_words)
    stats = PartitionStats()
    n = write_tuples(_with_progress(iter_tuples(config, tuple_words, stats), stats), tuples_dir, num_shards)
    if stats.replaced_bytes:
        log.warning("ingest: %d undecodable bytes were replaced by U+FFFD", stats.replaced_bytes)
    # The secret key of the per-patient holdout (dpbert.data.splits), drawn without looking at the
    # data and kept only in this private artifact.
    write_holdout_key(tuples_dir)
    # Exact counts go to this private artifact's properties only, never to a log line.
    log.info("ingest: wrote the tuples to %s (exact counts on the private WordTuples artifact)", tuples_dir)
    return StageResult(properties={
        schema.NUM_TUPLES: n,
        "num_documents": stats.documents,
        "num_patients": stats.patients,
        schema.TUPLE_WORDS: tuple_words,
        "replaced_bytes": stats.replaced_bytes,
        "skipped_error_rows": stats.skipped_error_rows,
        "skipped_empty_documents": stats.skipped_empty,
        "corpus": corpus_description(config),
        schema.PRIVATE: 1,
    })
