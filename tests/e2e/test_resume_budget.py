"""Issue 22, item 1: the budget holds across a resume. A run crashes after 2 of its 4 planned DP
steps, before its first checkpoint; the budget covers exactly the 4 planned steps. The re-run
would execute 4 more (6 in the chain): ``dpbert run`` refuses it (exit 3) before anything runs,
naming the steps already charged, and no step beyond the budget is ever executed. (On the main
before the fix the re-run trained 4 more steps and only the accountant refused, with exit 1.)"""
import json
import os
import sqlite3
import subprocess
import sys

import pytest

from dpbert import schema
from tests.tiny import CLASSIC, set_args

pytestmark = pytest.mark.e2e

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OVERRIDES = ["corpus.synthetic.patients=6", "vocab.sigma=2", "vocab.size=300", "training.steps=4",
             "training.batch_size=8", "training.checkpoint_every=100", "model.max_seq_length=64",
             "canary.enabled=false", "ner.enabled=false", "training.train_non_private_baseline=false",
             "membership.holdout_patient_fraction=0", "beam.direct_running_mode=in_memory"]


def _budget_of_the_plan() -> float:
    """Between the ε of the 4 planned steps and that of 5: covers the plan, not one step more."""
    import dataclasses

    from dpbert.config import load_config
    from pipeline import guard

    config = load_config(None, list(CLASSIC) + OVERRIDES + ["privacy.epsilon_budget=null"], preset="demo")
    four, five = (guard.planned(dataclasses.replace(config, training=dataclasses.replace(config.training, steps=s)))
                  ["epsilon_total_pld"] for s in (4, 5))
    assert five > four
    return (four + five) / 2


def _run(out, budget, crash_after=None):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("DPBERT_TEST_CRASH_AFTER_STEPS", None)
    if crash_after is not None:
        env["DPBERT_TEST_CRASH_AFTER_STEPS"] = str(crash_after)
    args = set_args(OVERRIDES + [f"privacy.epsilon_budget={budget!r}"])
    return subprocess.run([sys.executable, "-m", "dpbert_cli", "run", "--output", str(out), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def _ledger_steps(out):
    (path,) = (out / "pipeline_root" / "_trainer_state").glob(f"*/{schema.STEP_LOG_FILE}")
    return json.loads(path.read_text())["steps_executed"]


def _executions(out):
    return sqlite3.connect(out / "metadata.sqlite").execute("SELECT COUNT(*) FROM Execution").fetchone()[0]


@pytest.mark.slow  # make test-all; the in-process tests cover the same code (docs/development.md)
def test_a_resume_over_the_budget_is_refused_before_it_runs(tmp_path):
    out = tmp_path / "run"
    budget = _budget_of_the_plan()
    first = _run(out, budget, crash_after=2)
    assert first.returncode != 0 and "SimulatedCrash" in first.stderr
    assert _ledger_steps(out) == 2
    executions = _executions(out)

    second = _run(out, budget)
    assert second.returncode == 3, second.stderr[-2000:]
    assert "already executed 2 DP steps" in second.stderr and "Traceback" not in second.stderr
    assert _ledger_steps(out) == 2  # nothing trained
    assert _executions(out) == executions  # nothing ran: the guard refused before the DAG
