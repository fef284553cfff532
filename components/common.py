"""Helpers shared by the component adapters: artifact properties and the pipeline root.

Values go to and come from ML Metadata through the one codec of the artifact contract,
``dpbert.schema`` (``property_value`` / ``decode_property``). Configuration sections arrive as
JSON parameters and are rebuilt and validated by ``dpbert.config.section_from_json``.
"""
from __future__ import annotations

import posixpath
from typing import Any, Dict

from dpbert import schema


def set_properties(artifact, values: Dict[str, Any]):
    """Store values as custom properties (``schema.property_value``; None values are skipped),
    each privacy number with its exact string next to it (``schema.exact_companions``: ML
    Metadata rounds doubles to 6 decimals)."""
    setters = {"int": artifact.set_int_custom_property, "float": artifact.set_float_custom_property,
               "string": artifact.set_string_custom_property}
    for key, value in values.items():
        encoded = schema.property_value(value)
        if encoded is not None:
            setters[encoded[0]](key, encoded[1])
    for key, text in schema.exact_companions(values).items():
        artifact.set_string_custom_property(key, text)


def get_property(artifact, key: str, default=None):
    """Read a custom property back, whatever its stored type (``schema.decode_property``; also
    the struct values Kubeflow V2 / Vertex AI rebuild an input artifact's properties as); a
    privacy number exactly (``schema.exact_properties``)."""
    value = schema.exact_properties(artifact.mlmd_artifact).get(key)
    return default if value is None else value


def pipeline_root_of(output_uri: str) -> str:
    """The pipeline root of an output artifact: TFX writes it to
    ``<pipeline_root>/<node id>/<output key>/<execution id>``."""
    return posixpath.dirname(posixpath.dirname(posixpath.dirname(output_uri)))
