"""PrivacyAuditor: the white-box one-run audit of the configured DP-SGD training (optional).

Adapter over ``dpbert.stages.audit.run_audit``: the configured training re-run through the
trainer's own loop (``build_training``: the configured unit, sampler, trainable set and plan) on
the embedded PUBLIC corpus, tokenized with the run's DP vocabulary, with m gradient canaries
enrolled as extra units of the run's sampler; records the ε lower bound, its power and its
positive control (public rows: the same run's sums before the noise) next to the accountant's ε,
and fails the run (after recording) when the lower bound exceeds it.
"""
from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component

from components.artifacts import AuditReport, DPVocabulary, PrivacyReport
from components.common import get_property, set_properties
from dpbert import schema
from dpbert.properties import to_write


@component
def PrivacyAuditor(
    vocabulary: InputArtifact[DPVocabulary],
    privacy_report: InputArtifact[PrivacyReport],
    report: OutputArtifact[AuditReport],
    model_config: Parameter[str],
    training_config: Parameter[str],
    privacy_config: Parameter[str],
    membership_config: Parameter[str],
    public_corpus_config: Parameter[str],
    audit_config: Parameter[str],
    code_version: Parameter[str],
):
    """White-box audit ε lower bound vs the accountant's ε of the gradient release."""
    from dpbert import config as cfg
    from dpbert.stages.audit import run_audit

    config = cfg.Config(
        model=cfg.section_from_json(cfg.ModelConfig, model_config),
        training=cfg.section_from_json(cfg.TrainingConfig, training_config),
        privacy=cfg.section_from_json(cfg.PrivacyConfig, privacy_config),
        membership=cfg.section_from_json(cfg.MembershipConfig, membership_config),
        corpus=cfg.section_from_json(cfg.CorpusConfig, public_corpus_config),
        audit=cfg.section_from_json(cfg.AuditConfig, audit_config))
    result = run_audit(vocabulary.uri, report.uri, config,
                       epsilon_train_ledger=get_property(privacy_report, schema.EPSILON_TRAIN))
    set_properties(report, to_write(schema.AUDIT_REPORT, {**result.properties, "code_version": code_version}))
    result.raise_failure()
