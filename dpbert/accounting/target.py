"""What a stage needs to charge its dataset's ledger, and the calls the DP stages make.

``LedgerTarget`` (built from the configuration when the DAG is built, passed to the stages as
JSON): the dataset id, the ledger folder (None = resolved where the stage runs: ``privacy.ledger``
unset, ``$DPBERT_LEDGER`` or the per-user folder), the budget, the dataset δ of this configuration
(vocab δ_V + training.delta, as ``planned_ledger``) and the privacy unit. It names nothing private.

The vocabulary stage calls ``reserve_event`` before its Beam job reads the tuples and
``finalize_event`` after it wrote the vocabulary. The trainer stage calls ``reserve_training``
before it reads the tuples or draws its DP count and ``finalize_training`` with its write-ahead
step count when it stops (finished, refused or interrupted).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
from typing import Any, Dict, Iterable, List, Mapping, Optional

from dpbert.accounting import gate as _gate
from dpbert.accounting import reserve as _reserve
from dpbert.accounting.deltas import dataset_delta, threshold_delta  # noqa: F401 (part of the target's API)
from dpbert.config import Config
from dpbert.ledger import composition as _compose
from dpbert.ledger import dataset as _dataset
from dpbert.ledger import identity as _identity


@dataclasses.dataclass(frozen=True)
class LedgerTarget:
    dataset_id: str
    unit: str
    delta: float
    epsilon_budget: Optional[float] = None
    location: Optional[str] = None
    #: The vocabulary's configuration (a hash of public parameters): a re-run that TFX will answer
    #: from its cache is recognised by it (``pipeline.guard``), and a vocabulary and the training
    #: on it are one run by it (``dataset.one_planned_run``). Not the training's configuration: it
    #: is a parameter of the vocabulary component, and a new learning rate must not re-run it.
    vocab_key: Optional[str] = None
    #: What a first budgeted reservation pins (``dpbert.accounting.gate.Request``): the threshold δ₂
    #: of this configuration's histogram, the ledger records of its whole planned run (the committed
    #: order is the one that fits the most repetitions of it), and how many orders to commit.
    threshold_delta: float = 0.0
    first_plan: tuple = ()
    orders: int = 1

    def uri(self) -> str:
        return _identity.ledger_uri(self.location or _identity.default_location(), self.dataset_id)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text) -> Optional["LedgerTarget"]:
        """None for an empty parameter (no dataset identity: nothing is charged)."""
        if isinstance(text, (str, bytes)):
            text = text.strip()
            data = json.loads(text) if text else None
        else:
            data = text
        if not data:
            return None
        return cls(**{**data, "first_plan": tuple(data.get("first_plan") or ())})


def vocab_key(config: Config) -> str:
    """A hash of what decides the vocabulary's output (its sections and the corpus's settings)."""
    material = json.dumps([dataclasses.asdict(config.vocab), dataclasses.asdict(config.privacy),
                           dataclasses.asdict(config.corpus), config.model.init, config.model.init_dir],
                          sort_keys=True, default=str)
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:24]  # not 16: code versions are 16


def ledger_target(config: Config) -> Optional[LedgerTarget]:
    """The target of ``config``, or None when the corpus has no identity (a user corpus without
    ``corpus.dataset_id`` and without a budget: ``Config.validate`` requires one with a budget)."""
    dataset_id = _identity.dataset_id_for(config.corpus)
    if dataset_id is None:
        return None
    pins = config.privacy.epsilon_budget is not None
    return LedgerTarget(dataset_id=dataset_id, unit=config.privacy.unit, delta=dataset_delta(config),
                        epsilon_budget=config.privacy.epsilon_budget, location=config.privacy.ledger,
                        vocab_key=vocab_key(config), threshold_delta=threshold_delta(config),
                        first_plan=tuple(_first_plan(config)) if pins else ())


def _first_plan(config: Config) -> List[Dict[str, Any]]:
    """The ledger records of the whole planned run (no ε computed), or [] without a public n."""
    from dpbert.accounting.accountant import planned_records

    try:
        return [_compose.ledger_record(r) for r in planned_records(config)]
    except ValueError:
        return []


def ledger_target_json(config: Config, with_plan: bool = True) -> str:
    """The component parameter: ``LedgerTarget.to_json`` or ``""``. ``with_plan`` False (the
    vocabulary component): no ``first_plan`` — it holds the training's records, and a parameter
    that changes with the training would defeat TFX's cache of the vocabulary (a second histogram,
    charged again); a vocabulary that pins the budget commits the order best for its own event."""
    target = ledger_target(config)
    if target is not None and not with_plan:
        target = dataclasses.replace(target, first_plan=())
    return "" if target is None else target.to_json()


def run_of(output_uri: str) -> Dict[str, str]:
    """``{"pipeline_root", "run_id"}`` of a TFX output artifact URI
    (``<pipeline_root>/<node id>/<output key>/<execution id>``): the execution names the run."""
    uri = str(output_uri).rstrip("/")
    node = posixpath.basename(posixpath.dirname(posixpath.dirname(uri)))
    return {"pipeline_root": posixpath.dirname(posixpath.dirname(posixpath.dirname(uri))),
            "run_id": f"{node}/execution-{posixpath.basename(uri)}"}


def reserve_event(target: LedgerTarget, mechanism: str, records: Iterable, output_uri: str, *,
                  chain: Optional[str] = None, config_key: Optional[str] = None,
                  resume_key: Optional[str] = None) -> _reserve.Reservation:
    """``dataset.reserve`` for a stage writing ``output_uri`` (its run and pipeline root)."""
    where = run_of(output_uri)
    keys = _reserve.EntryKeys(where["run_id"], where["pipeline_root"], chain=chain, config_key=config_key,
                              resume_key=resume_key, plan_key=target.vocab_key)
    request = _gate.Request(target.epsilon_budget, target.delta, target.threshold_delta, tuple(target.first_plan),
                            target.orders)
    return _reserve.reserve(target.uri(), target.dataset_id, keys, mechanism, list(records), target.unit,
                            request=request)


def finalize_event(reservation: _reserve.Reservation, records: Iterable) -> Dict[str, Any]:
    return _reserve.finalize(reservation, list(records))


def reserve_training(target: LedgerTarget, model_uri: str, chain: str, resume_key: str,
                     planned_records: List[Mapping[str, Any]]) -> _reserve.Reservation:
    """Before the trainer reads the tuples (or draws its DP count): reserve the chain's cumulative
    charge once this run completes — ``planned_records`` = [count record,] DP-SGD record whose
    ``steps`` = steps the chain has executed + the steps this run will execute (``pipeline.guard``'s
    ``steps_after``). ``chain``: the trainer state folder (one entry per chain, replaced on a
    resume); ``resume_key``: ``dpbert.stages.pretrain.resume_key`` (the guard finds the entry by it).
    A non-private baseline's records are listed only. BudgetRefused when over the budget."""
    return reserve_event(target, "dp_sgd", planned_records, model_uri, chain=chain, resume_key=resume_key)


