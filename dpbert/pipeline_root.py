"""Read runs from a pipeline root: the ``executor_output.json`` every step writes there.

On Vertex AI there is no ML Metadata store to open: each step writes, under the pipeline root,
``executor_output.json`` with its output artifacts' URIs and custom properties as Vertex AI records
them (a struct: every number a JSON double, ints included). This module turns those files into the
``dpbert.metadata.RunInfo`` that ``dpbert report`` and the dashboard read (``PipelineRootRunReader``:
the ``dpbert.metadata.RunReader`` of a root; typed properties equal to the store's), so a ``gs://`` root, a
``ram://`` one and the local rehearsal's (``kubeflow/local_v2.py``) are inspected like a local store.
Every file is read through ``dpbert.storage``.

Layout: Vertex AI writes ``ROOT/<project number>/<job id>/<task>_<task id>/executor_output.json``,
the rehearsal ``ROOT/<task>/executor_output.json``. A run is the folder holding the task folders
(the job's); its id is that folder's path under ROOT (ROOT's own name when ROOT is the job's folder).
A job id ``<pipeline>-YYYYMMDDhhmmss`` (what Vertex AI names a job by default) gives the pipeline
name and the creation time; newest run first.

What a pipeline root cannot tell, so the RunInfo leaves it out: times of the steps (durations 0),
input events (no DAG edges), steps that failed or are running (a step writes its executor output
only when it succeeds: every step found is COMPLETE), and run-level properties (interrupted, ε
charged by a stopped run). Nor the artifact types: ``OUTPUTS`` names them by (component, output key),
as ``pipeline/pipeline.py`` builds the DAG (tests/test_report_pipeline_root.py checks the table
against the compiled spec).
"""
from __future__ import annotations

import calendar
import dataclasses
import math
import posixpath
import re
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from dpbert import schema, storage
from dpbert.metadata import ArtifactInfo, ComponentRun, RunInfo, select_run

EXECUTOR_OUTPUT_FILE = "executor_output.json"
#: Task folders are searched this deep under the root given (job folder, project folder, root).
MAX_DEPTH = 3
#: (component id, output key, artifact type) of every step of the DAG, in its order.
OUTPUTS: Tuple[Tuple[str, str, str], ...] = (
    ("CorpusIngest", "tuples", schema.WORD_TUPLES),
    ("TextPrivatizer", "privatized_tuples", schema.WORD_TUPLES),
    ("DPVocabularyGen", "vocabulary", schema.DP_VOCABULARY),
    ("CanaryGen", "canaries", schema.CANARY_LIST),
    ("MLMPretrainer", "model", schema.PRETRAINED_MODEL),
    ("PrivacyAccountant", "report", schema.PRIVACY_REPORT),
    ("MLMPretrainerNonPrivate", "model", schema.PRETRAINED_MODEL),
    ("CanaryExposure", "report", schema.CANARY_REPORT),
    ("PrivacyAuditor", "report", schema.AUDIT_REPORT),
    ("MembershipInference", "report", schema.MEMBERSHIP_REPORT),
    ("NerEvaluator", "report", schema.NER_REPORT),
)
_TASK_ID = re.compile(r"_-?[0-9]+$")            # Vertex AI's "<task>_<task id>" folder
_JOB_TIME = re.compile(r"^(.+)-([0-9]{14})$")   # "<pipeline>-YYYYMMDDhhmmss"


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_ORDER = {_norm(c): i for i, (c, _, _) in enumerate(OUTPUTS)}


def task_name(folder: str) -> str:
    """The task of a task folder: Vertex AI's ``MLMPretrainer_-123`` → ``MLMPretrainer``."""
    return _TASK_ID.sub("", folder)


def output_type(task: str, key: str) -> str:
    """The MLMD type name (``components.<Class>``) of ``task``'s output ``key``; by the key alone
    when the task is not in ``OUTPUTS`` and one type has that key; "" when unknown."""
    found = {t for c, k, t in OUTPUTS if k == key and _norm(c) == _norm(task)}
    found = found or {t for _, k, t in OUTPUTS if k == key}
    return schema.type_name(found.pop()) if len(found) == 1 else ""


