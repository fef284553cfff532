"""The whole DAG in ONE process with its pipeline root and the dataset ledger on TensorFlow's
``ram://`` filesystem: every artifact, state and ledger path must go through dpbert.storage /
TFX fileio / tf.io.gfile (and Beam's FileSystems in the vocabulary job), never the local disk.

In one process: TFX's LocalDagRunner; Beam's DirectRunner in ``in_memory`` mode with one worker
(``ram://`` is this process's memory: a ``multi_processing`` worker would see nothing), with the
test-only Beam filesystem for the scheme (tests/beam_ram_filesystem.py); ``training.workers`` 1
(the multi-worker trainer runs its workers as processes). What stays local: the ML Metadata sqlite
file (MLMD's sqlite needs a local file) and the scratch folder libraries put temporary files in.

Checks: an audit hook (``sys.addaudithook``) records every Python-level write (open for writing,
rename, remove, mkdir, chmod …) outside the test's scratch folder and the ML Metadata file; a
before/after snapshot of the working folder and the home folder (both fresh for the run, so that
writes from C++ — TensorFlow, sqlite — which no audit event sees, are caught too); then the
artifacts are found on ``ram://`` and none under the local output folder. A positive control
shows the hook catches a plain ``open`` on a local artifact-like path.
"""
import os
import sys
import tempfile
import threading
import traceback

import pytest

