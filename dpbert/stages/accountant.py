"""PrivacyAccountant's stage: the run's ε ledger, at the end of the DAG.

It recomputes every ε from the DP events recorded on the vocabulary and model artifacts
(``dpbert.accounting.accountant.ledger``), never from numbers a component printed, and fails the
run (``failure``: :class:`BudgetExceededError`, after the report is written) when the total
exceeds ``privacy.epsilon_budget``.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Union

from dpbert import schema, storage
from dpbert.config import PrivacyConfig
from dpbert.privacy.composition import ledger_delta
from dpbert.stages.result import StageResult

log = logging.getLogger("dpbert.accountant")

REPORT_FILE = "privacy_report.json"
STATEMENT_FILE = "privacy_statement.txt"
#: The ledger fields stored as properties of the PrivacyReport (when not None).
LEDGER_PROPERTIES = (
    "epsilon_vocab", schema.EPSILON_TRAIN, "epsilon_train_rdp", "epsilon_total_basic", "epsilon_total_pld",
    "epsilon_total_rdp", "delta", "delta_vocab", schema.DELTA_TRAIN, "delta_threshold", "unit", "steps",
    "sampling", "sampling_probability", "noise_multiplier", "epsilon_budget", "within_budget",
    "non_private", "max_contributions", "adjacency", "dataset_epsilon_spent", "dataset_epsilon_rdp",
    "dataset_epsilon_pld", "dataset_delta", "dataset_epsilon_budget", "dataset_rule", "dataset_id", "dataset_ledger")
#: The model's properties copied into the ledger: ledger key -> model property.
_FROM_MODEL = {"sampling": "sampling_mode", "sampling_probability": "sampling_rate",
               "noise_multiplier": "noise_multiplier", "steps_planned": schema.STEPS_PLANNED}


class BudgetExceededError(RuntimeError):
    pass


def _records(value: Union[str, bytes, Any]):
    from dpbert.privacy import events

    return events.from_json(value) if isinstance(value, (str, bytes)) else value


def dataset_verdict(ledger_target: str):
    """(the budget gate's verdict over the dataset's whole ledger — this run's entries are in it:
    they were reserved before the mechanisms read the data —, the ledger's URI), or (None, None)
    without a dataset identity."""
    from dpbert.accounting import gate
    from dpbert.accounting.target import LedgerTarget
    from dpbert.ledger import dataset

    target = LedgerTarget.from_json(ledger_target) if ledger_target else None
    if target is None:
        return None, None
    doc = dataset.read_ledger(target.uri(), target.dataset_id)
    return gate.decide(doc, request=gate.request_for(target), pld=True), target.uri()


def _dataset_id_of(ledger_target: str):
    from dpbert.accounting.target import LedgerTarget

    target = LedgerTarget.from_json(ledger_target) if ledger_target else None
    return None if target is None else target.dataset_id


def account(report_dir: str, vocab_event, train_events, training_delta: float, privacy_config: PrivacyConfig,
            model_properties: Mapping[str, Any], ledger_target: str = "") -> StageResult:
    """Compose ε_V and ε_T (basic, RDP, PLD) at δ = δ_V + δ_T; write JSON + a statement.

    ``vocab_event`` / ``train_events``: the records on the DPVocabulary (``dp_event``) and the
    PretrainedModel (``dp_events``), as JSON text or decoded. ``model_properties``: the model's
    ``sampling_mode``, ``sampling_rate``, ``noise_multiplier`` and ``steps_planned``.
    """
    from dpbert.accounting import accountant, gate
    from dpbert.privacy import events, statement

    vocab_record, train_records = _records(vocab_event), _records(train_events)
    ledger = accountant.ledger(vocab_record, train_records, ledger_delta(vocab_record, training_delta))
    budget = privacy_config.epsilon_budget
    verdict, ledger_uri = dataset_verdict(ledger_target)
    if verdict is None:  # no dataset identity: no budget either (Config.validate), this run alone
        verdict = gate.alone_of_records(vocab_record, train_records, budget, ledger["delta"],
                                         ledger["delta_threshold"])
    ledger.update({
        "epsilon_budget": budget,
        "within_budget": verdict.admitted,
        **({} if verdict.rule == "no_budget" else {
            "dataset_epsilon_spent": verdict.spent, "dataset_epsilon_rdp": verdict.epsilon_rdp,
            "dataset_epsilon_pld": verdict.epsilon_pld, "dataset_delta": verdict.delta,
            "dataset_epsilon_budget": verdict.budget, "dataset_rule": verdict.rule}),
        # Where the dataset's ledger was read, budget or not (operator-only ML Metadata: the
        # component's own parameter names it too), so a reader elsewhere links to the right one.
        **({} if ledger_uri is None else {"dataset_id": _dataset_id_of(ledger_target), "dataset_ledger": ledger_uri}),
        **{key: model_properties.get(name) for key, name in _FROM_MODEL.items()},
        "vocab_event": vocab_record,
        "train_events": train_records,
    })
    text = statement.ledger_statement(ledger)
    storage.storage_for(report_dir).makedirs(report_dir)
    storage.write_text(storage.join(report_dir, REPORT_FILE), events.to_json(ledger, indent=2, sort_keys=True))
    storage.write_text(storage.join(report_dir, STATEMENT_FILE), text + "\n")
    log.info("accountant:\n%s", text)
    properties = {k: ledger[k] for k in LEDGER_PROPERTIES if ledger.get(k) is not None}
    properties["statement"] = text
    failure = None
    if not ledger["within_budget"]:
        failure = BudgetExceededError(
            f"the dataset's composed ε {verdict.spent:.4g} ({verdict.rule}) exceeds privacy.epsilon_budget = "
            f"{verdict.budget}: the run is refused (the report is at {report_dir})")
    return StageResult(properties=properties, failure=failure)
