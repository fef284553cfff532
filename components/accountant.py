"""PrivacyAccountant: the Evaluator at the end of the DAG that writes the run's ε ledger.

It recomputes every ε from the DP events recorded on the vocabulary and model artifacts
(``dpbert.privacy.accountant.ledger``), never from numbers a component printed, and refuses
(fails the run) when the total exceeds ``privacy.epsilon_budget``.
"""
import json
import logging
import os

from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component

from components.artifacts import DPVocabulary, PretrainedModel, PrivacyReport
from components.common import get_property, set_properties

log = logging.getLogger("dpbert.accountant")


class BudgetExceededError(RuntimeError):
    pass


@component
def PrivacyAccountant(
    vocabulary: InputArtifact[DPVocabulary],
    model: InputArtifact[PretrainedModel],
    report: OutputArtifact[PrivacyReport],
    training_delta: Parameter[float],
    code_version: Parameter[str],
    epsilon_budget: Parameter[float] = -1.0,
):
    """Compose ε_V and ε_T (basic, RDP, PLD) at δ = δ_V + δ_T; write JSON + a statement."""
    from dpbert.privacy import accountant, events, statement

    vocab_record = events.from_json(get_property(vocabulary, "dp_event"))
    train_records = events.from_json(get_property(model, "dp_events"))
    delta_vocab = vocab_record.get("delta", 0.0) if vocab_record.get("mechanism") == "dp_histogram" else 0.0
    ledger = accountant.ledger(vocab_record, train_records, delta_vocab + training_delta)
    budget = None if epsilon_budget is None or epsilon_budget < 0 else float(epsilon_budget)
    ledger.update({
        "epsilon_budget": budget,
        "within_budget": budget is None or ledger["epsilon_total_pld"] <= budget,
        "sampling": get_property(model, "sampling_mode"),
        "sampling_probability": get_property(model, "sampling_rate"),
        "noise_multiplier": get_property(model, "noise_multiplier"),
        "steps_planned": get_property(model, "steps_planned"),
        "vocab_event": vocab_record,
        "train_events": train_records,
    })
    text = statement.ledger_statement(ledger)
    os.makedirs(report.uri, exist_ok=True)
    with open(os.path.join(report.uri, "privacy_report.json"), "w", encoding="utf-8") as f:
        f.write(events.to_json(ledger, indent=2, sort_keys=True))
    with open(os.path.join(report.uri, "privacy_statement.txt"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    log.info("accountant:\n%s", text)
    set_properties(report, {k: ledger[k] for k in (
        "epsilon_vocab", "epsilon_train", "epsilon_train_rdp", "epsilon_total_basic", "epsilon_total_pld",
        "epsilon_total_rdp", "delta", "delta_vocab", "delta_train", "delta_threshold", "unit", "steps",
        "sampling", "sampling_probability", "noise_multiplier", "epsilon_budget", "within_budget",
        "non_private", "max_contributions") if ledger.get(k) is not None})
    set_properties(report, {"statement": text, "code_version": code_version})
    if not ledger["within_budget"]:
        raise BudgetExceededError(
            f"ε_total = {ledger['epsilon_total_pld']:.4g} exceeds privacy.epsilon_budget = {budget}: "
            f"the run is refused (the report is at {report.uri})")
