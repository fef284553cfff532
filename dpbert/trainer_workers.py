"""The trainer stage as a launched job: one process, or ``training.workers`` = W worker processes.

Every process runs the SAME stage code on the same artifact URIs, so the sharding by unit, the
plan and the state directory are derived identically in each; ``TF_CONFIG`` gives its rank (the
chief is rank 0; a single process without one is the chief). The chief runs
``dpbert.stages.pretrain.pretrain`` itself — lock, plan, DP count, training, the model artifact —
and writes the artifact's properties to ``Invocation.result_uri``. A worker of rank > 0 must
neither lock nor write the state directory: it runs ``dpbert.stages.pretrain.pretrain_worker`` —
the same rows, after the chief's records of this chain (its resume key, and its DP count when
there is no public n), trained in the chief's state directory with ``train_mlm`` (non-chief: no
lock, no writes; checkpoints restored from the chief's).

    python -m dpbert.trainer_workers '<Invocation JSON>'      (one process; TF_CONFIG set)

``train(inv, launcher)`` runs the invocation with a ``dpbert.launch`` launcher — in this process,
W local processes on loopback (``dpbert run``: the first to exit non-zero stops the others and
the stage fails with one line naming it and the last step the chief's step log charged), or the
replicas of a Vertex AI custom job — and returns the chief's result, or raises what it failed with.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import sys
import time
from typing import Optional

from dpbert import schema, storage

log = logging.getLogger("dpbert.trainer")

MODULE = "dpbert.trainer_workers"
#: How long a non-chief waits for the chief's records of the chain (it fails after that: a state
#: directory it cannot find is never trained in blind).
WAIT_FOR_CHIEF_S = 900.0


@dataclasses.dataclass
class Invocation:
    """What each worker process is given: the trainer's inputs (artifact URIs and configuration
    sections as the component got them) and where the chief writes its result."""

    tuples_dir: str
    vocabulary_dir: str
    model_dir: str
    model_config: str
    training_config: str
    privacy_config: str
    membership_config: str
    pipeline_root: str
    result_uri: str
    canaries_dir: Optional[str] = None
    non_private: bool = False
    vocab_event: Optional[str] = None
    #: The dataset ledger (``dpbert.ledger.LedgerTarget`` JSON): the chief reserves and finalizes.
    ledger_target: str = ""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Invocation":
        data = json.loads(text)
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown invocation field(s) {unknown}")
        return cls(**data)

    def sections(self):
        """(model, training as every process trains it, privacy, membership) configuration."""
        from dpbert.config import MembershipConfig, ModelConfig, PrivacyConfig, TrainingConfig, section_from_json
        from dpbert.engine.workers import process_config

        tc = process_config(section_from_json(TrainingConfig, self.training_config))
        if self.non_private:
            tc = dataclasses.replace(tc, non_private=True)
        return (section_from_json(ModelConfig, self.model_config), tc,
                section_from_json(PrivacyConfig, self.privacy_config),
                section_from_json(MembershipConfig, self.membership_config))

    @property
    def workers(self) -> int:
        return int(json.loads(self.training_config).get("workers", 1))


def stage_state_dir(inv: Invocation) -> str:
    """The chain ``dpbert.stages.pretrain.pretrain`` trains in for these inputs (the same key
    material). The chief checks it against the one ``pretrain`` returned (:func:`_run_chief`), and
    a non-chief trains only once the chief's resume key is there, so a drift fails, never trains
    elsewhere."""
    from dpbert.engine.charges import stage_state_dir as _stage_state_dir

    mc, tc, pc, membership = inv.sections()
    return _stage_state_dir(inv.pipeline_root, inv.tuples_dir, inv.vocabulary_dir, mc, tc, pc, membership,
                            inv.canaries_dir)


def _wait_for(uri: str, what: str, timeout: float = WAIT_FOR_CHIEF_S):
    deadline = time.monotonic() + timeout
    store = storage.storage_for(uri)
    while not store.exists(uri):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the chief wrote no {what} ({uri}) within {timeout:g} s")
        time.sleep(0.5)


def error_uri(inv: Invocation, rank: int) -> str:
    """Where rank ``rank`` records what it failed with: the chief in its result, the others beside it."""
    return inv.result_uri if rank == 0 else f"{inv.result_uri}.rank{rank}"


def _record_failure(inv: Invocation, rank: int, err: BaseException):
    storage.write_json(error_uri(inv, rank), {"error": {
        "type": f"{type(err).__module__}.{type(err).__qualname__}", "message": str(err)}})


def _run_chief(inv: Invocation):
    """``pretrain`` as the component calls it; the properties go to ``result_uri``. A failure is
    recorded there too (its type and message), so the supervisor raises what the chief raised."""
    from dpbert.stages.pretrain import PretrainInputs, PretrainOptions, pretrain

    mc, tc, pc, membership = inv.sections()
    try:
        result = pretrain(PretrainInputs(inv.tuples_dir, inv.vocabulary_dir, inv.canaries_dir, inv.vocab_event),
                          inv.model_dir, model_config=mc, training_config=tc, privacy_config=pc,
                          membership_config=membership, pipeline_root=inv.pipeline_root,
                          options=PretrainOptions(non_private=inv.non_private, ledger_target=inv.ledger_target))
        if result.state_dir != stage_state_dir(inv):
            raise RuntimeError(f"dpbert.trainer_workers.stage_state_dir is out of date: the stage trained in "
                               f"{result.state_dir}, the other workers looked for {stage_state_dir(inv)}")
    except BaseException as err:
        _record_failure(inv, 0, err)
        raise
    storage.write_json(inv.result_uri, {"properties": result.properties, "workers": result.train.workers,
                                        "state_dir": result.state_dir})


def _run_other(inv: Invocation):
    """A worker of rank > 0: ``pretrain_worker`` in the chief's chain, then wait for the chief."""
    from dpbert.stages.pretrain import pretrain_worker

    mc, tc, pc, membership = inv.sections()
    pretrain_worker(inv.tuples_dir, inv.vocabulary_dir, stage_state_dir(inv), model_config=mc, training_config=tc,
                    privacy_config=pc, membership_config=membership, canaries_dir=inv.canaries_dir, wait=_wait_for)
    # Stay in the cluster until the chief has finished (its result or error written): a worker
    # gone while the chief saves the model puts the chief's coordination agent in error.
    _wait_for(inv.result_uri, "result")


