"""The release boundary: what leaves the trust boundary, and the ε that covers each file.

ONE explicit list (``RELEASED``): the DP vocabulary, the DP model (weights, tokenizer, DP
diagnostics, DP events), the privacy report and, optionally, the white-box and one-run audits.
Everything else a run writes stays with the operator (``private = 1`` artifacts, the trainer's
state directory, any file of a released artifact not in the list).

Contract: ``write_bundle`` copies the released files of one run, through ``dpbert.storage``,
into a bundle whose ``manifest.json`` gives every file's path, size, sha256 and the ε, δ, unit
and adjacency of the run's PrivacyReport that cover it (never a recomputed or planned value);
TensorBoard event files are REWRITTEN (``wall_time = 0``, no run metadata, one file named
``TENSORBOARD_EVENTS_FILE``); on any error nothing is left (a local bundle is renamed into place,
a remote one written object by object with the manifest last). ``PRIVACY_FIELDS`` is what a
released model states (``run_privacy``, ``records_privacy``); ``released_view`` is the same
boundary for the run report. The table of released files and what covers each, and why the
TensorBoard files are rewritten: docs/privacy.md ("The release boundary in detail").
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import shutil
import tempfile
from typing import Any, Dict, Iterator, List, Optional

from dpbert import schema, storage
from dpbert.properties import PrivacyReportProperties

MANIFEST_FILE = "manifest.json"
AUDIT_FILE = "audit/audit.json"
#: The one name of a released TensorBoard event file (no time, host or process id in it).
TENSORBOARD_EVENTS_FILE = "events.out.tfevents.0.dpbert"
VOCAB_DP_EVENT_FILE = schema.VOCAB_DP_EVENT_FILE
#: The vocabulary records that read no private data without noise (a DP histogram, a public vocabulary).
DP_VOCABULARY_MECHANISMS = ("dp_histogram", "public")


@dataclasses.dataclass(frozen=True)
class ReleasedPart:
    artifact_type: str       # short type name, e.g. "DPVocabulary"
    paths: tuple             # files or directories inside the artifact
    covered_by: str          # "epsilon_vocab" | "epsilon_total"
    bundle_dir: str          # where it goes in the bundle
    required: tuple = ()     # of ``paths``: a bundle without them is refused
    optional: bool = False   # the artifact may be absent (an optional component)


#: The one list of what is released.
RELEASED = (
    ReleasedPart(schema.DP_VOCABULARY, ("vocab.txt", "tokenizer.json", "histogram.jsonl", "dp_event.json",
                                        schema.TOKEN_SOURCES_FILE),
                 "epsilon_vocab", "vocabulary", required=("vocab.txt",)),
    ReleasedPart(schema.PRETRAINED_MODEL, (schema.MODEL_DIR, schema.TOKENIZER_DIR, schema.TENSORBOARD_DIR,
                                           schema.DP_EVENTS_FILE, VOCAB_DP_EVENT_FILE), "epsilon_total", "model",
                 required=(schema.MODEL_DIR,)),
    ReleasedPart(schema.PRIVACY_REPORT, ("privacy_report.json", "privacy_statement.txt"), "epsilon_total",
                 "privacy", required=("privacy_report.json",)),
    # The white-box audit (optional component): public rows + the DP vocabulary + public parameters.
    ReleasedPart(schema.AUDIT_REPORT, (schema.WHITEBOX_AUDIT_FILE,), "epsilon_vocab", "audit",
                 required=(schema.WHITEBOX_AUDIT_FILE,), optional=True),
)
#: The CanaryReport properties copied to ``audit/audit.json`` (read even when the report is marked
#: private: it also holds the non-private baseline's exposures, which are never copied).
AUDIT_FIELDS = ("audit", "audit_epsilon_lower_bound", "audit_epsilon_upper_bound", "audit_max_reachable_lower_bound")
#: The keys of the ``audit`` record kept (``dpbert.stages.canary.AUDIT_FIELDS``: tested equal).
AUDIT_RESULT_KEYS = ("epsilon_lower_bound", "r", "v", "m", "k_plus", "k_minus", "beta_total")
#: ``events.ADJACENCY`` for a ledger that does not name its adjacency (Poisson is add/remove).
_POISSON_ADJACENCY = "add_or_remove_one"


class ReleaseError(RuntimeError):
    """The run cannot be released (incomplete, non-private, over budget) or the bundle directory
    cannot be written; the message names the run or the path."""


def _released_artifact(run, short_type: str):
    """The run's artifact of that type that may be released: not private, not non-private."""
    for artifact in run.artifacts(schema.type_name(short_type)):
        if not artifact.private and not artifact.typed.non_private:
            return artifact
    return None


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _recorded_report(report) -> Dict[str, Any]:
    """The accountant's ``privacy_report.json`` of the PrivacyReport artifact ({} when unreadable)."""
    try:
        recorded = schema.loads(storage.read_text(storage.join(report.uri, "privacy_report.json")))
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


