"""Helpers shared by the component adapters (no privacy logic here)."""
from __future__ import annotations

import json
import logging
from typing import Any, Dict

from dpbert.config import Config, _build

log = logging.getLogger("dpbert")


def section_from_json(cls, text: str):
    """Rebuild a config section (dataclass) from the JSON the pipeline passed as a parameter."""
    return _build(cls, json.loads(text), cls.__name__)


def config_from_json(text: str) -> Config:
    return _build(Config, json.loads(text), "").validate()


def set_properties(artifact, values: Dict[str, Any]):
    """Store values as custom properties (ints, floats, strings; dicts/lists as JSON strings)."""
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            artifact.set_int_custom_property(key, int(value))
        elif isinstance(value, int):
            artifact.set_int_custom_property(key, value)
        elif isinstance(value, float):
            # MLMD stores doubles; infinity (non-private runs) is kept as the string "inf".
            if value == float("inf"):
                artifact.set_string_custom_property(key, "inf")
            else:
                artifact.set_float_custom_property(key, value)
        elif isinstance(value, (dict, list)):
            artifact.set_string_custom_property(key, json.dumps(value, sort_keys=True))
        else:
            artifact.set_string_custom_property(key, str(value))


def get_property(artifact, key: str, default=None):
    """Read a custom property back, whatever its stored type."""
    props = artifact.mlmd_artifact.custom_properties
    if key not in props:
        return default
    value = props[key]
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return float("inf") if value.string_value == "inf" else value.string_value
    if kind == "double_value":
        return value.double_value
    if kind == "int_value":
        return value.int_value
    if kind == "struct_value":
        # Kubeflow V2 / Vertex AI: TFX's container entrypoint rebuilds an input artifact's custom
        # properties from its metadata as JSON values (integers arrive as floats).
        decoded = artifact.get_custom_property(key)
        return float("inf") if decoded == "inf" else decoded
    return default