def run_worker(inv: Invocation) -> None:
    """One process of the cluster in ``$TF_CONFIG``: the strategy before TensorFlow runs any op
    (the stage reads its tuples with TensorFlow), then the chief's or another worker's part. A
    one-worker invocation without ``TF_CONFIG`` is the chief alone (no cluster)."""
    from dpbert.launch.cluster import tf_config_rank

    if not os.environ.get("TF_CONFIG"):
        if inv.workers == 1:
            _run_chief(inv)
            return
        raise ValueError("a trainer worker process needs its TF_CONFIG (the cluster and its rank)")
    from dpbert.engine.devices import multi_worker_strategy

    _, tc, _, _ = inv.sections()
    multi_worker_strategy(tc.replicas)  # configures the collectives; the stage builds its own on the same cluster
    rank = tf_config_rank(os.environ["TF_CONFIG"])
    if rank == 0:
        _run_chief(inv)
        return
    from dpbert.engine.loop import BudgetExhausted

    try:
        _run_other(inv)
    except BudgetExhausted:
        return  # the chief's refusal, recorded by the chief, is the run's verdict
    except BaseException as err:
        _record_failure(inv, rank, err)
        raise


# --------------------------------------------------------------------------- the supervising side
class TrainerWorkerLost(RuntimeError):
    """A worker process of the trainer stage failed; the others were stopped (one line)."""


def raise_recorded(result: Optional[dict]):
    """Re-raise what the chief recorded it failed with, when its type can be rebuilt from its
    message (the run's exit code depends on it: a budget refusal, an integrity check)."""
    error = (result or {}).get("error")
    if not error:
        return
    module, _, name = error["type"].rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        rebuilt = cls(error["message"])
    except Exception:  # pylint: disable=broad-except  (a type that takes other arguments)
        rebuilt = None
    if isinstance(rebuilt, Exception):
        raise rebuilt
    raise TrainerWorkerLost(f"the chief failed: {error['type']}: {error['message']}")


def lost_message(inv: Invocation, err) -> str:
    """One line: which worker, how it ended, the last step the chief's step log charged."""
    from dpbert.engine.chain import read_step_log

    state = stage_state_dir(inv)
    charged = (read_step_log(state) or {}).get("steps_executed")
    charged_text = "no step charged" if not charged else f"the step log charged {charged} step(s)"
    return (f"trainer {err}; {charged_text} ({storage.join(state, schema.STEP_LOG_FILE)}); the other workers "
            f"were stopped: re-run to resume from the last checkpoint (every executed step stays charged)")