#: The manifest's privacy numbers: manifest key -> ledger key.
MANIFEST_NUMBERS = {"epsilon": schema.EPSILON_TOTAL_PLD, "delta": schema.DELTA,
                    "epsilon_vocab": schema.EPSILON_VOCAB, "delta_vocab": schema.DELTA_VOCAB,
                    "epsilon_train": schema.EPSILON_TRAIN}


#: The privacy fields a released model states: the manifest's numbers, unit, adjacency, mechanisms.
PRIVACY_FIELDS = tuple(MANIFEST_NUMBERS) + ("unit", "adjacency", "mechanisms")


def exact_ledger(report) -> PrivacyReportProperties:
    """The ledger's typed properties with its privacy numbers exact: as read (``dpbert.metadata``:
    exact unless in ``approximate``, a run written before ML Metadata held exact strings), else
    from the released ``privacy_report.json`` (full-precision JSON, the accountant's own numbers),
    else the rounded value, still flagged. The manifest must never round δ = 1.0001e-05 to 1e-05
    nor δ_V = 1e-9 to 0."""
    ledger = report.typed
    approximate = [k for k in MANIFEST_NUMBERS.values() if k in ledger.approximate]
    recorded = _recorded_report(report) if approximate else {}
    exact = {key: float(recorded[key]) for key in approximate
             if isinstance(recorded.get(key), (int, float)) and not isinstance(recorded.get(key), bool)}
    return dataclasses.replace(ledger, approximate=ledger.approximate - set(exact), **exact)


def _adjacency(run, report) -> str:
    """The ledger's neighbouring relation: its property, else its ``privacy_report.json``; a ledger
    naming none is add/remove only for Poisson sampling (older runs)."""
    ledger = report.typed
    adjacency = ledger.adjacency
    if adjacency is None:
        adjacency = _recorded_report(report).get("adjacency")
    if adjacency is None and ledger.sampling == "poisson":
        adjacency = _POISSON_ADJACENCY
    if not isinstance(adjacency, str):
        raise ReleaseError(f"run {run.run_id}: its privacy report names no adjacency (neighbouring relation); "
                           "re-run the accountant with this dpbert")
    return adjacency


def mechanisms(vocab_record, train_records) -> List[str]:
    """The ``mechanism`` of each record, the vocabulary's first, each once (``public``: a public
    vocabulary, no private data read)."""
    out: List[str] = []
    for record in ([vocab_record] if vocab_record else []) + list(train_records or []):
        name = record.get("mechanism") if isinstance(record, dict) else None
        if isinstance(name, str) and name not in out:
            out.append(name)
    return out


def _read_record(uri: str):
    """A JSON record file of an artifact (None when missing or not JSON)."""
    try:
        return schema.loads(storage.read_text(uri))
    except (OSError, ValueError):
        return None


def _run_records(run, report):
    """(vocabulary record, training records) of a run: those the accountant composed (its
    ``privacy_report.json``), else the released artifacts' ``dp_event.json`` / ``dp_events.json``."""
    recorded = _recorded_report(report)
    vocab, trains = recorded.get("vocab_event"), recorded.get("train_events")
    if vocab is None:
        artifact = _released_artifact(run, schema.DP_VOCABULARY)
        vocab = None if artifact is None else _read_record(storage.join(artifact.uri, "dp_event.json"))
    if trains is None:
        artifact = _released_artifact(run, schema.PRETRAINED_MODEL)
        trains = None if artifact is None else _read_record(storage.join(artifact.uri, schema.DP_EVENTS_FILE))
    return vocab, trains if isinstance(trains, list) else [trains] if isinstance(trains, dict) else []


