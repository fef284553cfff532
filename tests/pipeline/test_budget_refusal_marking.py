"""Issue 22, item 1: a run whose trainer refused a step over the budget records the ε already
charged in ML Metadata; ``dpbert run`` exits 3 (``RunRefused``) and report and dashboard show it.
Fast: a synthetic store (tests/stages/test_pretrain_integrity.py refuses a real trainer)."""
import json
import os
import time

import pytest

from dpbert import metadata, schema
from dpbert.report import build_report, format_report
from pipeline import local_runner
from tests.dashboard import fakestore

REFUSAL = {"epsilon_charged": 2.5, "delta": 1.1e-5, "epsilon_train_charged": 2.4, "steps_charged": 64,
           "step_limit": 64, "epsilon_budget": 2.5, "train_events": []}


def test_a_refused_run_records_the_epsilon_charged(tmp_path):
    path = str(tmp_path / "metadata.sqlite")
    b = fakestore._Builder(path, str(tmp_path / "root"))
    since_ms = int(time.time() * 1000) - 1
    run = b.run("r1")
    b.execute(run, "CorpusIngest", "COMPLETE")
    b.execute(run, "MLMPretrainer", "FAILED")
    del b
    assert metadata.mark_charged(path, since_ms, REFUSAL, refused_budget=2.5) == "r1"
    report = build_report(metadata.get_run(metadata.open_store(path)))
    assert report["charged"] == {"epsilon_charged": 2.5, "delta": 1.1e-5, "steps_charged": 64,
                                 "budget_refused": True, "epsilon_budget": 2.5}
    text = format_report(report)
    assert "REFUSED over privacy.epsilon_budget = 2.5: ε = 2.5 (δ = 1.1e-05) already spent by 64" in text

    from dashboard.views import charged_view
    assert "already spent by 64 DP-SGD steps" in charged_view(report)


def test_the_runner_finds_the_refusal_of_this_run_only(tmp_path):
    root = tmp_path / "root"
    state = root / "_trainer_state" / "abc"
    state.mkdir(parents=True)
    before = local_runner.state_snapshot(str(root))
    (state / schema.BUDGET_REFUSAL_FILE).write_text(json.dumps(REFUSAL))
    assert local_runner.budget_refusal(str(root), before) == REFUSAL
    after = local_runner.state_snapshot(str(root))
    assert local_runner.budget_refusal(str(root), after) is None  # an older run's refusal


def test_the_runner_reads_a_refusal_and_the_newest_chain_on_object_storage():
    """The same detection on a ``fake://`` root (a gs:// stand-in: generations, no mtimes, no
    local files): the refusal this run wrote, and of two chains written the one written last."""
    import uuid

    from dpbert import storage
    from dpbert.storage import fake

    fake.reset()
    root = f"fake://bucket/{uuid.uuid4().hex}"
    old, new = (storage.join(root, "_trainer_state", name) for name in ("old", "new"))
    for chain in (old, new):
        storage.write_json(storage.join(chain, schema.STEP_LOG_FILE), {"steps_executed": 3})
        storage.write_json(storage.join(chain, "run_config.json"), {"non_private": False})
    before = local_runner.state_snapshot(root)
    assert local_runner.trainer_progress(root, before) is None
    storage.write_json(storage.join(new, schema.STEP_LOG_FILE), {"steps_executed": 5})
    storage.write_json(storage.join(old, schema.STEP_LOG_FILE), {"steps_executed": 4})
    assert local_runner.trainer_progress(root, before)["state"] == old  # written last
    storage.write_json(storage.join(new, schema.BUDGET_REFUSAL_FILE), REFUSAL)
    assert local_runner.budget_refusal(root, before) == REFUSAL
    assert local_runner.budget_refusal(root, local_runner.state_snapshot(root)) is None
    message = local_runner.RunRefused(REFUSAL).message()
    assert "covers 64 DP-SGD steps" in message and "ε = 2.5" in message and "already spent" in message


def test_privacy_verdicts_inside_the_dag_get_their_exit_codes():
    """The accountant over budget → 3; an audit refuting the accountant or a failed integrity check
    → 5, wherever TFX wraps them; anything else is not a verdict (its traceback stays)."""
    from dpbert import exit_codes
    from dpbert.privacy.one_run_audit import AuditInconsistencyError
    from dpbert.privacy.event_check import IntegrityCheckFailed
    from dpbert.stages.accountant import BudgetExceededError
    from dpbert_cli.commands import privacy_verdict

    def wrapped(err):
        try:
            try:
                raise err
            except Exception as inner:
                raise RuntimeError("component failed") from inner
        except RuntimeError as outer:
            return outer

    assert privacy_verdict(wrapped(BudgetExceededError("over")))[0] == exit_codes.OVER_BUDGET
    assert privacy_verdict(wrapped(AuditInconsistencyError("refuted")))[0] == exit_codes.AUDIT_FAILED
    code, verdict = privacy_verdict(wrapped(IntegrityCheckFailed("noise std off")))
    assert code == exit_codes.AUDIT_FAILED and str(verdict) == "noise std off"
    assert privacy_verdict(wrapped(ValueError("other"))) == (None, None)


def test_multi_worker_without_a_cluster_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """`dpbert run` starts no workers: multi_worker without $TF_CONFIG is an exit-2 line, no output."""
    from dpbert import exit_codes
    from dpbert_cli.main import main

    monkeypatch.delenv("TF_CONFIG", raising=False)
    out = tmp_path / "out"
    code = main(["run", "--output", str(out), "--set", "training.strategy=multi_worker",
                 "--set", "training.trainable=[all]", "--set", "vocab.source=dp", "--set", "model.init=random",
                 "--set", "model.public_layers=null", "--set", "model.public_warmup_steps=0"])
    assert code == exit_codes.BAD_INPUT and not out.exists()


def test_progress_lines_say_what_their_losses_are(caplog):
    """Issue 22 item 10: the non-private baseline's progress lines print exact losses and say
    so ("exact (private)"); a DP run's say "DP estimate" (they used to print both unlabelled)."""
    import io
    import logging

    from dpbert.engine.train import _Progress

    with caplog.at_level(logging.INFO, logger="dpbert.engine.train"):
        for label in ("exact (private)", "DP estimate"):
            bar = _Progress(10, 0, "SGD", interval=0.0, stream=io.StringIO(), label=label)
            bar.update(5, {"loss": 2.5, "accuracy": 0.5, "clipped_fraction": 0.0, "batch_size": 4.0})
            bar.close()
    lines = [r.getMessage() for r in caplog.records]
    assert any("(exact (private): mean of the last" in line for line in lines)
    assert any("(DP estimate: mean of the last" in line for line in lines)