def _value(key: str, value: Any) -> Any:
    """One metadata value back as written: an integral double is the int it was (Vertex AI records
    every number as a double), except a privacy number, which stays a float."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        value = float(value)
        integral = math.isfinite(value) and value.is_integer() and not schema.is_privacy_number(key)
        return int(value) if integral else value
    if isinstance(value, str):
        return schema.decode_string_property(value)
    if isinstance(value, dict) and set(value) == {schema.STRUCT_VALUE_KEY}:
        return _value(key, value[schema.STRUCT_VALUE_KEY])
    return schema.decode(value)


def artifact_properties(metadata: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """An executor output artifact's ``metadata`` as ``dpbert.metadata`` gives custom properties:
    decoded, each privacy number exact from its ``<name>__exact`` string (``schema.merge_exact``)."""
    props = {k: _value(k, v) for k, v in (metadata or {}).items() if v is not None}
    return schema.merge_exact(props)


def run_from_outputs(outputs: Mapping[str, Mapping[str, Mapping[str, Any]]], run_id: str,
                     pipeline: str, type_of: Callable[[str, str], str] = output_type,
                     created_ms: int = 0) -> RunInfo:
    """A RunInfo of ``outputs`` (task → output key → RuntimeArtifact dict: ``uri``, ``metadata``),
    each task a COMPLETE component in the given order; ``type_of(task, key)``: the type name."""
    components = []
    for number, (task, artifacts) in enumerate(outputs.items(), 1):
        infos = [ArtifactInfo(id=number * 100 + i, type=type_of(task, key), uri=str(art.get("uri", "")), name=key,
                              properties=artifact_properties(art.get("metadata")))
                 for i, (key, art) in enumerate(sorted(artifacts.items()))]
        components.append(ComponentRun(task, number, "COMPLETE", created_ms, created_ms, [], infos))
    return RunInfo(run_id, pipeline, created_ms, components)


def executor_artifacts(executor_output: Any, uri: str) -> Dict[str, Dict[str, Any]]:
    """Output key → its (single) RuntimeArtifact dict of one parsed ``executor_output.json``."""
    artifacts = executor_output.get("artifacts", {}) if isinstance(executor_output, dict) else None
    if not isinstance(artifacts, dict):
        raise ValueError(f"{uri}: not an executor output (no \"artifacts\" object)")
    out = {}
    for key, value in artifacts.items():
        listed = value.get("artifacts") if isinstance(value, dict) else None
        if not listed or not isinstance(listed[0], dict):
            raise ValueError(f"{uri}: artifacts.{key} holds no artifact")
        out[key] = listed[0]
    return out


def executor_output_files(root: str) -> List[str]:
    """The ``executor_output.json`` of every task folder at the shallowest depth (1 to
    ``MAX_DEPTH``) under ``root`` that has one: a job's folder, a project's, or the pipeline root
    (each depth is one listing of the whole prefix on ``gs://``, so the search stops there)."""
    backend = storage.storage_for(root)
    for depth in range(1, MAX_DEPTH + 1):
        found = backend.glob(storage.join(root, *["*"] * depth, EXECUTOR_OUTPUT_FILE))
        if found:
            return sorted(found)
    return []


def _run_identity(root: str, job_dir: str) -> Tuple[str, str, int]:
    """(run id, pipeline, created ms) of the run in ``job_dir``."""
    base, job = root.rstrip("/"), job_dir.rstrip("/")
    run_id = job[len(base):].lstrip("/") if job.startswith(base) and job != base else (posixpath.basename(job) or job)
    name = posixpath.basename(job) or job
    match = _JOB_TIME.match(name)
    if not match:
        return run_id, name, 0
    try:
        created = calendar.timegm(time.strptime(match.group(2), "%Y%m%d%H%M%S")) * 1000
    except ValueError:
        return run_id, name, 0
    return run_id, match.group(1), created


def list_runs(root: str) -> List[RunInfo]:
    """The runs under pipeline root ``root``, newest first; FileNotFoundError naming ``root`` when
    it holds no executor output."""
    files = executor_output_files(root)
    if not files:
        raise FileNotFoundError(f"{root}: no {EXECUTOR_OUTPUT_FILE} in a task folder up to {MAX_DEPTH} "
                                f"levels below it (not a pipeline root, or no step has finished)")
    jobs: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for uri in files:
        task_dir = posixpath.dirname(uri)
        task = task_name(posixpath.basename(task_dir))
        jobs.setdefault(posixpath.dirname(task_dir), {})[task] = executor_artifacts(storage.read_json(uri), uri)
    runs = []
    for job_dir, outputs in jobs.items():
        ordered = dict(sorted(outputs.items(), key=lambda item: (_ORDER.get(_norm(item[0]), len(_ORDER)), item[0])))
        run_id, pipeline, created = _run_identity(root, job_dir)
        runs.append(run_from_outputs(ordered, run_id, pipeline, created_ms=created))
    runs.sort(key=lambda r: (r.created_ms, r.run_id), reverse=True)
    return runs


def get_run(root: str, run_id: Optional[str] = None) -> RunInfo:
    """The run ``run_id`` under ``root`` (default: the newest); LookupError naming the ones there."""
    return select_run(list_runs(root), run_id, root)


@dataclasses.dataclass(frozen=True)
class PipelineRootRunReader:
    """The runs under pipeline root ``source`` (``dpbert.metadata.RunReader``; re-read at each call)."""

    source: str

    def list_runs(self) -> List[RunInfo]:
        return list_runs(self.source)

    def get_run(self, run_id: Optional[str] = None) -> RunInfo:
        return get_run(self.source, run_id)
