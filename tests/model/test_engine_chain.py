"""The training chain (``dpbert.engine.chain``) on every storage backend — a local folder,
``ram://`` (tf.io.gfile) and ``fake://`` (generations enforced like GCS): the lease lock (refusal,
expiry and takeover), the write-ahead step log (legacy file read and migrated), run_config on
resume, the shuffle key, discarding with history, and the chains the budget guard finds."""
import uuid

import pytest

from dpbert import schema, storage
from dpbert.engine import chain as chain_lib


@pytest.fixture(params=["local", "ram", "fake"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "root")
    if request.param == "fake":
        from dpbert.storage import fake

        fake.reset()
        return f"fake://bucket/{uuid.uuid4().hex}"
    return f"ram://chain-tests/{uuid.uuid4().hex}"


def test_a_held_chain_refuses_a_second_run_and_an_expired_lease_is_taken_over(root):
    state = storage.join(root, "state")
    now = [1000.0]
    with chain_lib.state_lock(state, ttl_s=60, clock=lambda: now[0]) as first:
        assert first.held
        with pytest.raises(chain_lib.StateDirectoryBusy, match="another training run is using"):
            with chain_lib.state_lock(state, ttl_s=60, clock=lambda: now[0]):
                pass
        # The first holder crashed (no renewal): once its lease has expired the next run takes over.
        now[0] += 61
        with chain_lib.state_lock(state, ttl_s=60, clock=lambda: now[0]) as second:
            assert second.held
            with pytest.raises(storage.LockLost):
                first.lease.renew()  # the crashed holder cannot come back and write
        assert not first.held
    # Released: the chain is free again.
    with chain_lib.state_lock(state, ttl_s=60):
        pass


def test_the_step_log_is_written_ahead_and_keeps_the_largest_count(root):
    state = storage.join(root, "state")
    log = chain_lib.StepLog(state, start_step=0, accounted_sigma=0.9)
    for expected in (1, 2, 3):
        log.charge()
        assert storage.read_json(storage.join(state, schema.STEP_LOG_FILE))["steps_executed"] == expected
    assert log.read() == {"steps_executed": 3, "noise_multiplier_accounted": 0.9}
    # A resume from a checkpoint at step 2 keeps the 3 steps executed (one of them lost).
    assert chain_lib.StepLog(state, start_step=2, accounted_sigma=0.9).count == 3
    # A non-chief counts in memory and writes nothing.
    other = chain_lib.StepLog(None, start_step=2)
    other.charge()
    assert other.count == 3 and storage.read_json(storage.join(state, schema.STEP_LOG_FILE))["steps_executed"] == 3


def test_a_legacy_step_log_is_read_then_migrated(root):
    state = storage.join(root, "old")
    storage.write_json(storage.join(state, schema.STEP_LOG_LEGACY_FILE), {"steps_executed": 7})
    found = chain_lib.chain_state(state)
    assert found["steps_executed"] == 7 and found["step_log"].endswith(schema.STEP_LOG_LEGACY_FILE)
    assert [c["state"] for c in chain_lib.chains(root)] == []  # not under _trainer_state
    log = chain_lib.StepLog(state, start_step=0)
    assert log.count == 7
    log.charge()
    store = storage.storage_for(state)
    assert not store.exists(storage.join(state, schema.STEP_LOG_LEGACY_FILE))
    assert chain_lib.chain_state(state)["steps_executed"] == 8


def test_prepare_refuses_a_changed_resume_and_discard_keeps_history(root, monkeypatch):
    import tensorflow as tf

    state = storage.join(root, "state")
    chain = chain_lib.TrainingChain(state)
    chain.prepare({"q": 0.25, "noise_multiplier": 1.0}, resume=True)
    assert storage.read_json(chain.path(schema.RUN_CONFIG_FILE)) == {"q": 0.25, "noise_multiplier": 1.0}
    chain_lib.StepLog(state, 0).charge()
    key = chain.shuffle_key(None)
    assert chain.shuffle_key(None) == key  # kept: a resume continues the stream
    # With a checkpoint present, other privacy parameters are refused.
    monkeypatch.setattr(tf.train, "latest_checkpoint", lambda directory: directory + "/ckpt-1")
    with pytest.raises(ValueError, match="noise_multiplier"):
        chain.prepare({"q": 0.25, "noise_multiplier": 2.0}, resume=True)
    # resume=False: a new chain in the same directory; the earlier count kept as history.
    chain.prepare({"q": 0.25, "noise_multiplier": 2.0}, resume=False)
    assert chain_lib.read_step_log(state) == {"steps_executed": 0, "history": [{"steps_executed": 1}]}
    assert not storage.storage_for(state).exists(chain.path(schema.SHUFFLE_KEY_FILE))  # a new chain, a new stream


def test_chains_and_charge_basis_under_the_state_root(root):
    from dpbert.config import TrainingConfig
    from dpbert.engine import charges
    from dpbert.privacy.plan import plan_training

    state = chain_lib.state_dir(root, "inputs")
    assert state.startswith(storage.join(root, chain_lib.STATE_ROOT))
    chain_lib.mark_state_root_private(root)  # a file beside the chains: not a chain
    chain_lib.write_resume_key(state, "abc", False)
    assert chain_lib.chains(root) == []  # no step log yet
    tc = TrainingConfig(batch_size=4, steps=3, noise_multiplier=1.0)
    plan = plan_training(tc, 40)
    charges.write_charge_basis(state, None, None, plan, 40, tc)
    log = chain_lib.StepLog(state, 0, accounted_sigma=1.0)
    log.charge()
    log.charge()
    (found,) = chain_lib.chains(root)
    assert (found["key"], found["steps_executed"], found["checkpoint_step"], found["non_private"]) == ("abc", 2, 0, False)
    charged = charges.chain_charged(state)
    assert charged["steps_charged"] == 2
    ledger = charges.charged_ledger(None, None, 1.0, plan, 40, 2, tc.delta)
    assert charged["epsilon_charged"] == pytest.approx(ledger["epsilon_total_pld"])


def _checkpoint_index(state, number):
    """What tf.train.CheckpointManager's index says after saving checkpoint ``number``."""
    storage.write_text(storage.join(state, schema.CHECKPOINTS_DIR, "checkpoint"),
                       f'model_checkpoint_path: "ckpt-{number}"\n')


def test_a_stale_holder_cannot_lower_the_step_log_and_stops(root):
    """Compare-and-swap: a holder whose lease was taken over writes after the new holder; the count
    never decreases and the stale holder stops. Positive control: the plain write lowers it."""
    from . import broken_mechanisms as broken

    state = storage.join(root, "state")
    for cls, lowered in ((chain_lib.StepLog, False), (broken.PlainWriteStepLog, True)):
        stale = cls(state, start_step=0, accounted_sigma=1.0)
        stale.charge()
        start = stale.count
        taker = chain_lib.StepLog(state, start_step=0, accounted_sigma=1.0)  # the lease was taken over
        for _ in range(3):
            taker.charge()
        if lowered:
            stale.charge()  # its stale count + 1 replaces the taker's
            assert chain_lib.read_step_log(state)["steps_executed"] == start + 1 < taker.count
        else:
            with pytest.raises(chain_lib.StepLogTakenOver, match="another run wrote"):
                stale.charge()
            assert chain_lib.read_step_log(state)["steps_executed"] == taker.count + 1  # kept, and charged
            assert "writer" not in taker.read()


def test_a_resume_refuses_a_step_log_behind_its_checkpoint(root):
    """The count recorded with the checkpoint (or its step) above the step log's: refused.
    Positive control: a step log that lost one write-ahead update before the checkpoint."""
    from . import broken_mechanisms as broken

    state = storage.join(root, "state")
    chain = chain_lib.TrainingChain(state)
    for cls, behind in ((chain_lib.StepLog, False), (broken.LostUpdateStepLog, True)):
        chain.discard()
        log = cls(state, start_step=0, accounted_sigma=1.0)
        for _ in range(3):
            log.charge()
        log.record_checkpoint(2)  # a checkpoint at step 2 after 3 steps were executed (a resumed chain)
        _checkpoint_index(state, 2)
        assert chain.checkpoint_executed() == 3
        if behind:  # its third (last) update was lost: the file says 2, the checkpoint 3
            assert chain_lib.read_step_log(state)["steps_executed"] == 2
            assert chain_lib.chain_state(state)["steps_executed"] == 3  # what the chain is charged: never less
            with pytest.raises(chain_lib.StepLogBehind, match="refusing to resume"):
                chain.step_log(2, 1.0)
        else:
            assert chain.step_log(2, 1.0).count == 3
    # The checkpoint's own step above the step log's count: refused too (it used to be raised silently).
    chain.discard()
    with pytest.raises(chain_lib.StepLogBehind, match="counts 0 DP steps"):
        chain_lib.StepLog(state, start_step=2)
    # A record file without the newest checkpoint: refused (fail closed).
    log = chain_lib.StepLog(state, start_step=0)
    log.charge()
    log.record_checkpoint(1)
    _checkpoint_index(state, 5)
    with pytest.raises(chain_lib.StepLogBehind, match="no step count recorded"):
        chain.step_log(0, None)