def _privacy_fields(run, report, ledger: PrivacyReportProperties, unit: str) -> Dict[str, Any]:
    fields = {name: getattr(ledger, key) for name, key in MANIFEST_NUMBERS.items()}
    fields.update(unit=unit, adjacency=_adjacency(run, report), mechanisms=mechanisms(*_run_records(run, report)))
    approximate = sorted(name for name, key in MANIFEST_NUMBERS.items() if key in ledger.approximate)
    if approximate:  # rounded by ML Metadata and not in privacy_report.json: said, not hidden
        fields["approximate"] = approximate
    return fields


def run_privacy(run) -> Dict[str, Any]:
    """``PRIVACY_FIELDS`` of a run that may be released: the accountant's recorded ledger (exact),
    its adjacency, the mechanisms of its records. ReleaseError as ``write_bundle`` refuses."""
    report, ledger, _, unit = _checked_ledger(run)
    return _privacy_fields(run, report, ledger, unit)


def records_privacy(vocab_record, train_records, training_delta: float) -> Dict[str, Any]:
    """``PRIVACY_FIELDS`` recomputed from a model artifact's own records (``dpbert export MODEL``):
    the ledger the PrivacyAccountant composes (``accountant.ledger`` at δ = δ_V + δ_T,
    ``ledger_delta``), so a model exported by its path states what its run's manifest states."""
    from dpbert.accounting.accountant import ledger as compose
    from dpbert.privacy.composition import ledger_delta

    ledger = compose(vocab_record, train_records, ledger_delta(vocab_record, training_delta))
    fields = {name: ledger.get(key) for name, key in MANIFEST_NUMBERS.items()}
    fields.update(unit=ledger["unit"], adjacency=ledger["adjacency"], mechanisms=mechanisms(vocab_record, train_records))
    return fields


def audit_record(run) -> Optional[Dict[str, Any]]:
    """What ``audit/audit.json`` holds: ``AUDIT_FIELDS`` of the run's CanaryReport (private or not),
    the ``audit`` record cut to ``AUDIT_RESULT_KEYS``; numbers only (anything else becomes None);
    None when the run has no audit."""
    def numeric(value):
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    for artifact in run.artifacts(schema.type_name(schema.CANARY_REPORT)):
        props = artifact.typed
        if props.audit is None and props.audit_epsilon_lower_bound is None:
            continue
        out = {k: numeric(getattr(props, k)) for k in AUDIT_FIELDS if k != "audit"}
        audit = props.audit
        out["audit"] = {k: numeric(audit.get(k)) for k in AUDIT_RESULT_KEYS if k in audit} \
            if isinstance(audit, dict) else None
        return out
    return None


# ------------------------------------------------------------------ reading artifacts (any URI)
def _name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def _refuse_link(uri: str):
    """A symbolic link in a released path could point anywhere (a private artifact's file): it is
    refused, never followed. Only a local disk has links (gs:// and ram:// objects cannot be
    one), so this is the one check of the walk that looks at the local filesystem directly."""
    if storage.is_remote(uri):
        return
    path = uri[len("file://"):] if uri.startswith("file://") else uri
    if os.path.islink(path):
        raise ReleaseError(f"{uri} is a symbolic link: refused")


def _walk(store, root: str, rel: str) -> Iterator[tuple]:
    """``os.walk`` through the storage layer, top-down and sorted: (folder relative to ``root``,
    sub-folder names, file names). The caller checks a folder's entries before the walk goes into
    them. The layer's own bookkeeping files (``.dpbert-storage.lock``) are not listed; a listed
    name that does not exist is skipped (TensorFlow's ``ram://`` lists ``a/1`` with a ``7`` taken
    from its sibling ``a/17``)."""
    folder = storage.join(root, rel) if rel else root
    dirs, names = [], []
    for name in store.listdir(folder):
        uri = storage.join(folder, name)
        if store.isdir(uri):
            dirs.append(name)
        elif store.exists(uri):
            names.append(name)
    yield rel, dirs, names
    for name in dirs:
        yield from _walk(store, root, f"{rel}/{name}" if rel else name)


# ------------------------------------------------------------------------- TensorBoard events
def _is_event_file(name: str) -> bool:
    """TensorBoard reads every file whose name contains ``tfevents`` as an event file."""
    return "tfevents" in name


