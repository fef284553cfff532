"""Normalize a compiled Vertex spec so a golden copy survives what must not matter.

Replaced by placeholders: the TFX/SDK version (``sdkVersion``, the ``tfx_*`` labels), the image
reference (wherever it appears, e.g. in ``--sdk_container_image=``), ISO timestamps, and the
value of every ``code_version`` parameter (a hash of the component's sources: it changes with
every code edit, which is its purpose, and is not what the golden file checks).
"""
from __future__ import annotations

import copy
import re
from typing import Any, Optional

CODE_VERSION = "<CODE_VERSION>"
IMAGE = "<IMAGE>"
VERSION = "<VERSION>"
TIMESTAMP = "<TIMESTAMP>"

_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?")


def _is_code_version(name: str) -> bool:
    return name == "code_version" or name.endswith("_code_version")


def _strings(value: Any, image: Optional[str]):
    if isinstance(value, dict):
        return {k: _strings(v, image) for k, v in value.items()}
    if isinstance(value, list):
        return [_strings(v, image) for v in value]
    if isinstance(value, str):
        if image:
            value = value.replace(image, IMAGE)
        return _TIMESTAMP.sub(TIMESTAMP, value)
    return value


def _code_versions(dag: dict):
    for task in dag.get("tasks", {}).values():
        for name, param in task.get("inputs", {}).get("parameters", {}).items():
            if not _is_code_version(name):
                continue
            runtime = param.get("runtimeValue", {})
            if "constantValue" in runtime:
                runtime["constantValue"] = {"stringValue": CODE_VERSION}
            if "constant" in runtime:
                runtime["constant"] = CODE_VERSION


def normalize(spec: dict, image: Optional[str] = None) -> dict:
    spec = copy.deepcopy(spec)
    ps = spec.get("pipelineSpec", spec)
    if "sdkVersion" in ps:
        ps["sdkVersion"] = re.sub(r"\d+(\.\d+)+\S*", VERSION, ps["sdkVersion"])
    for key in list(spec.get("labels", {})):
        if key in ("tfx_version", "tfx_py_version"):
            spec["labels"][key] = VERSION
    _code_versions(ps.get("root", {}).get("dag", {}))
    for component in ps.get("components", {}).values():
        _code_versions(component.get("dag", {}))
    return _strings(spec, image)
