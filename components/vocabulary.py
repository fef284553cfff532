"""DPVocabularyGen: tuples → DP word histogram (Beam) → WordPiece vocabulary.

Adapter over ``dpbert.stages.vocabulary`` (the Beam job runs on TFX's Beam pipeline).
"""
import apache_beam as beam
from tfx.dsl.component.experimental.annotations import (BeamComponentParameter, InputArtifact,
                                                        OutputArtifact, Parameter)
from tfx.dsl.component.experimental.decorators import component

from components.artifacts import DPVocabulary, WordTuples
from components.common import get_property, set_properties
from dpbert import schema
from dpbert.config import ModelConfig, PrivacyConfig, VocabConfig, section_from_json
from dpbert.properties import to_write


@component(use_beam=True)
def DPVocabularyGen(
    tuples: InputArtifact[WordTuples],
    vocabulary: OutputArtifact[DPVocabulary],
    vocab_config: Parameter[str],
    privacy_config: Parameter[str],
    code_version: Parameter[str],
    model_config: Parameter[str] = "{}",
    ledger_target: Parameter[str] = "",
    beam_pipeline: BeamComponentParameter[beam.Pipeline] = None,
):
    """Count each distinct word once per tuple, add N(0, σ²), keep counts ≥ C, learn WordPiece
    (or the public / public+dp vocabulary: ``model_config`` holds the public checkpoint's place)."""
    from dpbert.stages.vocabulary import dp_vocabulary

    result = dp_vocabulary(beam_pipeline, tuples.uri, vocabulary.uri, section_from_json(VocabConfig, vocab_config),
                           section_from_json(PrivacyConfig, privacy_config),
                           tuple_words=get_property(tuples, schema.TUPLE_WORDS),
                           checkpoint_dir=section_from_json(ModelConfig, model_config).init_dir,
                           ledger_target=ledger_target)  # the dataset ledger (dpbert.ledger)
    set_properties(vocabulary, to_write(schema.DP_VOCABULARY, {**result.properties, "code_version": code_version}))
