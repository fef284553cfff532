"""Canaries: CanaryGen (before training) and CanaryExposure (after), with the one-run audit.

Adapters over ``dpbert.stages.canary``. CanaryGen writes the canaries and a secret insertion seed
to a PRIVATE artifact (never printed, logged or served); the trainers insert them. CanaryExposure
computes exposure per group and the one-run audit's ε lower bound, and fails the run (after
recording the evidence) if that lower bound exceeds the accountant's ε.
"""
from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component

from components.artifacts import (CanaryList, CanaryReport, DPVocabulary, PretrainedModel, PrivacyReport,
                                  WordTuples)
from components.common import get_property, set_properties
from dpbert import schema
from dpbert.config import CanaryConfig, TrainingConfig, section_from_json
from dpbert.properties import to_write


@component
def CanaryGen(
    tuples: InputArtifact[WordTuples],
    vocabulary: InputArtifact[DPVocabulary],
    canaries: OutputArtifact[CanaryList],
    canary_config: Parameter[str],
    training_config: Parameter[str],
    code_version: Parameter[str],
    public_rows: Parameter[int] = 0,
):
    from dpbert.stages.canary import generate_canaries

    # The occurrence groups come from the PUBLIC number of training rows (``public_rows``:
    # ``dpbert.stages.canary.canary_rows``; 0 = training.dataset_size), never the tuples' exact count.
    rows = public_rows or section_from_json(TrainingConfig, training_config).dataset_size
    result = generate_canaries(vocabulary.uri, canaries.uri, section_from_json(CanaryConfig, canary_config),
                               public_rows=rows)
    set_properties(canaries, to_write(schema.CANARY_LIST, {**result.properties, "code_version": code_version}))


@component
def CanaryExposure(
    canaries: InputArtifact[CanaryList],
    model: InputArtifact[PretrainedModel],
    privacy_report: InputArtifact[PrivacyReport],
    report: OutputArtifact[CanaryReport],
    audit_beta: Parameter[float],
    code_version: Parameter[str],
    baseline_model: InputArtifact[PretrainedModel] = None,
):
    """Exposure (DP vs non-DP) per occurrence group; audit ε lower bound vs the accountant's ε_T."""
    from dpbert.stages.canary import exposure_report

    result = exposure_report(
        canaries.uri, model.uri, report.uri, audit_beta=audit_beta,
        max_seq_length=int(get_property(model, schema.MAX_SEQ_LENGTH)),
        epsilon_train=get_property(privacy_report, schema.EPSILON_TRAIN),
        delta_train=get_property(privacy_report, schema.DELTA_TRAIN),
        baseline_model_dir=None if baseline_model is None else baseline_model.uri)
    set_properties(report, to_write(schema.CANARY_REPORT, {**result.properties, "code_version": code_version}))
    result.raise_failure()