def release_dead_lease(state: str, pid: int) -> bool:
    """Delete the chain's lease when its holder is process ``pid`` of this host, which the caller
    has stopped and reaped (a chief killed in a collective never ran its ``finally``): the re-run
    then resumes at once instead of waiting for the lease to expire. Matched on the lease's
    owner (``hostname:pid:…``) and its generation; True when deleted."""
    import socket

    uri = storage.join(state, schema.STATE_LOCK_FILE)
    store = storage.storage_for(uri)
    try:
        data, generation = store.read(uri)
        owner = str(json.loads(data.decode("utf-8")).get("owner", ""))
    except (FileNotFoundError, ValueError):
        return False
    if not owner.startswith(f"{socket.gethostname()}:{int(pid)}:"):
        return False
    try:
        store.delete(uri, if_generation_match=generation)
    except Exception:  # pylint: disable=broad-except  (taken over meanwhile: not ours to delete)
        return False
    log.warning("released the lease of the stopped chief (pid %d) on %s", pid, state)
    return True


def trainer_job(inv: Invocation):
    """The ``dpbert.launch.Job`` of ``inv``: this module in each of its workers (in process:
    :func:`run_in_process`), labelled by its result's name."""
    from dpbert.launch import Job

    return Job(MODULE, (inv.to_json(),), inv.workers, entry="run_in_process",
               name=os.path.basename(inv.result_uri).split(".")[0][:12])


def train(inv: Invocation, launcher) -> dict:
    """Run ``inv`` with ``launcher`` (``dpbert.launch``), return the chief's result (``{"properties",
    "workers", "state_dir"}``). Raises what the chief raised (in process: itself; elsewhere when it
    recorded it), else :class:`TrainerWorkerLost` naming the first local worker that failed, or
    the launcher's failure (a custom job's error)."""
    from dpbert.launch import LaunchFailed, WorkerFailed

    try:
        launcher.launch(trainer_job(inv))
    except WorkerFailed as err:
        _local_worker_lost(inv, err)
    except LaunchFailed:
        for rank in range(inv.workers):
            raise_recorded(storage.read_json(error_uri(inv, rank), default=None))
        raise
    result = storage.read_json(inv.result_uri)
    raise_recorded(result)
    return result


def _local_worker_lost(inv: Invocation, err):
    """A supervised local worker failed (the others stopped): release the stopped chief's lease,
    raise what the failed worker recorded, else :class:`TrainerWorkerLost`."""
    release_dead_lease(stage_state_dir(inv), err.pids[0])
    if err.rank is not None:
        raise_recorded(storage.read_json(error_uri(inv, err.rank), default=None))
    if err.stderr_tail:
        log.error("trainer worker %s's last output:\n%s", err.rank, err.stderr_tail)
    raise TrainerWorkerLost(lost_message(inv, err)) from None


def result_uri_for(pipeline_root: str) -> str:
    """A fresh place for one execution's result, in the trainers' private state root."""
    import uuid

    from dpbert.engine.chain import STATE_ROOT

    return storage.join(pipeline_root, STATE_ROOT, "_worker_results", f"{uuid.uuid4().hex}.json")


@dataclasses.dataclass(frozen=True)
class Sections:
    """The trainer's configuration sections (JSON, as the component got them)."""
    model: str
    training: str
    privacy: str
    membership: str


def invocation(tuples_dir: str, vocabulary_dir: str, model_dir: str, sections: Sections, *, pipeline_root: str,
               canaries_dir: Optional[str] = None, non_private: bool = False, vocab_event=None,
               ledger_target: str = "") -> Invocation:
    """What every worker process of the trainer component is given (its private state root marked)."""
    from dpbert.engine.chain import mark_state_root_private

    if isinstance(vocab_event, (dict, list)):
        vocab_event = json.dumps(vocab_event)
    mark_state_root_private(pipeline_root)
    return Invocation(tuples_dir, vocabulary_dir, model_dir, sections.model, sections.training, sections.privacy,
                      sections.membership, pipeline_root, result_uri_for(pipeline_root), canaries_dir,
                      bool(non_private), vocab_event, ledger_target)


def run_in_process(argv) -> int:
    """The in-process launcher's entry (``dpbert.launch.InProcessLauncher``): the invocation in
    ``argv[0]`` in this process, whose logging stays as it is."""
    run_worker(Invocation.from_json(argv[0]))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: python -m {MODULE} '<invocation JSON>'", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("dpbert.engine.train").setLevel(logging.INFO)
    run_worker(Invocation.from_json(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
