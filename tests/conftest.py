"""Test-wide setup: every process that imports TensorFlow needs TF_USE_LEGACY_KERAS=1.

Under pytest-xdist (``make test`` runs ``-n 2``) each worker, and every subprocess a test starts
(they inherit the environment), runs TensorFlow and OpenMP with one intra-op and one inter-op
thread, so two workers do not oversubscribe two cores.

``tiny_dag_run``: the tiny end-to-end DAG run (tests/e2e/tiny_dag.py ``TINY_DAG``), run ONCE and shared
by tests/e2e/test_dag_tiny.py and the dashboard's browser test; every test that uses it carries
``@pytest.mark.xdist_group("tiny_dag")`` so ``--dist loadgroup`` runs them on one worker.

Skips: a skipped test fails the session unless tests/skip_allowlist.txt lists it (tests/skip_guard.py,
imported below; pytest.ini names the file).
"""
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Read by TensorFlow when it creates its thread pools (it is not imported yet: conftest.py is
    # imported before any test module) and by OpenMP / MKL; subprocesses inherit them.
    for _name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                  "OPENBLAS_NUM_THREADS"):
        os.environ[_name] = "1"
    if "tensorflow" in sys.modules:  # a plugin imported it first: set the pools before their first use
        import tensorflow as _tf

        try:
            _tf.config.threading.set_intra_op_parallelism_threads(1)
            _tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # already initialised
            pass
# The dataset privacy ledgers (dpbert.ledger): never the home directory. A session folder for
# what runs outside a test (session fixtures, their subprocesses), and each test its own
# (``_own_dataset_ledger``): ledgers accumulate by design, tests must not charge each other.
import atexit  # noqa: E402
import itertools  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

os.environ["DPBERT_LEDGER"] = tempfile.mkdtemp(prefix="dpbert-test-ledgers-")
os.environ["DPBERT_SYNTHETIC_LEDGER"] = tempfile.mkdtemp(prefix="dpbert-test-synthetic-ledgers-")
atexit.register(shutil.rmtree, os.environ["DPBERT_LEDGER"], True)  # this process's session folders only
atexit.register(shutil.rmtree, os.environ["DPBERT_SYNTHETIC_LEDGER"], True)
# tensorflow_privacy's __init__ imports the estimator code, broken on TF 2.16 (see
# ../shared/ENVIRONMENT.md); dpbert imports only the submodules it uses.
sys.skip_tf_privacy_import = True

import pytest  # noqa: E402

from tests.skip_guard import (  # noqa: E402,F401  (hooks: a skip not in the allowlist fails)
    pytest_addoption, pytest_configure, pytest_make_collect_report, pytest_runtest_makereport,
    pytest_terminal_summary)
from tests.gcs_server import gcs_server  # noqa: E402,F401  (fixture: a GCS JSON API on loopback)


@pytest.fixture(scope="session")
def _ledger_folders(tmp_path_factory):
    """A fresh numbered folder per call under one session folder (``mktemp`` per test lists the
    whole base folder to number it: quadratic over ~1,600 tests)."""
    root, count = tmp_path_factory.mktemp("test-ledgers"), itertools.count()

    def fresh():
        folder = root / str(next(count))
        (folder / "ledgers").mkdir(parents=True)
        (folder / "synthetic-ledgers").mkdir()
        return folder

    return fresh


@pytest.fixture(autouse=True)
def _own_dataset_ledger(_ledger_folders, monkeypatch):
    """$DPBERT_LEDGER: a fresh folder per test (inherited by the test's subprocesses)."""
    folder = _ledger_folders()
    monkeypatch.setenv("DPBERT_LEDGER", str(folder / "ledgers"))
    monkeypatch.setenv("DPBERT_SYNTHETIC_LEDGER", str(folder / "synthetic-ledgers"))


@pytest.fixture(scope="session")
def tiny_dag_run(tmp_path_factory):
    """``(output folder, CompletedProcess)`` of ``dpbert run`` with tests/e2e/tiny_dag.py ``TINY_DAG``, run once
    per session (per xdist worker: mark the tests ``xdist_group("tiny_dag")``). Not asserted here:
    the e2e tests assert it succeeded, the browser test falls back to a committed store."""
    from tests.e2e.tiny_dag import run_tiny_dag

    out = tmp_path_factory.mktemp("tiny_run")
    return out, run_tiny_dag(out)
