"""MembershipInference: membership-inference attacks on the pre-trained model(s).

Adapter over ``dpbert.stages.membership``: members are the tuples of the patients the trainer
trained on, non-members those of the patients it held out; the split is recomputed from the
``holdout_patient_fraction`` / ``holdout_key_id`` recorded on the model artifact(s) and the secret
key in the WordTuples artifact.
"""
from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component

from components.artifacts import MembershipReport, PretrainedModel, WordTuples
from components.common import get_property, set_properties
from dpbert import schema
from dpbert.config import MembershipConfig, section_from_json
from dpbert.properties import to_write


def _trained_model(artifact):
    from dpbert.stages.membership import HOLDOUT_KEY_ID, TrainedModel

    return TrainedModel(uri=artifact.uri, holdout_patient_fraction=get_property(artifact, schema.HOLDOUT_FRACTION),
                        holdout_key_id=get_property(artifact, HOLDOUT_KEY_ID),
                        non_private=bool(get_property(artifact, schema.NON_PRIVATE)))


@component
def MembershipInference(
    tuples: InputArtifact[WordTuples],
    model: InputArtifact[PretrainedModel],
    report: OutputArtifact[MembershipReport],
    membership_config: Parameter[str],
    code_version: Parameter[str],
    baseline_model: InputArtifact[PretrainedModel] = None,
):
    """S-BBA, A-BBA, P-BBA, S-AWBA, S-GWBA on the DP model (and the non-private baseline)."""
    from dpbert.stages.membership import membership_inference

    result = membership_inference(tuples.uri, report.uri, _trained_model(model),
                                  section_from_json(MembershipConfig, membership_config),
                                  baseline=None if baseline_model is None else _trained_model(baseline_model))
    set_properties(report, to_write(schema.MEMBERSHIP_REPORT, {**result.properties, "code_version": code_version}))
