"""PrivacyAccountant: the Evaluator at the end of the DAG that writes the run's ε ledger.

Adapter over ``dpbert.stages.accountant``: every ε is recomputed from the DP events recorded on
the vocabulary and model artifacts; the dataset's budget gate (``dpbert.accounting.gate``) over
its ledger decides whether the run is within budget, and a refusal fails the run after the report
is written.
"""
from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component

from components.artifacts import DPVocabulary, PretrainedModel, PrivacyReport
from components.common import get_property, set_properties
from dpbert import schema
from dpbert.config import PrivacyConfig, section_from_json
from dpbert.properties import to_write


@component
def PrivacyAccountant(
    vocabulary: InputArtifact[DPVocabulary],
    model: InputArtifact[PretrainedModel],
    report: OutputArtifact[PrivacyReport],
    privacy_config: Parameter[str],
    training_delta: Parameter[float],
    code_version: Parameter[str],
    ledger_target: Parameter[str] = "",
):
    """Compose ε_V and ε_T (basic, RDP, PLD) at δ = δ_V + δ_T; write JSON + a statement."""
    from dpbert.stages.accountant import account

    model_properties = {key: get_property(model, key)
                        for key in ("sampling_mode", "sampling_rate", "noise_multiplier", schema.STEPS_PLANNED)}
    result = account(report.uri, get_property(vocabulary, schema.DP_EVENT), get_property(model, schema.DP_EVENTS),
                     training_delta, section_from_json(PrivacyConfig, privacy_config), model_properties,
                     ledger_target=ledger_target)
    set_properties(report, to_write(schema.PRIVACY_REPORT, {**result.properties, "code_version": code_version}))
    result.raise_failure()
