"""What a compiled Vertex / KFP v2 spec needs from the container image, and whether it has it.

The Kubeflow V2 container entrypoint (``tfx.orchestration.kubeflow.v2.container.
kubeflow_v2_run_executor``) imports, inside the image:

* the executor class of each task (``--executor_class_path`` in the executor's container args),
* the artifact class of each input/output, by its schema title: TFX's first-party types through
  ``compiler_utils.TITLE_TO_CLASS_PATH`` (``tfx.Examples`` ...), every other title *as an import
  path* (``components.WordTuples`` -> ``import components; components.WordTuples``). A custom
  type whose title does not import fails the step at run time, after the cluster was paid for.

``check_spec_importable`` does those imports here, at compile time, with the same
``import_utils.import_class_by_path`` the entrypoint uses.
"""
from __future__ import annotations

import json
from typing import Dict, Iterator, List, Set

import yaml


def pipeline_spec(spec: dict) -> dict:
    """The PipelineSpec of a compiled PipelineJob JSON (or the spec itself)."""
    return spec.get("pipelineSpec", spec)


def load_spec(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    return json.loads(text) if path.endswith(".json") else yaml.safe_load(text)


def _artifact_specs(spec: dict) -> Iterator[dict]:
    ps = pipeline_spec(spec)
    for component in ps.get("components", {}).values():
        for section in ("inputDefinitions", "outputDefinitions"):
            for artifact in component.get(section, {}).get("artifacts", {}).values():
                yield artifact.get("artifactType", {})


def schema_title(artifact_type: dict) -> str:
    if "schemaTitle" in artifact_type:
        return artifact_type["schemaTitle"]
    return (yaml.safe_load(artifact_type.get("instanceSchema", "")) or {}).get("title", "tfx.Artifact")


def artifact_titles(spec: dict) -> Set[str]:
    """Every artifact schema title in the spec."""
    return {schema_title(t) for t in _artifact_specs(spec)}


def artifact_class_paths(spec: dict) -> Dict[str, str]:
    """title -> the import path the V2 entrypoint resolves it to."""
    from tfx.orchestration.kubeflow.v2 import compiler_utils

    return {title: compiler_utils.TITLE_TO_CLASS_PATH.get(title, title) for title in artifact_titles(spec)}


def custom_artifact_titles(spec: dict) -> Set[str]:
    """Titles that are not TFX first-party types: they are imported by their title."""
    return {title for title, path in artifact_class_paths(spec).items() if title == path}


def executors(spec: dict) -> Dict[str, dict]:
    return pipeline_spec(spec).get("deploymentSpec", {}).get("executors", {})


def executor_class_paths(spec: dict) -> Dict[str, str]:
    """executor label -> ``--executor_class_path`` value (container executors only)."""
    result = {}
    for label, executor in executors(spec).items():
        args: List[str] = executor.get("container", {}).get("args", [])
        if "--executor_class_path" in args:
            result[label] = args[args.index("--executor_class_path") + 1]
    return result


def entrypoint_modules(spec: dict) -> Set[str]:
    """Modules run with ``python -m`` by the executors' container commands."""
    modules = set()
    for executor in executors(spec).values():
        command = executor.get("container", {}).get("command", [])
        if "-m" in command:
            modules.add(command[command.index("-m") + 1])
    return modules


def python_references(spec: dict) -> Set[str]:
    """Every dotted Python path the image must resolve for this spec."""
    return (set(executor_class_paths(spec).values()) | set(artifact_class_paths(spec).values())
            | entrypoint_modules(spec))


def top_level_packages(spec: dict) -> Set[str]:
    return {path.split(".")[0] for path in python_references(spec)}


def check_spec_importable(spec: dict) -> None:
    """Import every executor and artifact class the spec names, as the V2 entrypoint would.

    Raises ``ImportError`` listing every path that does not resolve, and ``TypeError`` if an
    artifact title resolves to something that is not a TFX Artifact class with that TYPE_NAME.
    """
    import importlib

    from tfx.types.artifact import Artifact
    from tfx.utils import import_utils

    problems = []
    for label, path in sorted(executor_class_paths(spec).items()):
        try:
            import_utils.import_class_by_path(path)
        except Exception as err:  # noqa: BLE001 - report every failure at once
            problems.append(f"executor {label}: {path} ({type(err).__name__}: {err})")
    for module in sorted(entrypoint_modules(spec)):
        try:
            importlib.import_module(module)
        except Exception as err:  # noqa: BLE001
            problems.append(f"entrypoint module {module} ({type(err).__name__}: {err})")
    for title, path in sorted(artifact_class_paths(spec).items()):
        try:
            cls = import_utils.import_class_by_path(path)
        except Exception as err:  # noqa: BLE001
            problems.append(f"artifact type {title}: {path} ({type(err).__name__}: {err})")
            continue
        if not (isinstance(cls, type) and issubclass(cls, Artifact)):
            raise TypeError(f"artifact type {title} resolves to {cls!r}, not a tfx Artifact class")
        if title == path and cls.TYPE_NAME != title:
            raise TypeError(f"artifact type {title} resolves to {cls.__module__}.{cls.__name__} whose "
                            f"TYPE_NAME is {cls.TYPE_NAME!r}")
    if problems:
        raise ImportError("the compiled spec names Python paths that do not import here (they would "
                          "fail inside the image too):\n  " + "\n  ".join(problems))
