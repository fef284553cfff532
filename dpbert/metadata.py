"""Read-only access to a run's ML Metadata store (no TFX imports): runs, components, artifacts.

This is what `dpbert report` and the dashboard read. It never opens artifact files marked
private (``private`` custom property = 1: tuples of raw text, canary secrets); it returns only
custom properties (decoded by ``dpbert.schema.exact_properties``, the one reader of the
artifact contract: ε, δ and q exactly, from the strings written next to ML Metadata's rounded
doubles; a run written before has ``<name>_approx`` = True next to each rounded one) and URIs;
``ArtifactInfo.typed`` gives them as their kind's dataclass (``dpbert.properties``). ``RunReader``
is the one interface of a run's readers: ``MetadataRunReader`` here, ``PipelineRootRunReader`` in
``dpbert.pipeline_root``.

The writers here are ``mark_charged`` (a run that stopped before its accountant — interrupted,
failed, or refused over the budget — gets the ε its training chain already spent) and ``mark_interrupted`` (``dpbert run`` after SIGINT/SIGTERM): TFX leaves the
execution it was running in RUNNING forever, so the run is marked cancelled — the running
executions CANCELED and, on the pipeline-run context, ``INTERRUPTED_PROPERTY`` (an interrupt
between two components leaves no running execution) with what was running and the trainer's step.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, List, Optional, Protocol

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from dpbert import properties as typed_properties
from dpbert import schema

#: The run status of an interrupted run (``RunInfo.status``), and the name shown for MLMD's
#: CANCELED execution state: one spelling in every table, status and sentence.
CANCELLED = "CANCELLED"
STATE_NAMES = {0: "UNKNOWN", 1: "NEW", 2: "RUNNING", 3: "COMPLETE", 4: "FAILED", 5: "CACHED", 6: CANCELLED}
#: Custom properties of a pipeline-run context written by ``mark_interrupted``.
INTERRUPTED_PROPERTY = "dpbert_interrupted"          # 1
INTERRUPTED_COMPONENT = "dpbert_interrupted_component"
INTERRUPTED_STEP = "dpbert_interrupted_step"          # the trainer's step (steps started), if training
INTERRUPTED_CHECKPOINT_STEP = "dpbert_interrupted_checkpoint_step"  # where a re-run resumes, if a checkpoint
#: Written by ``mark_charged`` on a run that stopped before its accountant (the ε its training chain
#: spent), with ``BUDGET_REFUSED_PROPERTY`` when the trainer refused a step the budget does not cover.
BUDGET_REFUSED_PROPERTY = "dpbert_budget_refused"    # 1
EPSILON_CHARGED = "dpbert_epsilon_charged"            # ε (PLD) of everything the run's chain charged
DELTA_CHARGED = "dpbert_delta_charged"
STEPS_CHARGED = "dpbert_steps_charged"                # DP-SGD steps the chain executed (write-ahead ledger)
#: The execution (component) parameters a reader is given (``ComponentRun.properties``): public
#: configuration only. ``ledger_target``: the dataset's ledger (``dpbert.accounting.target``).
EXECUTION_PROPERTIES = ("ledger_target",)
EPSILON_BUDGET = "dpbert_epsilon_budget"


def metadata_path_for(output_dir: Optional[str] = None, metadata: Optional[str] = None) -> str:
    path = metadata or os.path.join(output_dir or "demo_output", "metadata.sqlite")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no ML Metadata store at {path} (run `dpbert run --output DIR` first)")
    return path


def open_store(path: str) -> metadata_store.MetadataStore:
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = path
    config.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
    return metadata_store.MetadataStore(config)


@dataclasses.dataclass
class ArtifactInfo:
    id: int
    type: str
    uri: str
    name: str  # output key, e.g. "tuples"
    properties: Dict[str, Any]

    @property
    def private(self) -> bool:
        return bool(self.properties.get(schema.PRIVATE))

    @property
    def typed(self) -> typed_properties.ArtifactProperties:
        """The properties as their kind's frozen dataclass (``dpbert.properties.read_properties``);
        a malformed value is a ``PropertyError`` naming this artifact and the key."""
        return typed_properties.read_properties(
            self.type, self.properties, f"{schema.short_type_name(self.type)} artifact {self.id} ({self.uri})")


@dataclasses.dataclass
class ComponentRun:
    node_id: str
    execution_id: int
    state: str
    started_ms: int
    updated_ms: int
    inputs: List[ArtifactInfo]
    outputs: List[ArtifactInfo]
    #: The execution's parameters named in ``EXECUTION_PROPERTIES`` (strings), when recorded.
    properties: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return max(0.0, (self.updated_ms - self.started_ms) / 1000.0)


@dataclasses.dataclass
class RunInfo:
    run_id: str
    pipeline: str
    created_ms: int
    components: List[ComponentRun]
    #: The pipeline-run context's custom properties (``INTERRUPTED_*`` after an interrupt).
    properties: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def interrupted(self) -> bool:
        return bool(self.properties.get(INTERRUPTED_PROPERTY))

    @property
    def status(self) -> str:
        states = {c.state for c in self.components}
        if self.interrupted or CANCELLED in states:
            return CANCELLED
        if not states:
            return "EMPTY"
        if "FAILED" in states:
            return "FAILED"
        if states & {"RUNNING", "NEW"}:
            return "RUNNING"
        return "COMPLETE"

    @property
    def duration_s(self) -> float:
        if not self.components:
            return 0.0
        return max(0.0, (max(c.updated_ms for c in self.components) - self.created_ms) / 1000.0)

    def artifacts(self, type_name: str, key: Optional[str] = None) -> List[ArtifactInfo]:
        return [a for c in self.components for a in c.outputs
                if a.type == type_name and (key is None or a.name == key)]

    def typed(self, short_type: str, where: Optional[Callable[[Any], bool]] = None):
        """The typed properties of the run's first artifact of that type (``where`` them: a
        predicate on the typed object), or None."""
        for artifact in self.artifacts(schema.type_name(short_type)):
            props = artifact.typed
            if where is None or where(props):
                return props
        return None


class RunReader(Protocol):
    """Where runs are read from: an ML Metadata store (``MetadataRunReader``) or a pipeline root's
    executor outputs (``dpbert.pipeline_root.PipelineRootRunReader``). Both give ``RunInfo``
    objects whose artifacts' ``typed`` properties are the same for the same run."""

    #: What is read (a store's path, a pipeline root), for messages.
    source: str

    def list_runs(self) -> List[RunInfo]:
        """Every run, newest first."""

    def get_run(self, run_id: Optional[str] = None) -> RunInfo:
        """The run ``run_id`` (default: the newest); LookupError naming the runs there."""


