"""Issue 18: a new user's mistakes get a one-line message and an exit code, never a traceback or
silently lost data; logs are quiet by default.

The CLI tests call the entry point in-process (``dpbert_cli.main.main(argv)``, ``in_process``) and
assert the exit code, that the message names the file or parameter, and that stderr holds no
traceback (an exception escaping ``main`` fails the test); each command keeps one run of the real
entry point in a subprocess (``python -m dpbert_cli``, ``dpbert``): run, synth, report, dashboard,
budget, --version. Every command here fails before TensorFlow is imported, except the one test of
the log filters and the training progress (one TensorFlow import).
"""
import os
import re
import socket
import subprocess
import sys

import pytest

from dpbert import exit_codes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env():
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", PYTHONPATH=REPO)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as a new user runs it
    return env


def dpbert(*args, cwd=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "dpbert_cli", *map(str, args)], cwd=cwd or REPO,
                          env=_env(), capture_output=True, text=True, timeout=timeout)


class _Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture()
def in_process(capsys, monkeypatch):
    """``in_process(*args)``: ``dpbert ARGS`` as ``main(argv)`` in this process, a result like
    ``dpbert``'s (exit code, stdout, stderr). The log level variable and root handlers ``main``
    changes are restored after the test."""
    import logging

    from dpbert_cli.main import main

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))  # main sets 3
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))

    def run(*args):
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as exit_:  # argparse: --help, usage errors
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        out, err = capsys.readouterr()
        return _Result(code, out, err)

    return run


