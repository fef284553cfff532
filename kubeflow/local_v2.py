"""Run a compiled Vertex AI spec's tasks here, the way Vertex AI runs them: a rehearsal.

For each task (in dependency order) this builds the ``ExecutorInput`` Vertex AI would send —
input parameters from the task's constants, input artifacts from the upstream tasks'
``executor_output.json``, output artifacts with fresh URIs (not pre-created, as on Cloud
Storage) — substitutes it for ``{{$}}`` in the executor's container args and runs the
executor's container command (``python -m tfx.orchestration.kubeflow.v2.container.
kubeflow_v2_run_executor ...``) in a fresh process, from a directory outside the source tree.
What differs from Vertex AI: the artifact URIs are local paths instead of ``gs://``; for the
embedded synthetic corpus (public data) so is the dataset ledger's location (``ROOT/.ledgers``:
no credentials needed, no real ledger touched), while a real dataset's rehearsal charges the
ledger the spec names, since its releases come from the same patients; the process runs in this
environment instead of the image, and no ML Metadata/caching is involved.

A trainer task that carries a custom job (``training.workers`` > 1, ``kubeflow.custom_job``) runs
it here too: ``DPBERT_CUSTOM_JOB_CLIENT=local`` makes its step start the job's replicas as local
processes, each with the ``CLUSTER_SPEC`` and ``TF_CONFIG`` Vertex AI gives it (workerpool0 is
the ``chief``), instead of submitting it.

    python -m kubeflow.local_v2 pipeline.json /tmp/rehearsal [--tasks CorpusIngest]
    dpbert report --pipeline-root /tmp/rehearsal    # or dpbert dashboard --pipeline-root ...

The rehearsal's folder is a pipeline root as Vertex AI's is (``dpbert.pipeline_root`` reads both).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

from kubeflow.spec_check import executors, load_spec, pipeline_spec

INVOCATION_PLACEHOLDER = "{{$}}"
#: The components' dataset-ledger parameter (``dpbert.ledger.LedgerTarget`` JSON).
LEDGER_PARAMETER = "ledger_target"


def local_ledger_target(text: str, root_dir: str) -> str:
    """The ledger target with its location under the rehearsal's folder (``ROOT/.ledgers``) when
    its dataset is the public synthetic corpus; a real dataset's target unchanged (its budget
    belongs to the dataset: a rehearsal's DP releases are charged where every other run's are)."""
    from dpbert.ledger.identity import SYNTHETIC_PREFIX
    from dpbert.ledger.target import LedgerTarget

    target = LedgerTarget.from_json(text)
    if target is None or not target.dataset_id.startswith(SYNTHETIC_PREFIX):
        return text
    return dataclasses.replace(target, location=os.path.join(os.path.abspath(root_dir), ".ledgers")).to_json()


def task_order(spec: dict) -> List[str]:
    """Task names of the root DAG in dependency order (ties by name)."""
    tasks = pipeline_spec(spec)["root"]["dag"]["tasks"]
    done: List[str] = []
    pending = dict(tasks)
    while pending:
        ready = sorted(name for name, task in pending.items()
                       if all(dep in done for dep in task.get("dependentTasks", [])))
        if not ready:
            raise ValueError(f"dependency cycle or unknown dependency among {sorted(pending)}")
        for name in ready:
            done.append(name)
            del pending[name]
    return done


def executor_input(spec: dict, task_name: str, root_dir: str,
                   upstream: Dict[str, Dict[str, dict]]) -> dict:
    """The ExecutorInput (as JSON dict) Vertex AI would give ``task_name``.

    ``upstream``: task name -> its executor output artifacts (output key -> RuntimeArtifact dict).
    """
    ps = pipeline_spec(spec)
    task = ps["root"]["dag"]["tasks"][task_name]
    component = ps["components"][task["componentRef"]["name"]]
    inputs: Dict[str, dict] = {"parameters": {}, "parameterValues": {}, "artifacts": {}}
    for name, param in task.get("inputs", {}).get("parameters", {}).items():
        runtime = param.get("runtimeValue", {})
        if "constantValue" in runtime:      # schema 2.0.0 (pipeline_spec Value)
            value = runtime["constantValue"]
            if name == LEDGER_PARAMETER and "stringValue" in value:
                value = {"stringValue": local_ledger_target(value["stringValue"], root_dir)}
            inputs["parameters"][name] = value
        elif "constant" in runtime:         # schema 2.1.0 (protobuf Value)
            value = runtime["constant"]
            inputs["parameterValues"][name] = local_ledger_target(value, root_dir) \
                if name == LEDGER_PARAMETER and isinstance(value, str) else value
        else:
            raise NotImplementedError(f"{task_name}.{name}: only constant parameters are rehearsed, got {param}")
    for name, art in task.get("inputs", {}).get("artifacts", {}).items():
        source = art.get("taskOutputArtifact")
        if not source:
            raise NotImplementedError(f"{task_name}.{name}: only task outputs are rehearsed, got {art}")
        produced = upstream.get(source["producerTask"], {}).get(source["outputArtifactKey"])
        if produced is None:
            raise ValueError(f"{task_name}.{name} needs {source['producerTask']}.{source['outputArtifactKey']}, "
                             f"which has not run")
        runtime_artifact = dict(produced)
        runtime_artifact["type"] = component["inputDefinitions"]["artifacts"][name]["artifactType"]
        inputs["artifacts"][name] = {"artifacts": [runtime_artifact]}
    task_dir = os.path.join(os.path.abspath(root_dir), task_name)
    outputs: Dict[str, dict] = {"artifacts": {}, "outputFile": os.path.join(task_dir, "executor_output.json")}
    for name, art in component.get("outputDefinitions", {}).get("artifacts", {}).items():
        outputs["artifacts"][name] = {"artifacts": [{
            "name": f"local/{task_name}/{name}",
            "type": art["artifactType"],
            "uri": os.path.join(task_dir, name),
        }]}
    return {"inputs": {k: v for k, v in inputs.items() if v}, "outputs": outputs}


def container_command(spec: dict, task_name: str, invocation: dict) -> List[str]:
    ps = pipeline_spec(spec)
    label = ps["components"][ps["root"]["dag"]["tasks"][task_name]["componentRef"]["name"]]["executorLabel"]
    container = executors(spec)[label]["container"]
    command = list(container.get("command", []))
    args = []
    for arg in container.get("args", []):
        if arg == INVOCATION_PLACEHOLDER:
            arg = json.dumps(invocation)
        elif "{{$" in arg:
            raise NotImplementedError(f"{task_name}: placeholder {arg!r} is not rehearsed")
        args.append(arg)
    if command[:1] == ["python"]:
        command[0] = sys.executable
    return command + args


def _run_in_process(command: List[str]) -> None:
    """``python -m kubeflow_v2_run_executor ARGS`` without a new interpreter (faster, less faithful:
    modules already imported here stay imported)."""
    from tfx.orchestration.kubeflow.v2.container import kubeflow_v2_run_executor as entrypoint

    module = command[command.index("-m") + 1]
    if module != entrypoint.__name__:
        raise NotImplementedError(f"in-process rehearsal runs {entrypoint.__name__} only, not {module}")
    entrypoint.main(entrypoint._parse_flags(command[command.index("-m") + 2:]))  # pylint: disable=protected-access


def run_task(spec: dict, task_name: str, root_dir: str, upstream: Dict[str, Dict[str, dict]],
             env: Optional[dict] = None, timeout: float = 3600, in_process: bool = False) -> Dict[str, dict]:
    """Run one task; returns its output artifacts (key -> RuntimeArtifact dict with uri, metadata)."""
    invocation = executor_input(spec, task_name, root_dir, upstream)
    os.makedirs(os.path.dirname(invocation["outputs"]["outputFile"]), exist_ok=True)
    command = container_command(spec, task_name, invocation)
    from kubeflow.custom_job import CLIENT_ENV

    if in_process:
        previous = os.environ.get(CLIENT_ENV)
        os.environ[CLIENT_ENV] = "local"
        try:
            _run_in_process(command)
        finally:
            if previous is None:
                os.environ.pop(CLIENT_ENV, None)
            else:
                os.environ[CLIENT_ENV] = previous
    else:
        workdir = os.path.join(os.path.abspath(root_dir), ".cwd")
        os.makedirs(workdir, exist_ok=True)
        run_env = dict(os.environ if env is None else env)
        run_env.setdefault("TF_USE_LEGACY_KERAS", "1")
        run_env[CLIENT_ENV] = "local"  # a custom job's replicas run here (the rehearsal)
        result = subprocess.run(command, cwd=workdir, env=run_env, capture_output=True, text=True,
                                timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"task {task_name} failed (exit {result.returncode}):\n{result.stderr[-6000:]}")
    with open(invocation["outputs"]["outputFile"], encoding="utf-8") as handle:
        executor_output = json.load(handle)
    return {key: value["artifacts"][0] for key, value in executor_output.get("artifacts", {}).items()}


def run_spec_locally(spec: dict, root_dir: str, tasks: Optional[Sequence[str]] = None,
                     env: Optional[dict] = None, in_process: bool = False) -> Dict[str, Dict[str, dict]]:
    """Run ``tasks`` (default: all) in dependency order; a task's upstream tasks must be among
    them. Returns task -> output artifacts."""
    order = task_order(spec)
    wanted = order if tasks is None else [t for t in order if t in set(tasks)]
    unknown = set(tasks or ()) - set(order)
    if unknown:
        raise ValueError(f"no task {sorted(unknown)} in the spec (tasks: {', '.join(order)})")
    outputs: Dict[str, Dict[str, dict]] = {}
    for name in wanted:
        outputs[name] = run_task(spec, name, root_dir, outputs, env=env, in_process=in_process)
    return outputs


def _artifact_type(spec: dict, task_name: str, key: str) -> str:
    """The artifact's type name (``components.PretrainedModel``) from its output definition."""
    ps = pipeline_spec(spec)
    component = ps["components"][ps["root"]["dag"]["tasks"][task_name]["componentRef"]["name"]]
    schema_text = component["outputDefinitions"]["artifacts"][key]["artifactType"].get("instanceSchema", "")
    return next((line.split(":", 1)[1].strip() for line in schema_text.splitlines() if line.startswith("title:")),
                "")