def _artifact_infos(store, events, wanted_types) -> List[ArtifactInfo]:
    chosen = [e for e in events if e.type in wanted_types]
    if not chosen:
        return []
    artifacts = {a.id: a for a in store.get_artifacts_by_id([e.artifact_id for e in chosen])}
    type_names = {t.id: t.name for t in store.get_artifact_types()}
    out = []
    for e in chosen:
        a = artifacts[e.artifact_id]
        key = e.path.steps[0].key if e.path.steps else ""
        out.append(ArtifactInfo(
            id=a.id, type=type_names.get(a.type_id, a.type), uri=a.uri, name=key,
            properties=schema.exact_properties(a)))
    return out


def list_runs(store) -> List[RunInfo]:
    """Every pipeline run, newest first."""
    runs = []
    for ctx in store.get_contexts_by_type("pipeline_run"):
        executions = store.get_executions_by_context(ctx.id)
        pipeline = ""
        for parent in store.get_parent_contexts_by_context(ctx.id):
            pipeline = parent.name
        components = []
        for ex in sorted(executions, key=lambda e: e.create_time_since_epoch):
            node = ""
            for c in store.get_contexts_by_execution(ex.id):
                if c.type == "node":
                    node = c.name.split(".", 1)[-1]
                    pipeline = pipeline or c.name.split(".", 1)[0]
            events = store.get_events_by_execution_ids([ex.id])
            Event = metadata_store_pb2.Event
            components.append(ComponentRun(
                node_id=node, execution_id=ex.id, state=STATE_NAMES.get(ex.last_known_state, "UNKNOWN"),
                started_ms=ex.create_time_since_epoch, updated_ms=ex.last_update_time_since_epoch,
                inputs=_artifact_infos(store, events, {Event.INPUT}),
                outputs=_artifact_infos(store, events, {Event.OUTPUT, Event.DECLARED_OUTPUT}),
                properties={k: ex.custom_properties[k].string_value for k in EXECUTION_PROPERTIES
                            if k in ex.custom_properties and ex.custom_properties[k].string_value}))
        runs.append(RunInfo(run_id=ctx.name, pipeline=pipeline, created_ms=ctx.create_time_since_epoch,
                            components=components, properties=schema.exact_properties(ctx)))
    runs.sort(key=lambda r: r.created_ms, reverse=True)
    return runs


def select_run(runs: List[RunInfo], run_id: Optional[str], where: str) -> RunInfo:
    """The run ``run_id`` of ``runs`` (newest first; default: the newest), or LookupError saying
    what ``where`` holds (the message names at most ten runs)."""
    if not runs:
        raise LookupError(f"{where} holds no pipeline run")
    if run_id is None:
        return runs[0]
    for run in runs:
        if run.run_id == run_id:
            return run
    raise LookupError(f"no run {run_id!r} in {where} (runs there: {', '.join(r.run_id for r in runs[:10])})")


def get_run(store, run_id: Optional[str] = None) -> RunInfo:
    """The run ``run_id`` of an open store (default: the newest)."""
    return select_run(list_runs(store), run_id, "the ML Metadata store")


