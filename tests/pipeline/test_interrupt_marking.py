"""Issue 18: an interrupted run (SIGINT/SIGTERM) is marked cancelled in ML Metadata, and the
one line ``dpbert run`` prints says where it stopped. Fast: a synthetic store, no TFX run
(tests/e2e/test_interrupt.py interrupts a real one)."""
import json
import os
import signal
import time

import pytest

from dpbert import metadata
from dpbert.report import build_report, format_report
from tests.dashboard import fakestore


@pytest.fixture()
def running_store(tmp_path):
    """A store with a finished run and a newer run left as TFX leaves it on Ctrl-C: the
    trainer's execution RUNNING, no accountant."""
    path = str(tmp_path / "metadata.sqlite")
    b = fakestore._Builder(path, str(tmp_path / "root"))
    old = b.run("2026-01-01T00:00:00.000001")
    b.execute(old, "CorpusIngest", "COMPLETE")
    time.sleep(0.01)
    since_ms = int(time.time() * 1000)
    new = b.run("2026-01-02T00:00:00.000001")
    t = b.execute(new, "CorpusIngest", "COMPLETE", outputs=[
        ("tuples", "components.WordTuples", {"private": 1, "num_tuples": 12})])
    b.execute(new, "MLMPretrainer", "RUNNING", inputs=[("tuples", t["tuples"])])
    del b
    return path, since_ms


def test_mark_interrupted_cancels_the_running_execution_and_the_run(running_store):
    path, since_ms = running_store
    before = metadata.get_run(metadata.open_store(path))
    assert before.status == "RUNNING"  # what report and dashboard showed forever before issue 18

    marked = metadata.mark_interrupted(path, since_ms, step=16, checkpoint_step=12)
    assert marked == {"run_id": "2026-01-02T00:00:00.000001", "component": "MLMPretrainer"}

    runs = metadata.list_runs(metadata.open_store(path))
    new, old = runs
    assert new.status == metadata.CANCELLED and new.interrupted
    assert [c.state for c in new.components] == ["COMPLETE", "CANCELLED"]  # one spelling (issue 24)
    assert new.properties[metadata.INTERRUPTED_STEP] == 16
    assert old.status == "COMPLETE" and not old.interrupted  # an earlier run is untouched
    report = build_report(new)
    assert report["status"] == "CANCELLED"
    assert report["interrupted"] == {"component": "MLMPretrainer", "step": 16, "checkpoint_step": 12}
    text = format_report(report)
    assert "CANCELLED" in text and "CANCELED" not in text
    assert ("interrupted (SIGINT/SIGTERM) in MLMPretrainer at step 16; re-run the same command to resume from "
            "the checkpoint at step 12") in text


def test_interrupt_between_components_still_marks_the_run(tmp_path):
    path = str(tmp_path / "metadata.sqlite")
    b = fakestore._Builder(path, str(tmp_path / "root"))
    since_ms = int(time.time() * 1000) - 1
    run = b.run("r1")
    b.execute(run, "CorpusIngest", "COMPLETE")
    del b
    assert metadata.mark_interrupted(path, since_ms) == {"run_id": "r1", "component": None}
    run = metadata.get_run(metadata.open_store(path))
    assert run.status == "CANCELLED"
    # no checkpoint: no resume hint (issue 24), and no empty privacy / vocab / pretraining headings
    text = format_report(build_report(run))
    assert "no training checkpoint to resume from" in text and "re-run the same command" not in text
    assert "\nprivacy:" not in text and "\nvocab:" not in text and "\npretraining:" not in text


def test_nothing_to_mark_before_the_first_component(running_store, tmp_path):
    path, _ = running_store
    assert metadata.mark_interrupted(path, int(time.time() * 1000) + 60_000) is None
    assert metadata.get_run(metadata.open_store(path)).status == "RUNNING"
    assert metadata.mark_interrupted(str(tmp_path / "none.sqlite"), 0) is None


def test_trainer_progress_and_the_one_line(tmp_path):
    from pipeline.local_runner import RunInterrupted, state_snapshot, trainer_progress

    state = tmp_path / "_trainer_state" / "abc"
    (state / "checkpoints").mkdir(parents=True)
    before = state_snapshot(str(tmp_path))
    assert trainer_progress(str(tmp_path), before) is None
    (state / "dp_ledger.json").write_text(json.dumps({"steps_executed": 258}))
    (state / "checkpoints" / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-250"\nall_model_checkpoint_paths: "ckpt-248"\n')
    (state / "run_config.json").write_text(json.dumps({"non_private": False}))
    assert trainer_progress(str(tmp_path), before) == {"steps_executed": 258, "checkpoint_step": 250,
                                                      "non_private": False, "state": str(state)}
    assert trainer_progress(str(tmp_path), state_snapshot(str(tmp_path))) is None  # an earlier run's ledger

    line = RunInterrupted("r", "MLMPretrainer", step=258, checkpoint_step=250, charged=258).message()
    assert line == ("interrupted at step 258 (MLMPretrainer, last checkpoint at step 250); "
                    "re-run the same command to resume from the checkpoint at step 250; 258 steps charged")
    assert "\n" not in line
    assert RunInterrupted(None, None).message().startswith("interrupted before any component started;")
    # No checkpoint: no "re-run … to resume" (issue 24; fails on the previous main).
    assert RunInterrupted("r", "DPVocabularyGen").message() == (
        "interrupted in DPVocabularyGen; no training checkpoint to resume from; 0 training steps charged by this run")
    assert "resume from the" not in RunInterrupted("r", "MLMPretrainer", step=1, charged=1).message()
    assert "not accounted" in RunInterrupted("r", "MLMPretrainerNonPrivate", step=3, non_private=True).message()


def test_sigterm_raises_keyboard_interrupt_while_running_only():
    from pipeline.local_runner import _interrupt_on_sigterm

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with _interrupt_on_sigterm():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) == before
