"""TextPrivatizer: dχ-privatize the words of every tuple before anything downstream reads them.

Adapter over ``dpbert.stages.privatize`` (why the embedding table must be public, and what the
guarantee covers, is documented there). Placed right after CorpusIngest (``local_privacy.enabled``).
"""
from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component

from components.artifacts import WordTuples
from components.common import get_property, set_properties
from dpbert import schema
from dpbert.config import LocalPrivacyConfig, section_from_json
from dpbert.properties import to_write


@component
def TextPrivatizer(
    tuples: InputArtifact[WordTuples],
    privatized_tuples: OutputArtifact[WordTuples],
    local_privacy_config: Parameter[str],
    code_version: Parameter[str],
    num_shards: Parameter[int] = 4,
):
    """dχ-privatize the tuples' words with a public embedding table (``local_privacy`` section)."""
    from dpbert.stages.privatize import COPIED_PROPERTIES, privatize

    config = section_from_json(LocalPrivacyConfig, local_privacy_config)
    inputs = {key: get_property(tuples, key) for key in COPIED_PROPERTIES}
    result = privatize(tuples.uri, privatized_tuples.uri, config, inputs, num_shards=num_shards)
    set_properties(privatized_tuples, to_write(schema.WORD_TUPLES, {**result.properties, "code_version": code_version}))
    result.raise_failure()