def run_info(spec: dict, outputs: Dict[str, Dict[str, dict]], name: str = "rehearsal"):
    """A ``dpbert.metadata.RunInfo`` of a rehearsal's outputs (``dpbert.pipeline_root``: numbers
    as Vertex AI records them), so ``dpbert.report`` reads it as it reads a local run's ML Metadata
    (``--report``); the types from the spec. Every rehearsed task is COMPLETE; no times."""
    from dpbert.pipeline_root import run_from_outputs

    return run_from_outputs(outputs, name, pipeline_spec(spec)["pipelineInfo"]["name"],
                            type_of=lambda task, key: _artifact_type(spec, task, key))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubeflow.local_v2", description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="compiled pipeline (.json from `dpbert compile`)")
    parser.add_argument("root_dir", help="local directory for the artifacts")
    parser.add_argument("--tasks", nargs="*", help="only these tasks (their upstream tasks must be included)")
    parser.add_argument("--report", action="store_true",
                        help="print dpbert report's text of the rehearsed run instead of the task outputs")
    args = parser.parse_args(argv)
    spec = load_spec(args.spec)
    outputs = run_spec_locally(spec, args.root_dir, args.tasks)
    if args.report:
        from dpbert.report import build_report, format_report

        print(format_report(build_report(run_info(spec, outputs))))
        return 0
    print(json.dumps(outputs, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
