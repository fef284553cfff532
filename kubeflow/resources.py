"""Per-component machine resources on Vertex AI Pipelines.

TFX 1.16's Kubeflow V2 compiler copies a component's ``platform_config`` into its container
spec when it is a KFP ``PipelineDeploymentConfig.PipelineContainerSpec.ResourceSpec``
(``tfx/orchestration/kubeflow/v2/step_builder.py``, ``_build_container_spec``): set it with
``component.with_platform_config(ResourceSpec(...))``. Vertex AI then picks a machine type that
fits ``cpu_limit`` (vCPUs), ``memory_limit`` (GB) and ``accelerator`` (type + count, e.g.
``NVIDIA_TESLA_T4`` x 4). One step is one machine: multi-worker and TPU training need a Vertex
AI CustomJob (see docs/running-on-vertex.md).

On the command line: ``--resources COMPONENT_ID:cpu=8,memory=32,accelerator=NVIDIA_L4,accelerator_count=1``
(repeatable).
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple, Union

from dpbert.config import ConfigError

_KEYS = ("cpu", "memory", "cpu_request", "memory_request", "accelerator", "accelerator_count")


def resource_spec(cpu: Optional[float] = None, memory: Optional[float] = None, accelerator: Optional[str] = None,
                  accelerator_count: Optional[int] = None, cpu_request: Optional[float] = None,
                  memory_request: Optional[float] = None):
    """A KFP ``ResourceSpec``: ``cpu`` vCPUs, ``memory`` GB, ``accelerator`` type x count."""
    from kfp.pipeline_spec import pipeline_spec_pb2

    spec_cls = pipeline_spec_pb2.PipelineDeploymentConfig.PipelineContainerSpec.ResourceSpec
    spec = spec_cls()
    for field, value in (("cpu_limit", cpu), ("memory_limit", memory), ("cpu_request", cpu_request),
                         ("memory_request", memory_request)):
        if value is not None:
            if float(value) <= 0:
                raise ConfigError(f"--resources {field.replace('_limit', '')} must be > 0, got {value!r}")
            setattr(spec, field, float(value))
    if accelerator_count is not None and not accelerator:
        raise ConfigError("--resources accelerator_count needs accelerator=TYPE (e.g. NVIDIA_TESLA_T4)")
    if accelerator:
        count = 1 if accelerator_count is None else int(accelerator_count)
        if count < 1:
            raise ConfigError(f"--resources accelerator_count must be >= 1, got {accelerator_count!r}")
        spec.accelerator.type = str(accelerator)
        spec.accelerator.count = count
    return spec


def parse_resources(text: str) -> Tuple[str, object]:
    """``COMPONENT_ID:key=value,...`` -> (component id, ResourceSpec)."""
    if ":" not in text:
        raise ConfigError(f"--resources {text!r} must look like COMPONENT_ID:cpu=8,memory=32,"
                          f"accelerator=NVIDIA_TESLA_T4,accelerator_count=1")
    component_id, body = text.split(":", 1)
    values: Dict[str, str] = {}
    for item in filter(None, (part.strip() for part in body.split(","))):
        if "=" not in item:
            raise ConfigError(f"--resources {text!r}: {item!r} must be key=value")
        key, value = (s.strip() for s in item.split("=", 1))
        if key not in _KEYS:
            raise ConfigError(f"--resources {text!r}: unknown key {key!r} (known: {', '.join(_KEYS)})")
        values[key] = value
    try:
        numbers = {k: (int(v) if k == "accelerator_count" else float(v))
                   for k, v in values.items() if k != "accelerator"}
    except ValueError as err:
        raise ConfigError(f"--resources {text!r}: {err}") from None
    return component_id.strip(), resource_spec(accelerator=values.get("accelerator"), **numbers)


ResourcesArg = Mapping[str, Union[object, Mapping[str, object]]]


def apply_resources(pipeline, resources: ResourcesArg) -> None:
    """``with_platform_config`` on each named component (a ResourceSpec or a dict of
    ``resource_spec`` keywords). Unknown component ids are an error listing the known ones."""
    by_id = {component.id: component for component in pipeline.components}
    for component_id, spec in resources.items():
        if component_id not in by_id:
            raise ConfigError(f"--resources: no component {component_id!r} in the DAG "
                              f"(components: {', '.join(sorted(by_id))})")
        if isinstance(spec, Mapping):
            spec = resource_spec(**spec)
        by_id[component_id].with_platform_config(spec)