def _record_reader(data: bytes, name: str):
    """TensorBoard's TF-free ``PyRecordReader_New`` over bytes read through ``dpbert.storage``. Its
    constructor opens a path with TensorBoard's own gfile (no gs:// without TensorFlow, and not our
    storage layer), so it is skipped and the reader gets an in-memory file; the framing and both
    checksums stay TensorBoard's."""
    import io

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

    reader = PyRecordReader_New.__new__(PyRecordReader_New)
    reader.filename, reader.start_offset, reader.compression_type, reader.status = name, 0, None, None
    reader.curr_event, reader.file_handle, reader._buffer, reader._buffer_pos = None, io.BytesIO(data), b"", 0
    return reader


def read_event_file(uri: str) -> list:
    """The ``Event`` protos of a TensorBoard event file (a local path, ``gs://``, ``ram://``: read
    through ``dpbert.storage``), parsed by TensorBoard's own TFRecord reader (both checksums of
    every record verified); ValueError naming the file when it is not one (truncated, corrupt, not
    Events), OSError when it cannot be read."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import errors

    reader, events = _record_reader(storage.storage_for(uri).read_bytes(uri), uri), []
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return events
        except errors.OpError as err:  # DataLossError: truncated or a failed checksum
            raise ValueError(f"{uri}: not a readable TensorBoard event file ({err.message})") from None
        try:
            events.append(event_pb2.Event.FromString(reader.record()))
        except Exception as err:  # protobuf's DecodeError
            raise ValueError(f"{uri}: a record is not an Event ({type(err).__name__})") from None


def encode_event_file(events) -> bytes:
    """TFRecord bytes of ``Event`` protos, framed by TensorBoard's ``RecordWriter`` (what
    TensorBoard and ``tf.data.TFRecordDataset`` read)."""
    import io

    from tensorboard.summary.writer.record_writer import RecordWriter

    buffer = io.BytesIO()
    writer = RecordWriter(buffer)
    for event in events:
        writer.write(event.SerializeToString())
    return buffer.getvalue()


def released_events(paths: List[str]) -> list:
    """The events of ``paths`` (one TensorBoard directory's event files) as released: in file
    order (first event's wall time, then name) and record order, one ``file_version`` event first,
    every ``wall_time`` 0, run metadata (step timings) dropped."""
    from tensorboard.compat.proto import event_pb2

    files = []
    for path in paths:
        events = read_event_file(path)
        files.append((events[0].wall_time if events else 0.0, _name(path), events))
    files.sort(key=lambda f: (f[0], f[1]))
    version, out = None, []
    for _, _, events in files:
        for event in events:
            kind = event.WhichOneof("what")
            if kind == "file_version":
                version = version or event.file_version
                continue
            if kind == "tagged_run_metadata":
                continue
            released = event_pb2.Event()
            released.CopyFrom(event)
            released.wall_time = 0.0
            out.append(released)
    return [event_pb2.Event(wall_time=0.0, file_version=version or "brain.Event:2")] + out


def _plan(run, report) -> List[tuple]:
    """(source URI, bundle path, covered_by) for every released file — the source is the list of
    released ``Event`` protos for a rewritten TensorBoard file; ReleaseError when a part or a
    required file is missing, a released path is a symbolic link, or an event file is unreadable.
    Everything is found through ``dpbert.storage``: the same plan for local, gs:// and ram://."""
    copies = []
    for part in RELEASED:
        artifact = report if part.artifact_type == schema.PRIVACY_REPORT else \
            _released_artifact(run, part.artifact_type)
        if artifact is None and part.optional:
            continue
        if artifact is None:
            raise ReleaseError(f"run {run.run_id} has no released {part.artifact_type} "
                               "(not private, not non-private): nothing can be released")
        store = storage.storage_for(artifact.uri)
        for rel in part.required:
            if not store.exists(storage.join(artifact.uri, rel)):
                raise ReleaseError(f"run {run.run_id}: {storage.join(artifact.uri, rel)} does not exist "
                                   f"(the {part.artifact_type} artifact's files are missing)")
        for rel in part.paths:
            source = storage.join(artifact.uri, rel)
            _refuse_link(source)
            if store.isdir(source):
                copies.extend(_folder_plan(store, artifact.uri, rel, part))
            elif store.exists(source):
                copies.append((source, f"{part.bundle_dir}/{rel}", part.covered_by))
    return copies


def _folder_plan(store, root: str, rel: str, part: ReleasedPart) -> List[tuple]:
    """``_plan`` of one released folder of an artifact (``root``): every file, except under
    ``tensorboard/``, whose event files are read now and become one rewritten file per folder."""
    copies = []
    for folder, dirs, names in _walk(store, root, rel):
        for name in dirs + names:
            _refuse_link(storage.join(root, folder, name))
        if rel != schema.TENSORBOARD_DIR:
            copies.extend((storage.join(root, folder, name), f"{part.bundle_dir}/{folder}/{name}", part.covered_by)
                          for name in names)
            continue
        # Rewritten (docs/privacy.md): one neutral file per directory, no other file.
        event_files = [storage.join(root, folder, name) for name in names if _is_event_file(name)]
        if event_files:
            try:
                events = released_events(event_files)
            except (OSError, ValueError) as err:
                raise ReleaseError(f"{err}: a released TensorBoard file must be readable to be "
                                   f"rewritten without wall-clock time; refused") from None
            copies.append((events, f"{part.bundle_dir}/{folder}/{TENSORBOARD_EVENTS_FILE}", part.covered_by))
    return copies


def _contents(copies, audit) -> Iterator[tuple]:
    """(bundle path, bytes, covered_by) of every released file, read one at a time through
    ``dpbert.storage`` (TensorBoard events encoded), then ``audit/audit.json``."""
    for source, relative, covered_by in copies:
        if isinstance(source, list):  # TensorBoard events, rewritten (_plan)
            yield relative, encode_event_file(source), covered_by
            continue
        try:
            data = storage.storage_for(source).read_bytes(source)
        except OSError as err:
            raise ReleaseError(f"cannot read the released file {source}: {err}") from None
        yield relative, data, covered_by
    if audit is not None:
        yield AUDIT_FILE, (schema.dumps(audit, indent=2, sort_keys=True) + "\n").encode("utf-8"), "epsilon_total"


def _manifest_bytes(manifest: Dict[str, Any]) -> bytes:
    return (schema.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("utf-8")


# ------------------------------------------------------------------------- writing the bundle
def _check_target(bundle_dir: str):
    if os.path.lexists(bundle_dir) and not os.path.isdir(bundle_dir):
        raise ReleaseError(f"{bundle_dir} exists and is not a directory; choose a new bundle directory")
    if os.path.isdir(bundle_dir) and os.listdir(bundle_dir):
        raise ReleaseError(f"{bundle_dir} exists and is not empty; choose a new bundle directory")


def _check_remote_target(store, bundle_dir: str):
    if store.exists(bundle_dir) and not store.isdir(bundle_dir):
        raise ReleaseError(f"{bundle_dir} exists and is not a directory; choose a new bundle directory")
    if store.isdir(bundle_dir) and store.listdir(bundle_dir):
        raise ReleaseError(f"{bundle_dir} exists and is not empty; choose a new bundle directory")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _remove_empty(directory: str, top: Optional[str]):
    """Remove the empty directories from ``directory`` up to ``top`` (those this call created)."""
    while top is not None:
        try:
            os.rmdir(directory)
        except OSError:
            return
        if directory == top:
            return
        directory = os.path.dirname(directory)


def _put_local(folder: str, relative: str, data: bytes):
    """One file of a local bundle's temporary folder (the bundle is not an artifact: plain files,
    no storage-layer lock files in it)."""
    path = os.path.join(folder, *relative.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _write_local(bundle_dir: str, contents, manifest_of) -> Dict[str, Any]:
    """A local bundle, atomically: every file into a temporary folder next to the target, renamed
    at the end; on any error nothing is left (nor the parent folders this call created)."""
    target = os.path.abspath(bundle_dir)
    parent = os.path.dirname(target)
    created = parent
    while not os.path.exists(os.path.dirname(created)) and os.path.dirname(created) != created:
        created = os.path.dirname(created)
    created = None if os.path.exists(parent) else created  # the first ancestor this call creates
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.partial-", dir=parent)
    except OSError as err:
        raise ReleaseError(f"cannot write the bundle next to {bundle_dir}: {err}") from None
    try:
        files = []
        for relative, data, entry in contents:
            _put_local(tmp, relative, data)
            files.append(entry)
        manifest = manifest_of(files)
        _put_local(tmp, MANIFEST_FILE, _manifest_bytes(manifest))
        os.chmod(tmp, 0o777 & ~_umask())
        _check_target(bundle_dir)  # again: another process may have written there meanwhile
        if os.path.isdir(target):
            os.rmdir(target)
        os.rename(tmp, target)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(parent, created)
        if isinstance(err, OSError):
            raise ReleaseError(f"cannot write the bundle {bundle_dir}: {err}") from None
        raise
    return manifest


def _write_remote(bundle_dir: str, contents, manifest_of) -> Dict[str, Any]:
    """A bundle on object storage (``--to gs://…``), which has no rename: objects written one by
    one, ``manifest.json`` LAST, so a reader that finds the manifest finds every file it lists.
    Every object is created only if absent (generation 0): two releases racing into one target
    cannot mix files under one manifest. On any error the objects this call wrote are deleted (by
    generation, never another writer's); a bundle without ``manifest.json`` is incomplete."""
    store = storage.storage_for(bundle_dir)
    written = []
    try:
        files = []
        for relative, data, entry in contents:
            uri = storage.join(bundle_dir, relative)
            written.append((uri, store.write_bytes(uri, data, if_generation_match=0)))
            files.append(entry)
        manifest = manifest_of(files)
        uri = storage.join(bundle_dir, MANIFEST_FILE)
        written.append((uri, store.write_bytes(uri, _manifest_bytes(manifest), if_generation_match=0)))
    except BaseException as err:
        for uri, generation in reversed(written):
            try:
                store.delete(uri, if_generation_match=generation)
            except (OSError, storage.PreconditionFailed):
                pass  # gone, or replaced by another writer: not ours to delete
        if isinstance(err, (OSError, storage.PreconditionFailed)):
            raise ReleaseError(f"cannot write the bundle {bundle_dir}: {err}") from None
        raise
    return manifest


def _checked_ledger(run):
    """(PrivacyReport artifact, exact ledger, ε, unit) of a run that may be released; ReleaseError
    for a run without a privacy report, a non-private run, a run over its budget, no unit."""
    # The ledger of a non-private run says so (non_private, ε = ∞): it is found, then refused.
    report = next((a for a in run.artifacts(schema.type_name(schema.PRIVACY_REPORT)) if not a.private), None)
    if report is None:
        raise ReleaseError(f"run {run.run_id} has no privacy report: nothing can be released")
    ledger = exact_ledger(report)
    epsilon = ledger.epsilon_total_pld
    if ledger.non_private or not _finite(epsilon):
        raise ReleaseError(f"run {run.run_id} is not differentially private (ε = ∞): nothing to release")
    if ledger.within_budget is False:
        raise ReleaseError(f"run {run.run_id} is over its privacy budget (ε = {epsilon:.4g} > "
                           f"{ledger.epsilon_budget}): refused")
    unit = ledger.unit
    if not isinstance(unit, str):
        raise ReleaseError(f"run {run.run_id}: its privacy report names no unit of privacy")
    return report, ledger, epsilon, unit


def write_bundle(run, bundle_dir: str) -> Dict[str, Any]:
    """Copy the released files of ``run`` (a ``dpbert.metadata.RunInfo``; its artifacts local,
    ``gs://`` or ``ram://``) into ``bundle_dir`` and write the manifest. Returns the manifest.
    Refuses (``ReleaseError``, nothing written) a run without a privacy report, a non-private run,
    a run over its budget, a run whose released files are missing, and a ``bundle_dir`` that exists
    and is not an empty directory. A local ``bundle_dir`` is written atomically (``_write_local``),
    a remote one object by object with the manifest last (``_write_remote``)."""
    report, ledger, epsilon, unit = _checked_ledger(run)
    remote = storage.is_remote(bundle_dir)
    if storage.scheme(bundle_dir) == "file":
        bundle_dir = bundle_dir[len("file://"):]
    if remote:
        _check_remote_target(storage.storage_for(bundle_dir), bundle_dir)
    else:
        _check_target(bundle_dir)
    coverage = {
        "epsilon_vocab": {"epsilon": ledger.epsilon_vocab, "delta": ledger.delta_vocab},
        "epsilon_total": {"epsilon": epsilon, "delta": ledger.delta},
    }
    privacy = _privacy_fields(run, report, ledger, unit)
    adjacency = privacy["adjacency"]
    copies = _plan(run, report)
    contents = ((relative, data, {"path": relative, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                  "covered_by": covered_by, **coverage[covered_by], "unit": unit,
                                  "adjacency": adjacency})
                for relative, data, covered_by in _contents(copies, audit_record(run)))

    def manifest_of(files: List[Dict[str, Any]]) -> Dict[str, Any]:
        return {"run_id": run.run_id, "pipeline": run.pipeline, **privacy, "files": files}

    return (_write_remote if remote else _write_local)(bundle_dir, contents, manifest_of)


# --------------------------------------------------------------------------- the report's view
#: Of each section of ``dpbert.report.build_report``, the keys that are released (DP values).
RELEASED_REPORT = {
    "privacy": None,  # every ledger key (the ledger is released: privacy_report.json)
    "vocab": ("size", "words_kept", "sigma", "threshold", "epsilon"),
    # the DP model's diagnostics as its artifact reports them (DP estimates: dpbert.privacy.diagnostics)
    "pretraining": ("steps", "initial_mlm_loss", "final_mlm_loss", "loss_curve", "loss_curve_steps",
                    "final_mlm_accuracy",
                    "clipped_fraction", "diagnostics",
                    # public: the noise std of one step's DP estimate (σ, the bounds, q·n) and the window
                    "diagnostics_step_noise_std", "diagnostics_window"),
    # the DP model's NER F1 on public data, and the (public) task and mode of the evaluation
    "ner": ("f1", "per_type", "mode", "task", "seeds"),
    "canary": ("audit_epsilon_lower_bound", "audit_max_reachable_lower_bound"),
    # public rows, the DP vocabulary and public parameters only (dpbert.stages.audit)
    "audit": None,
    # The utility table: the rows of RELEASED_UTILITY_ROWS only (computed on public
    # text and public NER data — BC5CDR or the user's files, and the synthetic in-domain task — from
    # the DP model and public models); the non-private row and the gains kept (a function of it),
    # their std and their n/a reasons are operator-only.
    "utility": ("rows", "reference", "ner_seeds", "ner_mode", "ner_task"),
}
#: The utility rows that may be released (``released_view`` drops ``non_private``).
RELEASED_UTILITY_ROWS = ("random", "public", "dp")
#: What ``released_view`` leaves out, for the reader of the view.
OPERATOR_ONLY = ("component timings", "non-private model (losses, NER rows)", "canary exposures",
                 "membership inference", "corpus counts", "utility: non-private row and gains kept")


def _number(value) -> Optional[float]:
    if isinstance(value, str):
        value = schema.decode(value)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def releasable(report: Dict[str, Any]) -> bool:
    """Whether the report's run can be released: a finite ε total, within its budget."""
    privacy = report.get("privacy") or {}
    epsilon = _number(privacy.get(schema.EPSILON_TOTAL_PLD))
    return epsilon is not None and math.isfinite(epsilon) and privacy.get(schema.WITHIN_BUDGET) not in (False, 0)


def released_view(report: Dict[str, Any]) -> Dict[str, Any]:
    """``dpbert report --released``: an allow-list of ``build_report``'s DP values — the ε ledger,
    the DP vocabulary's size and ε, the DP model's (DP) training diagnostics, its NER F1 on public
    data, the utility table's random / public / DP rows and the one-run audit's bound. The other sections are computed on private data without
    noise (``OPERATOR_ONLY``) and are dropped. A run that cannot be released (ε = ∞, over budget)
    keeps only its ledger."""
    out: Dict[str, Any] = {"run_id": report.get("run_id"), "pipeline": report.get("pipeline"),
                           "status": report.get("status"), "view": "released",
                           "releasable": releasable(report), "operator_only_omitted": list(OPERATOR_ONLY)}
    out["privacy"] = dict(report.get("privacy") or {})
    if not out["releasable"]:
        return out
    for section, keys in RELEASED_REPORT.items():
        if section == "privacy":
            continue
        values = report.get(section)
        if not isinstance(values, dict):
            continue
        if section == "vocab" and values.get(schema.NON_PRIVATE):
            continue  # exact counts: operator-only (and the run is not releasable anyway)
        out[section] = dict(values) if keys is None else {k: values.get(k) for k in keys}
        if section == "utility" and isinstance(values.get("rows"), dict):
            out[section]["rows"] = {name: dict(row) for name, row in values["rows"].items()
                                    if name in RELEASED_UTILITY_ROWS and isinstance(row, dict)}
    return out


def bundle_files(bundle_dir: str) -> List[str]:
    """Every file under a bundle (local or remote, read through ``dpbert.storage``), as
    ``/``-separated paths (for tests and the CLI's summary)."""
    store = storage.storage_for(bundle_dir)
    if not store.isdir(bundle_dir):
        return []
    return sorted(f"{folder}/{name}" if folder else name
                  for folder, _, names in _walk(store, bundle_dir, "") for name in names)
