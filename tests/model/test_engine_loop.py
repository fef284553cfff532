"""The training loop (``dpbert.engine.loop.TrainLoop``) and its hooks: the order of a step
(budget → write-ahead step-log entry → sampling → step → hooks), an in-process crash
(``CrashAfter``) and its resume on ``ram://`` and a local folder, and a probe hook that sees the
sampled units and the write-ahead entries."""
import uuid

import numpy as np
import pytest

from dpbert import schema, storage
from dpbert.engine import chain as chain_lib
from dpbert.engine.hooks import CrashAfter, Hook, SimulatedCrash
from dpbert.engine.loop import BudgetExhausted, TrainLoop

from .conftest import SPECIALS, repetitive_corpus, tiny_model


class _Source:
    def __init__(self):
        self.calls = []

    def rounds(self, step, window, local_replicas):
        self.calls.append((step, window))
        return [{"round": step}], np.array([step % 3])


class _Stepper:
    workers, local_replicas = 1, 1


class _Checks:
    """Stands in for ``integrity.RunChecks``: records the calls the loop makes."""

    def __init__(self, step_log):
        self.step_log, self.events = step_log, []

    def sampled(self, step, unit_indices):
        self.events.append(("sampled", step, int(self.step_log.count)))

    def launch(self, rounds, step):
        self.events.append(("step", step, int(self.step_log.count)))
        return step

    def read(self, launched):
        return [({}, ()) for _ in launched]

    def settle(self, launched, values):
        return values[0]


class _Observer(Hook):
    def __init__(self):
        self.seen = []

    def on_step(self, loop, step, rounds, stats, sampled):
        self.seen.append((step, loop.step_log.read()["steps_executed"], sampled.tolist()))


@pytest.fixture(params=["local", "ram", "fake"])
def state(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "state")
    if request.param == "fake":
        from dpbert.storage import fake

        fake.reset()
        return f"fake://bucket/{uuid.uuid4().hex}"
    return f"ram://loop-tests/{uuid.uuid4().hex}"


def _loop(state, hooks, steps=5, start=0, limit=None):
    step_log = chain_lib.StepLog(state, start, accounted_sigma=1.0)
    checks = _Checks(step_log)
    return TrainLoop(_Source(), _Stepper(), step_log, checks, hooks, start_step=start, steps_planned=steps,
                     step_limit=limit, accounted_sigma=1.0), checks


def test_each_step_is_charged_before_it_runs_and_hooks_see_the_entries(state):
    observer = _Observer()
    loop, checks = _loop(state, [observer])
    loop.run()
    # The write-ahead entry of step s is on storage before the step is sampled or run.
    assert [e for e in checks.events if e[0] == "step"] == [("step", s, s + 1) for s in range(5)]
    assert [e for e in checks.events if e[0] == "sampled"] == [("sampled", s, s + 1) for s in range(5)]
    assert observer.seen == [(s + 1, s + 1, [s % 3]) for s in range(5)]
    assert storage.read_json(storage.join(state, schema.STEP_LOG_FILE))["steps_executed"] == 5


def test_crash_after_k_steps_then_the_resume_counts_every_step(state):
    loop, _ = _loop(state, [CrashAfter(3)])
    with pytest.raises(SimulatedCrash):
        loop.run()
    assert chain_lib.read_step_log(state)["steps_executed"] == 3
    # Resumed from a checkpoint at step 2: steps 2–4 run again (step 2 twice), the log counts 6.
    again, _ = _loop(state, [], start=2)
    again.run()
    assert (again.steps_this_run, again.step_log.count) == (3, 6)
    # The shuffle windows of the replayed steps are NEW (the step log's count, not the step).
    assert again.source.calls == [(2, 3), (3, 4), (4, 5)]


def test_the_budget_refuses_before_the_write_ahead_entry(state):
    loop, checks = _loop(state, [], limit=2)
    with pytest.raises(BudgetExhausted) as refused:
        loop.run()
    assert (refused.value.steps_executed, refused.value.limit) == (2, 2)
    assert chain_lib.read_step_log(state)["steps_executed"] == 2 and len(checks.events) == 4


# local: in the slow tier (the stage tests resume chains in local folders)
@pytest.mark.parametrize("where", [pytest.param("local", marks=pytest.mark.slow), "ram"])
def test_train_mlm_crash_and_resume_in_a_chain_on_storage(tmp_path, where, eager_steps):
    """The real loop: a crash after 3 steps (checkpoint at 2), the resume finishes the plan, the
    step log charged every executed step; the chain's files are on that storage. (The smallest
    model's steps, eagerly: the chain is tested, not the step's trace.)"""
    from dpbert.config import TrainingConfig
    from dpbert.engine.train import load_models, train_mlm

    out = str(tmp_path / "state") if where == "local" else f"ram://train-tests/{uuid.uuid4().hex}"
    tc = TrainingConfig(batch_size=8, steps=5, warmup_steps=1, clip_norm=1.0, noise_multiplier=0.5,
                        checkpoint_every=2, noise_seed=3, integrity_check_every=0)
    model = tiny_model()
    observer = _Observer()

    def run(hooks):
        return train_mlm(repetitive_corpus(n=32), SPECIALS, 40, model, tc, out, progress=False,
                         export_saved_model=False, hooks=hooks)

    with pytest.raises(SimulatedCrash):
        run([observer, CrashAfter(3)])
    assert [(s, logged) for s, logged, _ in observer.seen] == [(1, 1), (2, 2), (3, 3)]
    assert chain_lib.chain_state(out)["checkpoint_step"] == 2
    result = run([])
    assert (result.resumed_from_step, result.steps_this_run, result.model_step, result.steps_taken_total) == \
        (2, 3, 5, 6)
    assert storage.read_json(storage.join(out, schema.TRAIN_RESULT_FILE))["steps_taken_total"] == 6
    assert result.observed["steps_executed"] == 6 and result.observed["steps_from"] == "ledger"
    assert storage.read_json(storage.join(out, "integrity_checks.json"))  # the private record, on that storage
    assert load_models(out).spec.vocab_size == 40
