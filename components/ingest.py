"""CorpusIngest: corpus → N-word tuples (the privacy unit), written as TFRecord shards.

Adapter over ``dpbert.stages.ingest``.
"""
from tfx.dsl.component.experimental.annotations import OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component

from components.artifacts import WordTuples
from components.common import set_properties
from dpbert import schema
from dpbert.config import CorpusConfig, section_from_json
from dpbert.properties import to_write


@component
def CorpusIngest(
    tuples: OutputArtifact[WordTuples],
    corpus_config: Parameter[str],
    tuple_words: Parameter[int],
    code_version: Parameter[str],
    num_shards: Parameter[int] = 4,
    corpus_fingerprint: Parameter[str] = "",
    privacy_unit: Parameter[str] = "tuple",
):
    """Check every record, then stream the corpus, cut each document into tuples of
    ``tuple_words`` words and write them.

    ``corpus_fingerprint`` (``dpbert.data.fingerprint``: KEYED, its salt in the operator's private
    state) is read by nothing here: the local runner passes it so that TFX's cache key changes
    with the corpus. Operator-only (the local ML Metadata store's execution record), never copied
    to an artifact property; empty in a compiled Kubeflow / Vertex AI spec, where this step runs
    uncached (``kubeflow.runner``)."""
    from dpbert.stages.ingest import ingest

    del corpus_fingerprint  # the cache key's, not the stage's
    result = ingest(section_from_json(CorpusConfig, corpus_config), tuples.uri, tuple_words, num_shards,
                    unit=privacy_unit)
    set_properties(tuples, to_write(schema.WORD_TUPLES, {**result.properties, "code_version": code_version}))
