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
    assert {"components.WordTuples", "components.DPVocabulary", "components.PretrainedModel",
            "components.PrivacyReport"} <= types
    states = [s for (s,) in db.execute("SELECT last_known_state FROM Execution")]
    assert states and all(s in (3, 5) for s in states)  # COMPLETE or CACHED


def test_report_ledger_is_recomputed_from_recorded_events(tiny_run):
    """The report's ε equals what the accountant core gives for the recorded DP events."""
    import json

    from dpbert.privacy import accountant, events

    out, _ = tiny_run
    result = run_cli(["report", "--output", str(out), "--json"], REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    privacy = report["privacy"]
    assert report["pretraining"]["steps"] == 4
    assert report["vocab"]["size"] <= 300 and report["vocab"]["words_kept"] > 0
    vocab_event = json.loads(next((out / "pipeline_root" / "DPVocabularyGen" / "vocabulary").glob("*/dp_event.json")).read_text())
    train_events = json.loads(next((out / "pipeline_root" / "MLMPretrainer" / "model").glob("*/dp_events.json")).read_text())
    assert train_events[0]["steps"] == 4
    expected = accountant.ledger(events.from_json(json.dumps(vocab_event)), train_events,
                                 vocab_event["delta"] + 1e-5)
    for key in ("epsilon_vocab", "epsilon_train", "epsilon_total_basic", "epsilon_total_pld"):
        # ML Metadata's sqlite backend keeps about 7 significant digits of a double property.
        assert abs(privacy[key] - expected[key]) < 1e-6 * max(1.0, expected[key]), key
    assert privacy["epsilon_total_pld"] <= privacy["epsilon_total_basic"]
    assert privacy["unit"] == "tuple" and privacy["sampling"] == "poisson"


def test_no_exact_count_or_raw_text_in_the_vocabulary_artifact(tiny_run):
    """Released counts are noisy floats; the artifact holds no note text."""
    import json

    out, _ = tiny_run
    vocab_dir = next((out / "pipeline_root" / "DPVocabularyGen" / "vocabulary").glob("*"))
    counts = [json.loads(line)["count"] for line in (vocab_dir / "histogram.jsonl").read_text().splitlines()]
    assert counts and all(isinstance(c, float) and not float(c).is_integer() for c in counts)
    listing = " ".join(p.name for p in vocab_dir.iterdir())
    assert "tuples" not in listing
