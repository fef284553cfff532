"""A tiny end-to-end run of the whole DAG on LocalDagRunner + Beam DirectRunner (in CI)."""
import os
import sqlite3
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = [
    "corpus.synthetic.patients=6",
    "vocab.size=300",
    "training.steps=4",
    "training.batch_size=8",
    "training.checkpoint_every=2",
    "model.max_seq_length=64",
    "beam.direct_num_workers=2",
]


def run_cli(args, cwd):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "dpbert.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_run")
    args = ["run", "--output", str(out)]
    for o in TINY:
        args += ["--set", o]
    result = run_cli(args, REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    return out, result


def test_dag_records_every_component_in_mlmd(tiny_run):
    out, result = tiny_run
    assert "ML Metadata store" in result.stdout
    db = sqlite3.connect(out / "metadata.sqlite")
    types = {name for (name,) in db.execute(
        "SELECT t.name FROM Artifact a JOIN Type t ON a.type_id = t.id")}
    assert "components.WordTuples" in types
    states = [s for (s,) in db.execute("SELECT last_known_state FROM Execution")]
    assert states and all(s in (3, 5) for s in states)  # COMPLETE or CACHED
