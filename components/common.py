"""Helpers shared by the component adapters: artifact properties and the pipeline root.

Values go to and come from ML Metadata through the one codec of the artifact contract,
``dpbert.schema`` (``property_value`` / ``decode_property``). Configuration sections arrive as
JSON parameters and are rebuilt and validated by ``dpbert.config.section_from_json``.
"""
from __future__ import annotations

from typing import Any, Dict

from dpbert import schema
from dpbert.privacy.numbers import double_at_least


def set_properties(artifact, values: Dict[str, Any]):
    """Store values as custom properties (``schema.property_value``; None values are skipped),
    each privacy number with its exact string next to it (``schema.exact_companions``: ML
    Metadata rounds doubles to 6 decimals), and the double of each ε and δ rounded up to those
    6 decimals (``schema.rounds_up``): δ_V = 1e-9 reads back 1e-06 from the double, never 0."""
    setters = {"int": artifact.set_int_custom_property, "float": artifact.set_float_custom_property,
               "string": artifact.set_string_custom_property}
    for key, value in values.items():
        encoded = schema.property_value(value)
        if encoded is None:
            continue
        kind, stored = encoded
        if kind == "float" and schema.rounds_up(key):
            stored = double_at_least(stored)
        setters[kind](key, stored)
    for key, text in schema.exact_companions(values).items():
        artifact.set_string_custom_property(key, text)


def get_property(artifact, key: str, default=None):
    """Read a custom property back, whatever its stored type (``schema.decode_property``; also
    the struct values Kubeflow V2 / Vertex AI rebuild an input artifact's properties as); a
    privacy number exactly (``schema.exact_properties``)."""
    value = schema.exact_properties(artifact.mlmd_artifact).get(key)
    return default if value is None else value


def pipeline_root_of(received: str, component: str = "") -> str:
    """The pipeline root a component RECEIVES, as its ``pipeline_root`` parameter: TFX gives an
    executor no pipeline root (its context has a tmp dir and a unique id only, and a function
    component not even that), and an output URI's layout differs by launcher (TFX's
    ``ROOT/<node>/<key>/<execution>``, Vertex AI's ``ROOT/<project>/<job>/<task>_<id>/<key>``,
    the rehearsal's ``ROOT/<task>/<key>``). ValueError naming the parameter when it is empty."""
    root = str(received or "").strip()
    if not root:
        raise ValueError(f"{component or 'the component'}: parameter pipeline_root is empty; the DAG passes the "
                         f"pipeline root it was built with (pipeline/pipeline.py, kubeflow/runner.py)")
    return root.rstrip("/") or root
