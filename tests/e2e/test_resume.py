"""Resume after a failure mid-DAG: finished components are not re-executed (TFX cache keyed by
code versions) and the privacy ledger counts every DP step ever executed, once."""
import json
import os
import sqlite3
import subprocess
import sys

import pytest

from dpbert.accounting import accountant
from dpbert.privacy import events

pytestmark = pytest.mark.e2e

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.tiny import set_args

ARGS = set_args() + ["--set", "corpus.synthetic.patients=6", "--set", "vocab.sigma=2", "--set", "vocab.size=300",
        "--set", "training.steps=4", "--set", "training.batch_size=8", "--set", "training.checkpoint_every=2",
        "--set", "model.max_seq_length=64", "--set", "privacy.epsilon_budget=null",
        "--set", "canary.enabled=false", "--set", "ner.enabled=false",
        "--set", "training.train_non_private_baseline=false", "--set", "membership.holdout_patient_fraction=0",
        "--set", "beam.direct_running_mode=in_memory"]


def run(out, crash_after=None):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("DPBERT_TEST_CRASH_AFTER_STEPS", None)
    if crash_after is not None:
        env["DPBERT_TEST_CRASH_AFTER_STEPS"] = str(crash_after)
    return subprocess.run([sys.executable, "-m", "dpbert_cli", "run", "--output", str(out), *ARGS],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def executions(out):
    db = sqlite3.connect(out / "metadata.sqlite")
    rows = db.execute(
        "SELECT c.name, e.last_known_state FROM Execution e "
        "JOIN Association a ON a.execution_id = e.id JOIN Context c ON c.id = a.context_id "
        "JOIN Type t ON t.id = c.type_id WHERE t.name = 'node' ORDER BY e.id").fetchall()
    return [(name.split(".", 1)[1], state) for name, state in rows]


@pytest.mark.slow  # make test-all; the in-process tests cover the same code (docs/development.md)
def test_interrupted_run_resumes_without_recounting_or_resetting_the_ledger(tmp_path):
    out = tmp_path / "run"
    first = run(out, crash_after=3)  # checkpoint at step 2; step 3 runs, then the process "crashes"
    assert first.returncode != 0 and "SimulatedCrash" in first.stderr
    before = executions(out)
    assert ("CorpusIngest", 3) in before and ("DPVocabularyGen", 3) in before
    assert ("MLMPretrainer", 4) in before  # FAILED
    assert not any(name == "PrivacyAccountant" for name, _ in before)

    second = run(out)
    assert second.returncode == 0, second.stderr[-3000:]
    after = executions(out)[len(before):]
    states = dict(after)
    assert states["CorpusIngest"] == 5 and states["DPVocabularyGen"] == 5  # CACHED, not re-run
    assert states["MLMPretrainer"] == 3 and states["PrivacyAccountant"] == 3

    model_dir = next(p for p in (out / "pipeline_root" / "MLMPretrainer" / "model").iterdir()
                     if (p / "dp_events.json").exists())
    # The exact train result stays in the private state directory (one per configuration here).
    assert not (model_dir / "train_result.json").exists()
    state = next((out / "pipeline_root" / "_trainer_state").glob("*/train_result.json"))
    result = json.loads(state.read_text())
    # 3 steps executed before the crash (the 3rd was lost with the process) + 2 after resuming
    # from the step-2 checkpoint: 5 steps touched the private data, and the ledger charges 5.
    assert result["model_step"] == 4
    assert result["steps_taken_total"] == 5
    record = json.loads((model_dir / "dp_events.json").read_text())[0]
    assert record["steps"] == 5

    report_dir = next((out / "pipeline_root" / "PrivacyAccountant" / "report").iterdir())
    ledger = json.loads((report_dir / "privacy_report.json").read_text())
    expected = accountant.dpsgd_epsilon(record["noise_multiplier"], record["sampling_probability"], 5,
                                        ledger["delta_train"])
    assert ledger["steps"] == 5
    assert ledger["epsilon_train"] == pytest.approx(expected, rel=1e-9)

    # A third run is fully cached: nothing re-executes, the ledger is not charged again.
    third = run(out)
    assert third.returncode == 0
    assert all(state == 5 for _, state in executions(out)[len(before) + len(after):])
