"""Run a compiled Vertex AI spec's tasks here, the way Vertex AI runs them: a rehearsal.

For each task (in dependency order) this builds the ``ExecutorInput`` Vertex AI would send —
input parameters from the task's constants, input artifacts from the upstream tasks'
``executor_output.json``, output artifacts with fresh URIs (not pre-created, as on Cloud
Storage) — substitutes it for ``{{$}}`` in the executor's container args and runs the
executor's container command (``python -m tfx.orchestration.kubeflow.v2.container.
kubeflow_v2_run_executor ...``) in a fresh process, from a directory outside the source tree.
What differs from Vertex AI: the artifact URIs are local paths instead of ``gs://``, and the
pipeline root the trainer steps receive (``pipeline_root``: their state lives under it) is ROOT,
so nothing is written outside ROOT; for the embedded synthetic corpus (public data) the dataset
ledger is ``ROOT/.ledgers`` (``$DPBERT_SYNTHETIC_LEDGER`` for the tasks, and the target's id is
the generator's, ``dpbert.ledger.identity``: no credentials needed, no real ledger read or
touched, whatever ``corpus.dataset_id`` / ``privacy.ledger`` the spec was compiled with), while a
real dataset's rehearsal charges the ledger the spec names, since its releases come from the same
patients; the process runs in this environment instead of the image, and no ML Metadata/caching
is involved. ``ROOT/_trainer_state`` and ``ROOT/.ledgers`` are made 0700 (operator-only).

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
import hashlib
import json
import os
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

from kubeflow.spec_check import executors, load_spec, pipeline_spec

INVOCATION_PLACEHOLDER = "{{$}}"
#: The components' dataset-ledger parameter (``dpbert.accounting.target.LedgerTarget`` JSON).
LEDGER_PARAMETER = "ledger_target"
#: The trainer components' pipeline-root parameter (``kubeflow.runner.attach_pipeline_root``).
PIPELINE_ROOT_PARAMETER = "pipeline_root"
#: CorpusIngest's corpus section (``dpbert.config.CorpusConfig`` JSON): ``path`` null = synthetic.
CORPUS_PARAMETER = "corpus_config"
#: The synthetic corpus's ledger folder under ROOT; with the trainer state, made 0700.
LEDGER_FOLDER = ".ledgers"
PRIVATE_FOLDERS = (LEDGER_FOLDER, "_trainer_state")


def local_ledger_target(text: str, root_dir: str, synthetic_id: Optional[str] = None) -> str:
    """The ledger target with its location under the rehearsal's folder (``ROOT/.ledgers``) when
    its dataset is the public synthetic corpus — ``synthetic_id`` (the spec's corpus is synthetic:
    a target compiled with a real id is given the generator's) or a ``synthetic-`` id; a real
    dataset's target unchanged (its budget belongs to the dataset: a rehearsal's DP releases are
    charged where every other run's are)."""
    from dpbert.accounting.target import LedgerTarget
    from dpbert.ledger.identity import is_synthetic_id

    target = LedgerTarget.from_json(text)
    if target is None or not (synthetic_id or is_synthetic_id(target.dataset_id)):
        return text
    return dataclasses.replace(target, dataset_id=synthetic_id or target.dataset_id,
                               location=os.path.join(os.path.abspath(root_dir), LEDGER_FOLDER)).to_json()


def spec_synthetic_id(spec: dict) -> Optional[str]:
    """The synthetic corpus's dataset id when the spec's corpus is the embedded one, else None."""
    from dpbert.config import CorpusConfig, section_from_json
    from dpbert.ledger.identity import synthetic_dataset_id

    for task in pipeline_spec(spec)["root"]["dag"]["tasks"].values():
        param = task.get("inputs", {}).get("parameters", {}).get(CORPUS_PARAMETER, {}).get("runtimeValue", {})
        text = param.get("constantValue", {}).get("stringValue", param.get("constant"))
        if isinstance(text, str):
            corpus = section_from_json(CorpusConfig, text)
            return synthetic_dataset_id(corpus) if corpus.path is None else None
    return None


def _local_parameter(name: str, value, root_dir: str, synthetic_id: Optional[str]):
    """A constant parameter as the rehearsal passes it (``value``: a str, or a schema-2.0.0
    ``{"stringValue": ...}``): the pipeline root and a synthetic corpus's ledger are ROOT's."""
    text = value.get("stringValue") if isinstance(value, dict) else value
    if not isinstance(text, str) or name not in (LEDGER_PARAMETER, PIPELINE_ROOT_PARAMETER):
        return value
    local = os.path.abspath(root_dir) if name == PIPELINE_ROOT_PARAMETER else \
        local_ledger_target(text, root_dir, synthetic_id)
    return {"stringValue": local} if isinstance(value, dict) else local


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


#: ``ROOT/<project number>/<job id>/`` of the ``vertex`` layout (what Vertex AI writes under ROOT).
VERTEX_JOB = ("123456789012", "rehearsal-20260101000000")


def task_folder(root_dir: str, task_name: str, layout: str = "rehearsal") -> str:
    """``ROOT/<task>`` (the rehearsal's layout) or, ``layout="vertex"``, Vertex AI's
    ``ROOT/<project number>/<job id>/<task>_<task id>`` (``dpbert.pipeline_root`` reads both)."""
    root = os.path.abspath(root_dir)
    if layout == "rehearsal":
        return os.path.join(root, task_name)
    if layout == "vertex":
        task_id = int(hashlib.sha256(task_name.encode("utf-8")).hexdigest()[:15], 16)
        return os.path.join(root, *VERTEX_JOB, f"{task_name}_{task_id}")
    raise ValueError(f"layout must be rehearsal or vertex, got {layout!r}")


def executor_input(spec: dict, task_name: str, root_dir: str,
                   upstream: Dict[str, Dict[str, dict]], layout: str = "rehearsal") -> dict:
    """The ExecutorInput (as JSON dict) Vertex AI would give ``task_name``.

    ``upstream``: task name -> its executor output artifacts (output key -> RuntimeArtifact dict).
    """
    ps = pipeline_spec(spec)
    task = ps["root"]["dag"]["tasks"][task_name]
    component = ps["components"][task["componentRef"]["name"]]
    inputs: Dict[str, dict] = {"parameters": {}, "parameterValues": {}, "artifacts": {}}
    synthetic_id = spec_synthetic_id(spec)
    for name, param in task.get("inputs", {}).get("parameters", {}).items():
        runtime = param.get("runtimeValue", {})
        if "constantValue" in runtime:      # schema 2.0.0 (pipeline_spec Value)
            inputs["parameters"][name] = _local_parameter(name, runtime["constantValue"], root_dir, synthetic_id)
        elif "constant" in runtime:         # schema 2.1.0 (protobuf Value)
            inputs["parameterValues"][name] = _local_parameter(name, runtime["constant"], root_dir, synthetic_id)
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
    task_dir = task_folder(root_dir, task_name, layout)
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
             env: Optional[dict] = None, timeout: float = 3600, in_process: bool = False,
             layout: str = "rehearsal") -> Dict[str, dict]:
    """Run one task; returns its output artifacts (key -> RuntimeArtifact dict with uri, metadata)."""
    invocation = executor_input(spec, task_name, root_dir, upstream, layout)
    os.makedirs(os.path.dirname(invocation["outputs"]["outputFile"]), exist_ok=True)
    command = container_command(spec, task_name, invocation)
    task_env = rehearsal_env(root_dir)
    if in_process:
        previous = {name: os.environ.get(name) for name in task_env}
        os.environ.update(task_env)
        try:
            _run_in_process(command)
        finally:
            for name, value in previous.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    else:
        workdir = os.path.join(os.path.abspath(root_dir), ".cwd")
        os.makedirs(workdir, exist_ok=True)
        run_env = dict(os.environ if env is None else env)
        run_env.setdefault("TF_USE_LEGACY_KERAS", "1")
        run_env.update(task_env)
        result = subprocess.run(command, cwd=workdir, env=run_env, capture_output=True, text=True,
                                timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"task {task_name} failed (exit {result.returncode}):\n{result.stderr[-6000:]}")
    with open(invocation["outputs"]["outputFile"], encoding="utf-8") as handle:
        executor_output = json.load(handle)
    return {key: value["artifacts"][0] for key, value in executor_output.get("artifacts", {}).items()}


