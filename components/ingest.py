"""CorpusIngest: corpus → N-word tuples (the privacy unit), written as TFRecord shards."""

import logging
import time

from tfx.dsl.component.experimental.annotations import OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component

from components.artifacts import WordTuples
from components.common import section_from_json, set_properties
from dpbert.config import CorpusConfig
from dpbert.data.corpus import PartitionStats, corpus_description, iter_tuples
from dpbert.data.tfrecord import write_tuples

log = logging.getLogger("dpbert.ingest")


def _with_progress(tuples, stats: PartitionStats, every: int = 5000):
    start = time.time()
    for t in tuples:
        yield t
        if stats.tuples % every == 0:
            log.info("ingest: %d tuples, %d documents, %.0f words/s", stats.tuples, stats.documents,
                     stats.words / max(time.time() - start, 1e-9))


@component
def CorpusIngest(
    tuples: OutputArtifact[WordTuples],
    corpus_config: Parameter[str],
    tuple_words: Parameter[int],
    code_version: Parameter[str],
    num_shards: Parameter[int] = 4,
):
    """Stream the corpus, cut each document into tuples of ``tuple_words`` words, write them.

    The artifact's properties are counts of units (documents, tuples, patients), which the
    accountant treats as public (n sets the sampling rate); no word count is recorded.
    """
    config = section_from_json(CorpusConfig, corpus_config)
    log.info("ingest: reading %s, N = %d", corpus_description(config), tuple_words)
    stats = PartitionStats()
    n = write_tuples(_with_progress(iter_tuples(config, tuple_words, stats), stats), tuples.uri, num_shards)
    set_properties(tuples, {
        "num_tuples": n,
        "num_documents": stats.documents,
        "num_patients": stats.patients,
        "tuple_words": tuple_words,
        "replaced_bytes": stats.replaced_bytes,
        "skipped_error_rows": stats.skipped_error_rows,
        "skipped_empty_documents": stats.skipped_empty,
        "corpus": corpus_description(config),
        "private": 1,
        "code_version": code_version,
    })
    if stats.replaced_bytes:
        log.warning("ingest: %d undecodable bytes were replaced by U+FFFD", stats.replaced_bytes)
    log.info("ingest: wrote %d tuples from %d documents to %s", n, stats.documents, tuples.uri)