from tests.e2e.tiny_dag import TINY_DAG

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: Audit events that write to (or change) the filesystem; "open" is filtered on its mode / flags.
WRITE_EVENTS = {"os.rename", "os.replace", "os.remove", "os.unlink", "os.rmdir", "os.mkdir", "os.chmod",
                "os.chown", "os.link", "os.symlink", "os.truncate", "os.utime", "shutil.copyfile",
                "shutil.copytree", "shutil.move", "shutil.rmtree", "shutil.copymode", "shutil.copystat"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class WriteAudit:
    """A process-wide audit hook (one per process: hooks cannot be removed), active only while
    ``armed``; records ``(event, path, stack)`` for writes outside ``allowed`` path prefixes."""

    _installed = None

    def __init__(self):
        self.allowed, self.violations, self.armed = (), [], False
        self._local = threading.local()

    @classmethod
    def get(cls) -> "WriteAudit":
        if cls._installed is None:
            cls._installed = cls()
            sys.addaudithook(cls._installed._hook)
        return cls._installed

    def _is_write(self, event, args) -> bool:
        if event == "open":
            mode, flags = (args[1], args[2]) if len(args) >= 3 else (None, 0)
            if isinstance(mode, str):
                return any(c in mode for c in "wax+")
            return bool((flags or 0) & _WRITE_FLAGS)
        return event in WRITE_EVENTS

    def _hook(self, event, args):
        if not self.armed or getattr(self._local, "busy", False) or not args:
            return
        if event != "open" and event not in WRITE_EVENTS:
            return
        self._local.busy = True  # the checks below must not audit themselves
        try:
            if not self._is_write(event, args):
                return
            for path in self._written(event, args):
                if isinstance(path, int) or path is None:
                    continue
                path = os.path.abspath(os.fsdecode(path))
                if not any(path == a or path.startswith(a.rstrip("/") + "/") for a in self.allowed):
                    self.violations.append((event, path, "".join(traceback.format_stack(limit=12)[:-2])))
        finally:
            self._local.busy = False

    @staticmethod
    def _written(event, args):
        """The paths an event changes: a copy's or a link's destination, both ends of a rename."""
        if event.startswith("shutil.copy") or event in ("os.link", "os.symlink"):
            return args[1:2]
        if event in ("os.rename", "os.replace", "shutil.move"):
            return args[:2]
        return args[:1]


def _snapshot(folder):
    """{relative path: (size, mtime_ns)} of every file and folder under ``folder``."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            out[os.path.relpath(path, folder)] = (st.st_size, st.st_mtime_ns)
    return out


def test_the_hook_catches_a_local_write(tmp_path):
    """Positive control: a plain ``open`` for writing outside the allowed folder is recorded."""
    audit = WriteAudit.get()
    audit.allowed, audit.violations = (str(tmp_path / "allowed"),), []
    audit.armed = True
    try:
        with open(tmp_path / "artifact.json", "w") as f:
            f.write("{}")
        with open(tmp_path / "artifact.json") as f:  # a read is not a write
            f.read()
        os.makedirs(tmp_path / "allowed" / "x")
    finally:
        audit.armed = False
    assert [(e, p) for e, p, _ in audit.violations] == [("open", str(tmp_path / "artifact.json"))]


def _ram_files(root):
    import tensorflow as tf

    return sorted(os.path.join(d, f)[len(root):].lstrip("/") for d, _, files in tf.io.gfile.walk(root)
                  for f in files)


def test_dag_runs_in_one_process_on_ram(tmp_path, monkeypatch):
    import tests.beam_ram_filesystem  # noqa: F401 -- registers Beam's ram:// filesystem
    from tfx import v1 as tfx

    from dpbert import metadata
    from dpbert.config import load_config
    from pipeline.local_runner import components_argv
    from pipeline.pipeline import create_pipeline

    scratch, work, home, out = (tmp_path / n for n in ("scratch", "work", "home", "out"))
    for folder in (scratch, work, home, out):
        folder.mkdir()
    root = f"ram://dpbert-e2e-{os.getpid()}"
    pipeline_root, ledger = f"{root}/pipeline_root", f"{root}/ledgers"
    metadata_path = str(out / "metadata.sqlite")
    # Libraries' temporary files and caches go to the scratch folder; HOME and the working folder
    # are fresh and empty, so the snapshots below see whatever lands there.
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    for var in ("TMPDIR", "MPLCONFIGDIR", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(scratch))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("DPBERT_LEDGER", raising=False)
    # The synthetic corpus's ledger folder (its configured dataset id and privacy.ledger are
    # ignored: synthetic stays synthetic), here on ram:// too.
    monkeypatch.setenv("DPBERT_SYNTHETIC_LEDGER", f"{root}/synthetic-ledgers")
    monkeypatch.chdir(work)

    config = load_config(None, TINY_DAG + [
        f"pipeline.output_dir={out}",
        f"privacy.ledger={ledger}",
        "corpus.dataset_id=ram-e2e",
        "beam.direct_running_mode=in_memory",
        "beam.direct_num_workers=1",
        "training.workers=1",
    ], preset="demo")
    pipeline = create_pipeline(config, pipeline_root, metadata_path)
    before = {"work": _snapshot(work), "home": _snapshot(home)}
    audit = WriteAudit.get()
    audit.allowed, audit.violations = (str(scratch), metadata_path, metadata_path + "-journal",
                                       metadata_path + "-wal", metadata_path + "-shm"), []
    audit.armed = True
    try:
        with components_argv():
            tfx.orchestration.LocalDagRunner().run(pipeline)
    finally:
        audit.armed = False
    after = {"work": _snapshot(work), "home": _snapshot(home)}

    assert not audit.violations, "local writes:\n" + "\n".join(f"{e} {p}\n{s}" for e, p, s in audit.violations[:5])
    assert after == before, f"written to the working or home folder: {set(after['work']) ^ set(before['work'])}, " \
                            f"{set(after['home']) ^ set(before['home'])}"
    assert sorted(os.listdir(out)) == ["metadata.sqlite"]  # nothing else on the local disk

    files = _ram_files(pipeline_root)
    for part in ("CorpusIngest/tuples/", "DPVocabularyGen/vocabulary/", "CanaryGen/canaries/",
                 "MLMPretrainer/model/", "PrivacyAccountant/report/", "CanaryExposure/report/",
                 "PrivacyAuditor/report/", "NerEvaluator/report/", "MembershipInference/report/",
                 "_trainer_state/"):
        assert any(f.startswith(part) for f in files), (part, files[:40])
    import tensorflow as tf

    assert tf.io.gfile.glob(f"{root}/synthetic-ledgers/*.json"), "the dataset ledger is on ram://"
    assert not tf.io.gfile.exists(ledger), "a configured ledger folder is never touched by the synthetic corpus"
    run = metadata.get_run(metadata.open_store(metadata_path))
    assert {c.node_id for c in run.components} >= {"CorpusIngest", "MLMPretrainer", "PrivacyAccountant"}
    assert all(c.state in ("COMPLETE", "CACHED") for c in run.components), [(c.node_id, c.state) for c in run.components]
    # every output artifact the store records lies on ram://
    assert all(a.uri.startswith(pipeline_root) for c in run.components for a in c.outputs)
