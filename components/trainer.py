"""MLMPretrainer: DP-SGD (or, explicitly, non-private) BERT masked-LM pre-training.

Adapter over ``dpbert.stages.pretrain``, which holds out patients, inserts the canaries, plans
the run (one ``TrainingPlan``), trains in a stable state directory under the pipeline root (so a
re-run resumes and the ledger charges every step ever executed) and builds the DP event from
the steps actually taken, which the accountant recomputes ε from.
"""
from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component

from components.artifacts import CanaryList, DPVocabulary, PretrainedModel, WordTuples
from components.common import get_property, pipeline_root_of, set_properties
from dpbert import schema
from dpbert.config import MembershipConfig, ModelConfig, PrivacyConfig, TrainingConfig, section_from_json


@component
def MLMPretrainer(
    tuples: InputArtifact[WordTuples],
    vocabulary: InputArtifact[DPVocabulary],
    model: OutputArtifact[PretrainedModel],
    model_config: Parameter[str],
    training_config: Parameter[str],
    privacy_config: Parameter[str],
    membership_config: Parameter[str],
    code_version: Parameter[str],
    non_private: Parameter[int] = 0,
    canaries: InputArtifact[CanaryList] = None,
    custom_job: Parameter[str] = "",
    ledger_target: Parameter[str] = "",
):
    """Tokenize the tuples with the DP vocabulary and pre-train; one tuple = one example.

    ``membership_config``: the patient split only (``membership.holdout_*``), so the evaluation's
    own settings do not re-train the model. ``non_private``: 1 for the non-private baseline.
    ``ledger_target``: the dataset ledger (``dpbert.ledger.LedgerTarget`` JSON; empty: none).
    ``training.workers`` W > 1: W worker processes of the same stage (``dpbert.trainer_workers``),
    started here on loopback, or, with ``custom_job`` (the CustomJob template a compiled Vertex AI
    spec carries, ``kubeflow.custom_job``), as the replicas of a Vertex AI custom job this step
    submits and waits for. Either way the chief's result becomes this artifact's.
    """
    tc = section_from_json(TrainingConfig, training_config)
    if tc.workers > 1 or custom_job:
        from dpbert.trainer_workers import invocation, run_local_workers

        inv = invocation(tuples.uri, vocabulary.uri, model.uri, model_config, training_config, privacy_config,
                         membership_config, pipeline_root=pipeline_root_of(model.uri),
                         canaries_dir=None if canaries is None else canaries.uri, non_private=bool(non_private),
                         vocab_event=get_property(vocabulary, schema.DP_EVENT), ledger_target=ledger_target)
        if custom_job:  # the compiled Vertex AI step: the replicas of a custom job it submits and polls
            from kubeflow.custom_job import run_custom_job

            result = run_custom_job(custom_job, inv)
        else:
            result = run_local_workers(inv)
        set_properties(model, {**result["properties"], "workers": result["workers"], "code_version": code_version})
        return
    from dpbert.stages.pretrain import pretrain

    result = pretrain(
        tuples.uri, vocabulary.uri, model.uri,
        model_config=section_from_json(ModelConfig, model_config),
        training_config=tc,
        privacy_config=section_from_json(PrivacyConfig, privacy_config),
        membership_config=section_from_json(MembershipConfig, membership_config),
        pipeline_root=pipeline_root_of(model.uri),
        canaries_dir=None if canaries is None else canaries.uri,
        non_private=bool(non_private),
        # The vocabulary's DP record: the trainer refuses any step the budget does not cover.
        vocab_event=get_property(vocabulary, schema.DP_EVENT),
        # The dataset's privacy ledger: the run's charge is reserved before the data is read.
        ledger_target=ledger_target)
    set_properties(model, {**result.properties, "workers": 1, "code_version": code_version})
