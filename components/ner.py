"""NerEvaluator: the utility table — held-out MLM loss and accuracy, NER F1 over seeds and the
gain kept — for the random, public-start, DP and non-private models.

Adapter over ``dpbert.stages.ner``.
"""
from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component

from components.artifacts import NerReport, PretrainedModel
from components.common import set_properties
from dpbert import schema
from dpbert.config import ModelConfig, NerConfig, TrainingConfig, section_from_json
from dpbert.properties import to_write


@component
def NerEvaluator(
    model: InputArtifact[PretrainedModel],
    report: OutputArtifact[NerReport],
    ner_config: Parameter[str],
    tuple_words: Parameter[int],
    code_version: Parameter[str],
    model_config: Parameter[str],
    training_config: Parameter[str],
    baseline_model: InputArtifact[PretrainedModel] = None,
):
    from dpbert.stages.ner import ner_evaluation

    result = ner_evaluation(model.uri, report.uri, section_from_json(NerConfig, ner_config), tuple_words,
                            baseline_model_dir=None if baseline_model is None else baseline_model.uri,
                            model_config=section_from_json(ModelConfig, model_config),
                            training_config=section_from_json(TrainingConfig, training_config))
    set_properties(report, to_write(schema.NER_REPORT, {**result.properties, "code_version": code_version}))