def assert_user_error(result, code, *names):
    """Exit ``code``, one ``dpbert COMMAND: error: ...`` line naming each of ``names``, no traceback."""
    assert result.returncode == code, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, result.stderr
    for name in names:
        assert str(name) in errors[0], (name, errors[0])
    return errors[0]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real ML Metadata sqlite store with runs (tests/dashboard/fakestore.py)."""
    from tests.dashboard import fakestore

    base = tmp_path_factory.mktemp("store")
    path = base / "metadata.sqlite"
    fakestore.build_store(str(path), str(base / "pipeline_root"))
    return path


# 1. Strict CSV parsing: an unterminated quote is an error naming file:line, nothing is written.
def test_csv_unterminated_quote_names_file_and_line_and_writes_nothing(tmp_path):
    corpus = tmp_path / "notes.csv"
    corpus.write_text('ROW_ID,SUBJECT_ID,ISERROR,TEXT\n1,10,0,"first note\n2,11,0,second note\n'
                      '3,12,0,third note\n')
    out = tmp_path / "out"
    result = dpbert("run", "--corpus", corpus, "--output", out, "--set", "corpus.dataset_id=notes")
    line = assert_user_error(result, exit_codes.BAD_INPUT, f"{corpus}:2:", "unterminated quote")
    assert "second note" not in line  # never quotes a note
    assert not out.exists()


# 2. Validate before writing: synth never truncates, never leaves a partial file.
def test_synth_validates_before_it_writes(tmp_path, in_process):
    keep = tmp_path / "keep.jsonl"
    keep.write_text('{"text": "precious"}\n')
    assert_user_error(in_process("synth", "--output", keep, "--patients", "0"), exit_codes.BAD_INPUT, "--patients")
    assert keep.read_text() == '{"text": "precious"}\n'
    missing = tmp_path / "no" / "such" / "c.jsonl"
    assert_user_error(in_process("synth", "--output", missing), exit_codes.BAD_INPUT, missing, "does not exist")
    assert_user_error(in_process("synth", "--output", tmp_path), exit_codes.BAD_INPUT, tmp_path, "is a directory")
    ok = dpbert("synth", "--output", keep, "--patients", "1")  # the real entry point
    assert ok.returncode == 0 and len(keep.read_text().splitlines()) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.jsonl"]  # no temporary file left
    helped = in_process("synth", "--help").stdout
    for documented in ("--patients N", "patients (default 40", "--admissions N", "admissions per patient",
                       "--notes N", "notes per admission", "generator seed", "its directory must exist"):
        assert documented in " ".join(helped.split()), documented


def test_synthetic_write_is_atomic(tmp_path):
    """An error while generating leaves the existing file as it was (write_jsonl itself)."""
    from dpbert.data.readers import Document
    from dpbert.data.synthetic import write_jsonl

    keep = tmp_path / "keep.jsonl"
    keep.write_text("old\n")

    def documents():
        yield Document(doc_id="a", text="a")
        raise ValueError("generator failed")

    with pytest.raises(ValueError):
        write_jsonl(documents(), keep)
    assert keep.read_text() == "old\n" and os.listdir(tmp_path) == ["keep.jsonl"]


# 3. No traceback for user errors; a closed stdout ends quietly; --version.
def test_paths_that_are_not_what_they_should_be(tmp_path, in_process):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    assert_user_error(in_process("run", "--config", tmp_path, "--output", tmp_path / "o"), exit_codes.BAD_INPUT,
                      tmp_path, "is a directory")
    assert_user_error(in_process("run", "--output", notes), exit_codes.BAD_INPUT, "--output", notes, "is a file")
    assert_user_error(in_process("report", "--metadata", empty), exit_codes.BAD_INPUT, empty, "0 bytes")
    assert_user_error(in_process("report", "--metadata", notes), exit_codes.BAD_INPUT, notes, "not an SQLite database")
    assert_user_error(in_process("report", "--output", notes), exit_codes.BAD_INPUT, "--output", notes)
    # Refused at start instead of serving a 500 on every page.
    assert_user_error(in_process("dashboard", "--metadata", notes), exit_codes.BAD_INPUT, notes)
    assert not (tmp_path / "o").exists()


def test_sqlite_that_is_not_ml_metadata(tmp_path, in_process):
    import sqlite3

    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (x)")
    assert_user_error(in_process("report", "--metadata", other), exit_codes.BAD_INPUT, other,
                      "not a readable ML Metadata store")


def test_report_into_a_closed_pipe_exits_quietly(store):
    proc = subprocess.Popen([sys.executable, "-m", "dpbert_cli", "report", "--metadata", str(store), "--json"],
                            cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # `| head` that has already exited
    stderr = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert stderr.strip() == "", stderr
    assert code == 128 + 13  # as a command ended by SIGPIPE


def test_dashboard_port_in_use_is_an_environment_error(store):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = dpbert("dashboard", "--metadata", store, "--port", port)
    assert_user_error(result, exit_codes.ENVIRONMENT, f"port {port}", "already in use")
    assert exit_codes.ENVIRONMENT == 4 and exit_codes.OVER_BUDGET == 3


def test_version():
    from importlib.metadata import version

    result = dpbert("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"dpbert {version('dpbert')}"


# 4. Configuration errors name their source.
def test_config_errors_name_their_source(tmp_path, in_process):
    line = assert_user_error(in_process("run", "--set", "vocab.sigma=abc"), exit_codes.BAD_INPUT,
                             "--set vocab.sigma=abc", "vocab.sigma")
    assert "demo.yaml" not in line
    dup = tmp_path / "dup.yaml"
    dup.write_text("vocab:\n  sigma: 3\ntraining:\n  steps: 2\n  steps: 3\n")
    assert_user_error(in_process("budget", "--config", dup), exit_codes.BAD_INPUT, f"{dup}:5", "duplicate key",
                      "training.steps")
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes("# r\xe9sum\xe9\nvocab:\n  sigma: 3\n".encode("latin-1"))
    assert_user_error(in_process("budget", "--config", latin), exit_codes.BAD_INPUT, f"{latin}:1", "not UTF-8")


# 5. budget with the paper-scale config explains how to give a public dataset size.
def test_budget_explains_how_to_give_the_public_dataset_size():
    default = os.path.join(REPO, "dpbert", "configs", "default.yaml")
    result = dpbert("budget", "--config", default, "--examples", "1000")
    assert_user_error(result, exit_codes.BAD_INPUT, "training.batch_size", "n = 1000", "--examples N",
                      "--set training.dataset_size=N")


# 6 and 7. Quiet logs unless --verbose; training progress as log lines when not on a terminal.
_LOGS = r'''
import io, logging, os, sys
from dpbert_cli.main import _setup_logging
_setup_logging(sys.argv[1] == "verbose")
print("TF_CPP_MIN_LOG_LEVEL=" + os.environ.get("TF_CPP_MIN_LOG_LEVEL", ""))
for name, message in [
        ("absl", "ArtifactQuery.property_predicate is not supported."),
        ("apache_beam.runners.portability.local_job_service", 'Worker: message: "No semi_persistent_directory found"'),
        ("apache_beam.runners.portability.local_job_service", "Worker: Discarding unparseable args: ['--x']"),
        ("apache_beam.runners.portability.local_job_service", "Worker: Couldn't find python-snappy so ..."),
        ("tensorflow", "Compiled the loaded model, but the compiled metrics have yet to be built.")]:
    logging.getLogger(name).warning(message)
logging.getLogger("dpbert.anything").warning("a real warning")
if sys.argv[1] == "quiet":
    from dpbert.engine.train import _Progress  # imports TensorFlow (its C++ log: quiet)

    stream = io.StringIO()  # not a terminal
    progress = _Progress(10, 0, "DP-SGD", interval=0.0, stream=stream)
    for step in range(1, 11):
        progress.update(step, {"loss": 2.5, "accuracy": 0.25})
    progress.close()
    assert stream.getvalue() == "", stream.getvalue()
'''
NOISE = ("Unable to register", "property_predicate", "semi_persistent_directory", "Discarding unparseable",
         "python-snappy", "compiled metrics")


def test_logs_quiet_by_default_and_progress_lines_off_a_terminal():
    quiet = subprocess.run([sys.executable, "-c", _LOGS, "quiet"], cwd=REPO, env=_env(), capture_output=True,
                           text=True, timeout=300)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert "TF_CPP_MIN_LOG_LEVEL=3" in quiet.stdout
    for noise in NOISE:
        assert noise not in quiet.stderr, (noise, quiet.stderr[-3000:])
    assert "a real warning" in quiet.stderr
    lines = [line for line in quiet.stderr.splitlines() if "DP-SGD: step" in line]
    assert lines and "DP-SGD: step 10/10" in lines[-1], quiet.stderr[-3000:]
    assert all("steps/s" in line and "ETA" in line and "loss 2.500" in line for line in lines)
    assert "\r" not in quiet.stderr
    verbose = subprocess.run([sys.executable, "-c", _LOGS, "verbose"], cwd=REPO, env=_env(),
                             capture_output=True, text=True, timeout=120)
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    for noise in NOISE[1:]:
        assert noise in verbose.stderr, (noise, verbose.stderr)


# 8. The README's test command installs the browser test's Chromium first, once.
def test_make_test_installs_chromium_first():
    dry = subprocess.run(["make", "-n", "test"], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, MAKEFLAGS=""))
    assert dry.returncode == 0, dry.stderr
    commands = dry.stdout.splitlines()
    install = [i for i, c in enumerate(commands) if "bash .ci/install-chromium.sh" in c]
    pytest_ = [i for i, c in enumerate(commands) if "-m pytest" in c]
    assert len(install) == 1 and pytest_ and install[0] < pytest_[0], dry.stdout
    with open(os.path.join(REPO, ".ci", "run")) as handle:
        ci = [line for line in handle if not line.lstrip().startswith("#")]
    assert any(line.strip() == "make test" for line in ci)
    assert not any("install-chromium" in line for line in ci)  # not installed twice


# 9. One table of exit codes in the command-line reference (docs/cli.md).
def test_cli_docs_document_every_exit_code():
    with open(os.path.join(REPO, "docs", "cli.md"), encoding="utf-8") as handle:
        readme = handle.read()
    cli = readme.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\|\s*`?(\d+)`?\s*\|(.*)\|\s*$", cli, re.M)}
    for name in exit_codes.__all__:
        value = getattr(exit_codes, name)
        assert value in rows, (name, value)
        assert f"`{name}`" in rows[value], (name, rows[value])


# 10. Issue 22 (item 11): the whole corpus is checked before anything is written; late errors are
# one exit-2 line. In-process (``main(argv)``): each fails before TFX is imported.
def _run_in_process(capsys, *argv):
    from dpbert_cli.main import main

    # A user corpus under the demo's budget names its dataset (the ledger's identity).
    code = main(["run", "--set", "corpus.dataset_id=notes", *map(str, argv)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if ": error: " in line]
    return code, errors


def _notes(path, count, drop_patient_at=None, duplicate_at=None):
    import json

    with open(path, "w") as handle:
        for i in range(count):
            record = {"text": f"Mrs Quinby was seen on day {i}", "note_id": f"n{i}", "patient_id": f"p{i % 5}"}
            if i + 1 == drop_patient_at:
                del record["patient_id"]
            if i + 1 == duplicate_at:
                record["note_id"] = "n0"
            handle.write(json.dumps(record) + "\n")
    return path


def _no_dag(monkeypatch, raises=None):
    """``pipeline.local_runner`` replaced (without importing TFX): its ``run_local`` raises
    ``raises``, by default an AssertionError (the DAG must not start: on the previous main these
    runs went on into it)."""
    import sys
    import types

    fake = types.ModuleType("pipeline.local_runner")

    class _Never(Exception):
        pass

    def run_local(config):
        raise raises if raises is not None else AssertionError("the DAG started")

    fake.run_local, fake.RunInterrupted, fake.RunRefused = run_local, _Never, _Never
    monkeypatch.setitem(sys.modules, "pipeline.local_runner", fake)


def test_run_checks_every_record_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """Fails on the previous main: line 40 without patient_id reached the Beam job (110 lines of
    traceback, exit 1, after the output folder and a FAILED run were written); duplicates passed."""
    _no_dag(monkeypatch)
    out = tmp_path / "out"
    corpus = _notes(tmp_path / "notes.jsonl", 48, drop_patient_at=40)
    code, errors = _run_in_process(capsys, "--corpus", corpus, "--output", out)  # the demo: patient unit
    assert code == exit_codes.BAD_INPUT and len(errors) == 1, errors
    assert f"{corpus}:40: privacy.unit = patient needs a patient id" in errors[0] and "Quinby" not in errors[0]
    corpus = _notes(tmp_path / "notes.jsonl", 48, duplicate_at=31)
    code, errors = _run_in_process(capsys, "--corpus", corpus, "--output", out)
    assert code == exit_codes.BAD_INPUT and f"{corpus}:31: duplicate record id" in errors[0], errors
    assert not out.exists()


def test_unwritable_output_folder_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    """Fails on the previous main: a PermissionError traceback from inside the run."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: emulate the permission bits
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if os.path.abspath(p) == str(locked)
                            else real(p, mode, **kw))
    _no_dag(monkeypatch)
    try:
        code, errors = _run_in_process(capsys, "--output", locked / "out", "--set", "corpus.synthetic.patients=20",
                                       "--set", "privacy.epsilon_budget=null", "--set", "training.dataset_patients=null",
                                       "--set", "training.dataset_size=null")
    finally:
        locked.chmod(0o755)
    assert code == exit_codes.BAD_INPUT and len(errors) == 1, errors
    assert f"directory {locked} is not writable" in errors[0] and "--output" in errors[0]
    assert not (locked / "out").exists()