@dataclasses.dataclass(frozen=True)
class MetadataRunReader:
    """The runs of the ML Metadata store at ``source`` (opened read-only at each call, so a
    running pipeline's new executions are seen)."""

    source: str

    def list_runs(self) -> List[RunInfo]:
        return list_runs(open_store(self.source))

    def get_run(self, run_id: Optional[str] = None) -> RunInfo:
        return get_run(open_store(self.source), run_id)


def _open_writable(path: str) -> metadata_store.MetadataStore:
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = path
    config.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READWRITE
    return metadata_store.MetadataStore(config)


def _newest_run_since(path: str, since_ms: int):
    """(the store at ``path`` opened writable, the newest pipeline-run context created at or after
    ``since_ms``); (None, None) when there is no store, (store, None) when no run since then."""
    if not os.path.exists(path):
        return None, None
    store = _open_writable(path)
    runs = [c for c in store.get_contexts_by_type("pipeline_run") if c.create_time_since_epoch >= since_ms]
    return store, (max(runs, key=lambda c: (c.create_time_since_epoch, c.id)) if runs else None)


def put_properties(message, values: Dict[str, Any]) -> None:
    """Set ``values`` as custom properties of an MLMD message (artifact, execution or context) by
    the artifact contract (``schema.property_value``), each privacy number with its exact string
    (``schema.exact_companions``): read back exactly by this module's readers."""
    for key, value in values.items():
        encoded = schema.property_value(value)
        if encoded is None:
            continue
        field = {"int": "int_value", "float": "double_value", "string": "string_value"}[encoded[0]]
        setattr(message.custom_properties[key], field, encoded[1])
    for key, text in schema.exact_companions(values).items():
        message.custom_properties[key].string_value = text


def mark_charged(path: str, since_ms: int, charged: Dict[str, Any],
                 refused_budget: Optional[float] = None) -> Optional[str]:
    """Record on the newest pipeline run created at or after ``since_ms`` the ε its training chain
    has already spent (``charged``: ``dpbert.stages.pretrain.chain_charged``: epsilon_charged,
    delta, steps_charged) when the run stopped before the PrivacyAccountant — interrupted, failed,
    or refused by the trainer over ``privacy.epsilon_budget`` (``refused_budget``: the budget). TFX
    publishes no model for a failed trainer, so without this the privacy already spent would appear
    nowhere. Returns the run id (None: no run since ``since_ms`` or no store)."""
    store, ctx = _newest_run_since(path, since_ms)
    if ctx is None:
        return None
    values: Dict[str, Any] = {EPSILON_CHARGED: float(charged["epsilon_charged"]),
                              DELTA_CHARGED: float(charged["delta"]), STEPS_CHARGED: int(charged["steps_charged"])}
    if refused_budget is not None:
        values.update({BUDGET_REFUSED_PROPERTY: 1, EPSILON_BUDGET: float(refused_budget)})
    put_properties(ctx, values)
    store.put_contexts([ctx])
    return ctx.name


def mark_interrupted(path: str, since_ms: int, step: Optional[int] = None,
                     checkpoint_step: Optional[int] = None) -> Optional[Dict[str, Any]]:
    """Mark the newest pipeline run created at or after ``since_ms`` as cancelled: its RUNNING/NEW
    executions become CANCELED and its context gets ``INTERRUPTED_PROPERTY`` = 1, the running
    component (``INTERRUPTED_COMPONENT``), ``step`` (``INTERRUPTED_STEP``) and the trainer's last
    ``checkpoint_step`` (``INTERRUPTED_CHECKPOINT_STEP``: where a re-run resumes) when given.

    Returns ``{"run_id", "component"}`` (component: the node that was running, else None), or None
    when no run was registered since ``since_ms`` (interrupted before the first component) or the
    store does not exist. A re-run is a new pipeline run: TFX's cache never re-uses a CANCELED
    execution, so the interrupted component runs again (the trainer from its checkpoint)."""
    store, ctx = _newest_run_since(path, since_ms)
    if ctx is None:
        return None
    running = [e for e in store.get_executions_by_context(ctx.id)
               if e.last_known_state in (metadata_store_pb2.Execution.RUNNING, metadata_store_pb2.Execution.NEW)]
    component = None
    for ex in running:
        for c in store.get_contexts_by_execution(ex.id):
            if c.type == "node":
                component = c.name.split(".", 1)[-1]
        ex.last_known_state = metadata_store_pb2.Execution.CANCELED
    if running:
        store.put_executions(running)
    ctx.custom_properties[INTERRUPTED_PROPERTY].int_value = 1
    if component:
        ctx.custom_properties[INTERRUPTED_COMPONENT].string_value = component
    if step is not None:
        ctx.custom_properties[INTERRUPTED_STEP].int_value = int(step)
    if checkpoint_step:
        ctx.custom_properties[INTERRUPTED_CHECKPOINT_STEP].int_value = int(checkpoint_step)
    store.put_contexts([ctx])
    return {"run_id": ctx.name, "component": component}
