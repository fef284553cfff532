"""NerEvaluator: entity-extraction F1 after fine-tuning (Hoory et al.'s Table 2) and held-out
MLM loss, for the DP model, the non-private model and the model without domain pre-training.

Adapter over ``dpbert.stages.ner``.
"""
from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component

from components.artifacts import NerReport, PretrainedModel
from components.common import set_properties
from dpbert.config import NerConfig, section_from_json


@component
def NerEvaluator(
    model: InputArtifact[PretrainedModel],
    report: OutputArtifact[NerReport],
    ner_config: Parameter[str],
    tuple_words: Parameter[int],
    code_version: Parameter[str],
    baseline_model: InputArtifact[PretrainedModel] = None,
):
    from dpbert.stages.ner import ner_evaluation

    result = ner_evaluation(model.uri, report.uri, section_from_json(NerConfig, ner_config), tuple_words,
                            baseline_model_dir=None if baseline_model is None else baseline_model.uri)
    set_properties(report, {**result.properties, "code_version": code_version})