def test_no_word_passed_the_threshold_is_an_exit_2_line(tmp_path, capsys, monkeypatch):
    """Fails on the previous main: a ValueError traceback (exit 1) from the vocabulary stage."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from dpbert.config import CorpusConfig, PrivacyConfig, SyntheticCorpusConfig, VocabConfig
    from dpbert.data.readers import CorpusError
    from dpbert.stages.ingest import ingest
    from dpbert.stages.vocabulary import NoWordKept, dp_vocabulary

    ingest(CorpusConfig(synthetic=SyntheticCorpusConfig(patients=2, admissions_per_patient=1, notes_per_admission=1)),
           str(tmp_path / "tuples"), tuple_words=32, num_shards=1)
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"]))
    with pytest.raises(NoWordKept, match="no word passed the threshold") as info:
        dp_vocabulary(pipeline, str(tmp_path / "tuples"), str(tmp_path / "vocab"),
                      VocabConfig(sigma=1e6, delta=1e-6, noise_seed=3), PrivacyConfig(tuple_words=32), tuple_words=32)
    assert isinstance(info.value, CorpusError)
    # Raised inside the DAG (LocalDagRunner re-raises the component's exception, as
    # tests/pipeline/test_corpus_cache.py shows for the ingest's): one exit-2 line.
    _no_dag(monkeypatch, raises=info.value)
    code, errors = _run_in_process(capsys, "--output", tmp_path / "out", "--set", "privacy.epsilon_budget=null",
                                   "--set", "training.dataset_patients=null", "--set", "training.dataset_size=null",
                                   "--set", "corpus.synthetic.patients=20")  # no planning: quick
    assert code == exit_codes.BAD_INPUT and len(errors) == 1 and "no word passed the threshold" in errors[0]


def test_run_no_cache_flag(capsys):
    """Fails on the previous main: no --no-cache (only --set pipeline.enable_cache=false)."""
    from dpbert_cli import commands
    from dpbert_cli.main import build_parser

    assert commands.load(build_parser().parse_args(["run", "--no-cache"]), preset="demo").pipeline.enable_cache is False
    assert commands.load(build_parser().parse_args(["run"]), preset="demo").pipeline.enable_cache is True
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    assert "pipeline.enable_cache=false" in " ".join(capsys.readouterr().out.split())