def finalize_training(reservation: _reserve.Reservation, steps_executed: int,
                      executed_records: Optional[List[Mapping[str, Any]]] = None) -> Dict[str, Any]:
    """When the trainer stops (finished, refused, interrupted, failed): the chain's executed steps
    (the write-ahead log's count, never less). Poisson: the planned records re-planned at
    ``steps_executed`` (a count record kept: it was drawn); shuffle: give ``executed_records``
    (the occurrences depend on the trained n, which the ledger does not hold)."""
    if executed_records is None:
        doc = _dataset.read_ledger(reservation.ledger_uri)
        entry = doc["entries"][reservation.entry_id]
        executed_records = []
        for record in entry["planned"]:
            if record.get("mechanism") == "dp_sgd":
                if steps_executed > 0:
                    executed_records.append(_compose.with_steps(record, steps_executed))
            else:
                executed_records.append(record)
    return _reserve.finalize(reservation, executed_records)


def reserve_vocabulary(ledger_target, record: Mapping[str, Any], vocabulary_dir: str):
    """The vocabulary stage, before its Beam job reads the tuples: reserve ``record`` (the DP
    histogram's, or a non-private one: listed). ``ledger_target``: a LedgerTarget, its JSON, or
    empty (no dataset identity: nothing charged, None returned)."""
    target = ledger_target if isinstance(ledger_target, LedgerTarget) else LedgerTarget.from_json(ledger_target or "")
    if target is None:
        return None
    return reserve_event(target, record["mechanism"], [record], vocabulary_dir, config_key=target.vocab_key)


def finalize_vocabulary(reservation, record: Mapping[str, Any]):
    """After the vocabulary is written: the histogram ran as reserved."""
    if reservation is not None:
        finalize_event(reservation, [record])