def rehearsal_env(root_dir: str) -> Dict[str, str]:
    """What every task's environment gets: a custom job's replicas run here, and the synthetic
    corpus's ledger is ``ROOT/.ledgers`` (``dpbert.ledger.identity.synthetic_location``)."""
    from dpbert.ledger.identity import SYNTHETIC_LEDGER_ENV
    from kubeflow.custom_job import CLIENT_ENV

    return {CLIENT_ENV: "local", SYNTHETIC_LEDGER_ENV: os.path.join(os.path.abspath(root_dir), LEDGER_FOLDER)}


def make_private_folders(root_dir: str) -> None:
    """``ROOT/.ledgers`` and ``ROOT/_trainer_state`` mode 0700 before any task writes there."""
    for name in PRIVATE_FOLDERS:
        folder = os.path.join(os.path.abspath(root_dir), name)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)


def run_spec_locally(spec: dict, root_dir: str, tasks: Optional[Sequence[str]] = None,
                     env: Optional[dict] = None, in_process: bool = False,
                     layout: str = "rehearsal") -> Dict[str, Dict[str, dict]]:
    """Run ``tasks`` (default: all) in dependency order; a task's upstream tasks must be among
    them; ``layout``: :func:`task_folder`'s. Returns task -> output artifacts."""
    order = task_order(spec)
    wanted = order if tasks is None else [t for t in order if t in set(tasks)]
    unknown = set(tasks or ()) - set(order)
    if unknown:
        raise ValueError(f"no task {sorted(unknown)} in the spec (tasks: {', '.join(order)})")
    make_private_folders(root_dir)
    outputs: Dict[str, Dict[str, dict]] = {}
    for name in wanted:
        outputs[name] = run_task(spec, name, root_dir, outputs, env=env, in_process=in_process, layout=layout)
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
    parser.add_argument("--layout", choices=("rehearsal", "vertex"), default="rehearsal",
                        help="task folders ROOT/<task> (default) or Vertex AI's ROOT/<project>/<job>/<task>_<id>")
    parser.add_argument("--report", action="store_true",
                        help="print dpbert report's text of the rehearsed run instead of the task outputs")
    args = parser.parse_args(argv)
    spec = load_spec(args.spec)
    outputs = run_spec_locally(spec, args.root_dir, args.tasks, layout=args.layout)
    if args.report:
        from dpbert.report import build_report, format_report

        print(format_report(build_report(run_info(spec, outputs))))
        return 0
    print(json.dumps(outputs, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
