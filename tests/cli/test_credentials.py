"""A gs:// ledger or pipeline root and no Google Cloud credentials: every command that reads it
(run, budget, ledger, report, dashboard) prints ONE line naming the gs:// URI and the fix, and
exits 4 (the environment refused), never a traceback. `run` fails at its budget guard, which reads
the dataset ledger before the DAG starts (nothing is written to --output).

In process (``dpbert_cli.main.main``), without network: either google.auth itself with
GOOGLE_APPLICATION_CREDENTIALS naming a missing file (it fails before any probe), or
``google.auth.default`` replaced by one raising DefaultCredentialsError; any socket connection
fails the test. Positive control: with the storage layer's translation disabled, the checks
below catch the escaping client error."""
import logging
import os
import socket
import sys
import types

import pytest

from dpbert import exit_codes
from dpbert.storage import api, base

BUCKET = "gs://dpbert-no-credentials"
LEDGER, ROOT = f"{BUCKET}/ledgers", f"{BUCKET}/root"
#: A real dataset (the synthetic corpus's ledger is always a local folder of its own).
DATASET = ["--set", "corpus.dataset_id=ward7", "--set", f"privacy.ledger={LEDGER}",
           "--set", "training.dataset_size=200"]
COMMANDS = {
    "run": ["run", *DATASET],
    "budget": ["budget", *DATASET],
    "ledger": ["ledger", "--ledger", LEDGER, "--dataset", "ward7"],
    "report": ["report", "--pipeline-root", ROOT],
    "dashboard": ["dashboard", "--pipeline-root", ROOT],
}


def _dag_started(config):
    raise AssertionError("the DAG started: the budget guard did not read the ledger first")


#: ``pipeline.local_runner`` as ``dpbert run`` imports it, with a run_local that fails the test.
_NO_DAG = types.ModuleType("pipeline.local_runner")
_NO_DAG.run_local = _dag_started
_NO_DAG.RunInterrupted = type("RunInterrupted", (Exception,), {})
_NO_DAG.RunRefused = type("RunRefused", (Exception,), {})


def _refuse_network(self, address):
    raise AssertionError(f"the test reached the network: {address}")


@pytest.fixture(params=["missing_key_file", "no_default_credentials"])
def no_credentials(request, monkeypatch, tmp_path):
    """An environment with no Google Cloud credentials and no way to look for them remotely."""
    import google.auth
    from google.auth import exceptions as auth_exceptions

    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no gcloud ADC file
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    if request.param == "missing_key_file":
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing-key.json"))
    else:
        monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)

        def no_default(*args, **kwargs):
            raise auth_exceptions.DefaultCredentialsError("Your default credentials were not found.")

        monkeypatch.setattr(google.auth, "default", no_default)
    monkeypatch.setattr(socket.socket, "connect", _refuse_network)
    monkeypatch.delitem(api._SINGLETONS, "gs", raising=False)  # a client created in this environment
    yield
    api._SINGLETONS.pop("gs", None)


@pytest.fixture
def dpbert_main(capsys, monkeypatch):
    """``dpbert_main(*args)``: (exit code, stdout, stderr) of ``main(argv)`` in this process; an
    exception escaping main is returned as exit 1 with its traceback text, as Python prints it."""
    import traceback

    from dpbert_cli import dashboard
    from dpbert_cli.main import main

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))  # main sets 3
    monkeypatch.setattr(logging.getLogger(), "handlers", list(logging.getLogger().handlers))
    # Never serve or train: a command that got past the failing read would otherwise wait for
    # requests (dashboard) or run the DAG (run).
    monkeypatch.setattr(dashboard, "_port_refused", lambda host, port: "the test does not serve")
    monkeypatch.setitem(sys.modules, "pipeline.local_runner", _NO_DAG)  # (not importing TFX: 30 s)

    def run(*args):
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except Exception:  # noqa: BLE001 -- what the user would see
            code = 1
            print(traceback.format_exc(), file=sys.stderr)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def problems(code, stderr: str, uri_prefix: str):
    """What is wrong with a command's answer to missing credentials (empty: nothing)."""
    found = []
    lines = stderr.strip().splitlines()
    if code != exit_codes.ENVIRONMENT:
        found.append(f"exit {code}, not {exit_codes.ENVIRONMENT}")
    if len(lines) != 1:
        found.append(f"{len(lines)} lines on stderr, not one")
    if "Traceback" in stderr:
        found.append("a traceback")
    line = lines[-1] if lines else ""
    if uri_prefix not in line or "Google Cloud credentials" not in line:
        found.append(f"the line does not name the gs:// URI and the cause: {line!r}")
    if "gcloud auth application-default login" not in line or "GOOGLE_APPLICATION_CREDENTIALS" not in line:
        found.append("the line does not say how to fix it")
    return found


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A tiny real corpus (JSONL, as ``dpbert synth`` writes it) for run and budget."""
    import json

    path = tmp_path_factory.mktemp("corpus") / "notes.jsonl"
    notes = [{"text": f"Patient {p} admitted with chest pain; troponin normal, discharged on aspirin.",
              "patient_id": f"p{p}", "admission_id": f"a{p}", "note_id": f"n{p}"} for p in range(4)]
    path.write_text("".join(json.dumps(n) + "\n" for n in notes))
    return str(path)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_one_line_and_exit_4_without_credentials(command, no_credentials, dpbert_main, tmp_path, corpus):
    args = list(COMMANDS[command])
    if command in ("run", "budget"):
        args += ["--set", f"corpus.path={corpus}"]
    if command == "run":  # the corpus's 4 patients declared, so no size warning precedes the one line
        args += ["--output", str(tmp_path / "out"), "--set", "training.dataset_patients=4",
                 "--set", "training.batch_size=2", "--set", "vocab.source=public"]
    code, _, err = dpbert_main(*args)
    uri = LEDGER if command in ("run", "budget", "ledger") else ROOT
    assert problems(code, err, uri + "/") == []
    assert err.startswith(f"dpbert {command}: error: {uri}/")
    if command == "run":
        assert not (tmp_path / "out").exists()  # refused before the DAG: nothing written


def test_positive_control_an_untranslated_client_error_is_caught(no_credentials, dpbert_main, monkeypatch):
    monkeypatch.setattr(base, "is_credentials_error", lambda err: False)
    code, _, err = dpbert_main(*COMMANDS["ledger"])
    found = problems(code, err, LEDGER + "/")
    assert code == 1 and "a traceback" in found and "DefaultCredentialsError" in err
