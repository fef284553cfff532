"""The training chain: one PRIVATE state directory that every run of a chain (first run, resumes
after a crash or preemption) trains in. Every read and write goes through ``dpbert.storage``, so
the directory may be local, ``gs://…`` or ``ram://…``::

    .lock               the lease lock (``storage.LeaseLock``): one run at a time
    dp_steps.json       the STEP LOG: DP steps EXECUTED in this chain, written BEFORE each step runs
    run_config.json     the privacy-relevant parameters; a resume with different ones is refused
    shuffle_key.json    the secret key of the shuffle stream (shuffle sampling only)
    checkpoints/        tf.train.CheckpointManager: model, optimizer (its step counter), dp_step;
                        steps_executed.json: the step log's count when each checkpoint was saved
    model/, saved_model/ (training.export_saved_model), tensorboard/, train_result.json,
    integrity_checks.json
    resume_key.json, charge_basis.json, dp_count.json, budget_refusal.json (the trainer stage)

Three ledgers, named apart: the chain's write-ahead count is the **step log**
(``schema.STEP_LOG_FILE``; a state directory written before it was named so keeps its
``schema.STEP_LOG_LEGACY_FILE``, read when present so it resumes); the accountant's ε composition
is the **privacy ledger** (``dpbert.accounting.accountant.ledger``); the per-dataset record is the
**dataset ledger** (``schema.DATASET_LEDGER_FILE``).

Step counting across crashes: the checkpoint holds the optimizer's ``iterations`` and ``dp_step``,
so a resumed run continues at the checkpoint's step and stops at the planned total. Steps executed
after the last checkpoint and lost in a crash were still computed on private data; the step log
counts them (``TrainResult.steps_taken_total``, what the accountant charges, is its count). The
step log is written by compare-and-swap and its count never decreases; the count at each
checkpoint is also kept beside it, and a resume refuses a step log that counts fewer steps than
the checkpoint it resumes from (:class:`StepLogBehind`: it lost an update).

The lock is a lease object, not ``flock``: it works on object stores, and a crashed holder's lease
expires after ``LOCK_TTL_S`` so the next run takes the chain over. Without it, two runs started
into one output would share one checkpoint directory and one step log (10 steps ran, 5 charged);
with it the second is refused (:class:`StateDirectoryBusy`) before it reads anything, so every
executed step is in the step log of the run that executed it. Only the CHIEF of a multi-worker run
locks and writes here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import re
import secrets
from pathlib import Path
from typing import List, Optional

from dpbert import schema, storage

log = logging.getLogger("dpbert.engine.train")

#: Where the trainer stage keeps its chains, under the pipeline root.
STATE_ROOT = "_trainer_state"
#: Marks the trainers' state root as operator-only: nothing under it is ever released.
PRIVATE_MARKER = "PRIVATE-operator-only.txt"
#: A crashed holder's lease expires after this; a live run renews it every third of it.
LOCK_TTL_S = 120.0
#: Files of the state directory copied into the model artifact (``train_result.json`` is NOT: it
#: holds the exact, un-noised training curves).
RECORD_FILES = (schema.STEP_LOG_FILE, schema.RUN_CONFIG_FILE)


class StateDirectoryBusy(RuntimeError):
    """Another training run holds the state directory (its checkpoints and step log)."""


def _norm(uri) -> str:
    """One spelling per directory, so a held lock is recognised whatever path form names it."""
    return str(uri).rstrip("/") if storage.is_remote(uri) else str(Path(uri).resolve())


class HeldStateLock:
    """What ``state_lock`` yields: proof that this caller holds a state directory's lease, passed
    on to ``train_mlm(held_lock=...)`` by a caller (the trainer stage) that locks before it plans."""

    def __init__(self, uri, lease: storage.LeaseLock):
        self.uri, self.lease = _norm(uri), lease

    @property
    def held(self) -> bool:
        return self.lease.held

    def check(self):
        """Raise ``storage.LockLost`` when the lease was taken over (it expired under us)."""
        self.lease.check()


@contextlib.contextmanager
def state_lock(uri, ttl_s: float = LOCK_TTL_S, clock=None):
    """Exclusive lease on a trainer state directory for the whole run, renewed in the background.
    Not re-entrant (a second ``state_lock`` of the same directory is refused even in this process):
    hand the held lock to ``train_mlm`` instead."""
    store = storage.storage_for(str(uri))
    store.makedirs(str(uri))
    kwargs = {} if clock is None else {"clock": clock}
    lease = storage.LeaseLock(storage.join(str(uri), schema.STATE_LOCK_FILE), ttl_s=ttl_s, **kwargs)
    try:
        lease.acquire()
    except storage.LockHeld:
        raise StateDirectoryBusy(
            f"another training run is using {uri} (its checkpoints and DP step log); wait for it to "
            f"finish, or train into another output directory") from None
    try:
        yield HeldStateLock(uri, lease.keep_alive())
    finally:
        lease.release()


# --------------------------------------------------------------------------- the step log
#: Beside the checkpoints: the step log's count when each checkpoint was saved (written just
#: before it), ``{"<checkpoint number>": steps executed}``; removed with the checkpoints.
CHECKPOINT_STEPS_FILE = "steps_executed.json"
#: Checkpoint records kept (the CheckpointManager keeps 3 checkpoints).
CHECKPOINT_RECORDS_KEPT = 5


class StepLogBehind(RuntimeError):
    """The chain's step log counts fewer DP steps than the checkpoint a run resumes from (its step,
    or the count recorded when it was saved): a lost update. The resume is refused (fail closed):
    charging the chain from that log would charge too few steps."""


class StepLogTakenOver(RuntimeError):
    """Another run wrote the chain's step log between two of this run's write-ahead entries (this
    run's lease was taken over): this run stops; its entry is kept (the count only grows)."""


class StepLog:
    """The write-ahead count of DP steps executed in a chain. The chief reads it (the step log, or
    a legacy ``dp_ledger.json``), refuses one that counts fewer steps than the checkpoint it
    resumes from (``start_step``, and ``checkpoint_executed``: the count recorded when that
    checkpoint was saved; :class:`StepLogBehind`), records the σ every step is charged at, and
    counts one more step BEFORE each step runs (:meth:`charge`); a non-chief only counts.

    Every write is a compare-and-swap (``storage.update_json``) whose new count is the stored
    count or this run's, whichever is larger, plus its step: the stored count never decreases,
    so a stale holder's write after a lease takeover cannot lower it. Each write carries this
    log's token and sequence number, so a write retried after a lost reply is applied once."""

    def __init__(self, state: Optional[str], start_step: int, accounted_sigma: Optional[float] = None,
                 checkpoint_executed: Optional[int] = None):
        # state None: a non-chief worker (the chief's step log is the record).
        self.state = state
        self.uri = None if state is None else storage.join(state, schema.STEP_LOG_FILE)
        if state is None:
            self.data = {"steps_executed": int(start_step)}
            return
        self.data = read_step_log(state) or {"steps_executed": 0}
        self.data.pop("writer", None)
        floor = max(int(start_step), int(checkpoint_executed or 0))
        if self.count < floor:
            raise StepLogBehind(
                f"{step_log_file(state) or self.uri}: the step log counts {self.count} DP steps executed, fewer than "
                f"the {floor} of the checkpoint this run would resume from (a lost update); refusing to resume: "
                f"this chain would be charged too few steps. Its checkpoints/{CHECKPOINT_STEPS_FILE} and the "
                f"checkpoint hold the larger count")
        if accounted_sigma is not None:
            # The σ every executed step is charged at (a resume with another σ is refused), so the
            # ε a chain has spent can be read off its state directory after any stop.
            self.data["noise_multiplier_accounted"] = float(accounted_sigma)
        self._token, self._sequence = secrets.token_hex(8), 0
        self._write(0)
        _drop_legacy(state)

    @property
    def count(self) -> int:
        return int(self.data["steps_executed"])

    def charge(self):
        """Count one more step, written before the step runs: a step that starts is charged."""
        if self.uri is None:
            self.data["steps_executed"] = self.count + 1
            return
        before = self.count
        stored = self._write(1)
        if stored > before:
            raise StepLogTakenOver(f"{self.uri}: another run wrote this chain's step log (this run's lease was "
                                   f"taken over); stopping. The step log keeps the larger count")

    def _write(self, steps: int) -> int:
        """Compare-and-swap: stored count ← max(stored, this log's) + ``steps``. Returns the count
        that was stored before (another writer's, if any)."""
        self._sequence += 1
        writer, seen = [self._token, self._sequence], []

        def update(stored):
            if stored.get("writer") == writer:  # this very write landed already (retried after a lost reply)
                return stored
            seen.append(int(stored.get("steps_executed", 0)))
            new = dict(stored, **self.data)
            new["steps_executed"] = max(seen[-1], self.count) + int(steps)
            new["writer"] = writer
            return new

        written = storage.update_json(self.uri, update)
        self.data = {k: v for k, v in written.items() if k != "writer"}
        return seen[-1] if seen else self.count - int(steps)

    def record_checkpoint(self, number: int):
        """Just before checkpoint ``number`` is saved: this log's count, kept beside the
        checkpoints (``CHECKPOINT_STEPS_FILE``), so a resume from it refuses a step log that counts
        fewer (a non-chief: nothing)."""
        if self.uri is None:
            return
        count = self.count

        def update(stored):
            stored[str(int(number))] = max(int(stored.get(str(int(number)), 0)), count)
            return {k: stored[k] for k in sorted(stored, key=int)[-CHECKPOINT_RECORDS_KEPT:]}

        storage.update_json(storage.join(self.state, schema.CHECKPOINTS_DIR, CHECKPOINT_STEPS_FILE), update)

    def read(self) -> dict:
        """The step log as stored (the chief's, without its writer tag), else this process's count."""
        if self.uri is None:
            return dict(self.data)
        return {k: v for k, v in storage.read_json(self.uri).items() if k != "writer"}


def checkpoint_executed(state: str) -> Optional[int]:
    """The step count recorded when the newest checkpoint was saved (:meth:`StepLog.record_checkpoint`);
    None without a checkpoint or without any record (a chain checkpointed before they were kept).
    A record file that lacks the newest checkpoint raises (fail closed)."""
    number = _checkpoint_step(state)
    if number == 0:
        return None
    uri = storage.join(state, schema.CHECKPOINTS_DIR, CHECKPOINT_STEPS_FILE)
    records = storage.read_json(uri, default=None)
    if records is None:
        return None
    if str(number) not in records:
        raise StepLogBehind(f"{uri}: no step count recorded for the newest checkpoint ({number}); refusing to "
                            f"resume without it")
    return int(records[str(number)])


def step_log_file(state: str) -> Optional[str]:
    """The URI of the chain's step log, or of its legacy ``dp_ledger.json``; None when neither exists."""
    for name in (schema.STEP_LOG_FILE, schema.STEP_LOG_LEGACY_FILE):
        uri = storage.join(state, name)
        if storage.storage_for(uri).exists(uri):
            return uri
    return None


def read_step_log(state: str) -> Optional[dict]:
    """The chain's step log (or its legacy file); None when neither exists."""
    uri = step_log_file(state)
    return None if uri is None else storage.read_json(uri, default=None)


def _drop_legacy(state: str):
    legacy = storage.join(state, schema.STEP_LOG_LEGACY_FILE)
    store = storage.storage_for(legacy)
    if store.exists(legacy):  # migrated into the step log just written
        store.delete(legacy)


# --------------------------------------------------------------------------- the chain
@dataclasses.dataclass
class TrainingChain:
    """The paths and records of one state directory; ``chief``: writes (rank 0) or only reads."""

    uri: str
    chief: bool = True

    def path(self, *parts: str) -> str:
        return storage.join(self.uri, *parts)

    @property
    def checkpoint_dir(self) -> str:
        return self.path(schema.CHECKPOINTS_DIR)

    @property
    def tensorboard_dir(self) -> str:
        return self.path(schema.TENSORBOARD_DIR)

    @property
    def model_dir(self) -> str:
        return self.path(schema.MODEL_DIR)

    @property
    def step_log_path(self) -> str:
        return self.path(schema.STEP_LOG_FILE)

    def prepare(self, run_config: dict, resume: bool):
        """Refuse a resume with other parameters (every worker); the chief first creates the
        directory and discards the chain when ``resume`` is False (its step count kept as
        history), then records ``run_config``."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        if self.chief:
            storage.storage_for(self.uri).makedirs(self.uri)
            if not resume:
                self.discard()
        previous = storage.read_json(self.path(schema.RUN_CONFIG_FILE), default=None)
        current = json.loads(json.dumps(run_config))
        if resume and previous is not None and tf.train.latest_checkpoint(self.checkpoint_dir) and previous != current:
            diff = sorted(k for k in set(current) | set(previous) if previous.get(k) != current.get(k))
            raise ValueError(f"cannot resume {self.uri}: parameters changed ({', '.join(diff)}); "
                             f"use a new output_dir or resume=False")
        self.write_json(schema.RUN_CONFIG_FILE, current)

    def discard(self):
        """A new chain in the same directory: checkpoints and shuffle stream gone, step count 0,
        earlier chains' counts kept under ``history``."""
        store = storage.storage_for(self.uri)
        old = read_step_log(self.uri)
        if old is None and not store.exists(self.checkpoint_dir):
            return
        log.warning("resume=False: discarding checkpoints in %s (previous chain executed %s DP steps)",
                    self.checkpoint_dir, (old or {}).get("steps_executed"))
        store.rmtree(self.checkpoint_dir)
        if store.exists(self.path(schema.SHUFFLE_KEY_FILE)):
            store.delete(self.path(schema.SHUFFLE_KEY_FILE))
        history = (old or {}).get("history", []) + ([{"steps_executed": old["steps_executed"]}] if old else [])
        # A new chain: its count starts at 0, the old one kept under history (compare-and-swap).
        storage.update_json(self.step_log_path, lambda _: {"steps_executed": 0, "history": history})
        _drop_legacy(self.uri)

    def shuffle_key(self, test_seed: Optional[int]) -> int:
        """The secret key of the shuffle stream, kept here so a resume continues its permutations
        (``sampling.ShuffleSampler``). Created once (``if_generation_match=0``)."""
        path = self.path(schema.SHUFFLE_KEY_FILE)
        stored = storage.read_json(path, default=None)
        if stored is not None:
            return int(stored["key"])
        key = secrets.randbits(63) if test_seed is None else int(test_seed)
        if self.chief:
            storage.write_json(path, {"key": key}, if_generation_match=0, private=True)
        return key

    def step_log(self, start_step: int, accounted_sigma: Optional[float]) -> StepLog:
        """The chain's step log (a resume from checkpoint ``start_step`` refuses one behind it)."""
        if not self.chief:
            return StepLog(None, start_step, accounted_sigma)
        return StepLog(self.uri, start_step, accounted_sigma, checkpoint_executed=self.checkpoint_executed())

    def checkpoint_executed(self) -> Optional[int]:
        return checkpoint_executed(self.uri)

    def write_json(self, name: str, data):
        if self.chief:
            storage.write_json(self.path(name), data)


# --------------------------------------------------------------------------- the trainer stage's chains
def state_dir(pipeline_root: str, key_material: str) -> str:
    """``<pipeline_root>/_trainer_state/<sha256(key_material)[:20]>``."""
    key = hashlib.sha256(key_material.encode()).hexdigest()[:20]
    return storage.join(pipeline_root, STATE_ROOT, key)


def write_resume_key(state: str, key: str, non_private: bool):
    storage.write_json(storage.join(state, schema.RESUME_KEY_FILE), {"key": key, "non_private": bool(non_private)})


def _checkpoint_step(state: str) -> int:
    """The newest checkpoint's step from tf.train.CheckpointManager's index (no TensorFlow)."""
    try:
        index = storage.read_text(storage.join(state, schema.CHECKPOINTS_DIR, "checkpoint"))
    except FileNotFoundError:
        return 0
    match = re.search(r'^model_checkpoint_path:\s*"[^"]*-(\d+)"', index, re.M)
    return int(match.group(1)) if match else 0


def chain_state(state: str) -> Optional[dict]:
    """What a trainer state directory has done, from its files alone (no TensorFlow):
    ``{"state", "key", "non_private", "steps_executed", "checkpoint_step", "step_log"}`` — the step
    log's count (every step ever started, lost ones included; never below the count recorded with
    the newest checkpoint), the step of the newest checkpoint
    (where a re-run resumes; 0 without one) and the step log's URI. None when ``state`` holds no
    step log."""
    log_uri = step_log_file(state)
    try:
        executed = int(storage.read_json(log_uri)["steps_executed"])
    except (OSError, KeyError, ValueError, TypeError, AttributeError):  # none (log_uri None), or unreadable
        return None
    try:  # never below the count recorded with the newest checkpoint (a step log that lost an update)
        executed = max(executed, checkpoint_executed(state) or 0)
    except (StepLogBehind, OSError, KeyError, ValueError, TypeError, AttributeError):
        pass
    try:
        stored = storage.read_json(storage.join(state, schema.RESUME_KEY_FILE), default=None) or {}
        key, non_private = stored.get("key"), (bool(stored["non_private"]) if "non_private" in stored else None)
    except (ValueError, AttributeError):
        key, non_private = None, None
    if non_private is None:
        try:
            config = storage.read_json(storage.join(state, schema.RUN_CONFIG_FILE), default=None) or {}
            non_private = bool(config.get("non_private"))
        except (ValueError, AttributeError):
            non_private = False
    return {"state": state, "key": key, "non_private": non_private, "steps_executed": executed,
            "checkpoint_step": _checkpoint_step(state), "step_log": log_uri}


def chains(pipeline_root: str) -> List[dict]:
    """:func:`chain_state` of every trainer state directory under ``pipeline_root``."""
    root = storage.join(pipeline_root, STATE_ROOT)
    store = storage.storage_for(root)
    if not store.isdir(root):
        return []
    found = (chain_state(storage.join(root, name)) for name in store.listdir(root)
             if store.isdir(storage.join(root, name)))
    return [c for c in found if c is not None]


def mark_state_root_private(pipeline_root: str):
    marker = storage.join(pipeline_root, STATE_ROOT, PRIVATE_MARKER)
    if not storage.storage_for(marker).exists(marker):
        storage.write_text(marker, (
            "Operator-only: trainer state computed on private data without noise (checkpoints, exact\n"
            "training curves, the write-ahead DP step log, sampling keys). Never release anything here;\n"
            "`dpbert release` writes the released set (dpbert/release.py).\n"))


def copy_artifact_files(state: str, vocabulary_dir: str, model_dir: str, *tokenizer_files: str):
    """The artifact holds a copy of the model and its records; the state directory keeps the step
    log for later resumes. The tokenizer files go to ``<model_dir>/tokenizer``."""
    copy_tree(storage.join(state, schema.MODEL_DIR), storage.join(model_dir, schema.MODEL_DIR))
    for name in RECORD_FILES:
        if storage.storage_for(state).exists(storage.join(state, name)):
            copy_file(storage.join(state, name), storage.join(model_dir, name))
    if storage.storage_for(state).isdir(storage.join(state, schema.TENSORBOARD_DIR)):
        copy_tree(storage.join(state, schema.TENSORBOARD_DIR), storage.join(model_dir, schema.TENSORBOARD_DIR))
    for name in tokenizer_files:
        copy_file(storage.join(vocabulary_dir, name), storage.join(model_dir, schema.TOKENIZER_DIR, name))


def copy_file(source: str, target: str):
    storage.storage_for(target).write_bytes(target, storage.storage_for(source).read_bytes(source))


def copy_tree(source: str, target: str):
    """Every file under ``source`` to the same relative path under ``target`` (merging), across
    backends (state on ``ram://`` or ``gs://``, the artifact elsewhere)."""
    store = storage.storage_for(source)
    if type(store) is type(storage.storage_for(target)):  # pylint: disable=unidiomatic-typecheck
        store.copytree(source, target)
        return
    for name in store.listdir(source):
        child = storage.join(source, name)
        if store.isdir(child):
            copy_tree(child, storage.join(target, name))
        else:
            copy_file(child, storage.join(target, name))
