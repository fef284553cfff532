import math

from dpbert.privacy import accountant, events, histogram
from dpbert.privacy.statement import ledger_statement


def _ledger():
    vocab = events.histogram_event(histogram.histogram_report(200.0, 1e-9, 256))
    train = events.dpsgd_event(1.1, 256, 60000, 1000)
    result = accountant.ledger(vocab, [train], 1e-9 + 1e-5)
    result["train_events"] = [train]
    return result


def test_statement_states_every_epsilon_with_its_delta():
    ledger = _ledger()
    text = ledger_statement(ledger)
    for key in ("epsilon_vocab", "epsilon_train", "epsilon_total_basic", "epsilon_total_pld"):
        assert f"{ledger[key]:.4f}" in text
    assert "1000 optimizer steps actually taken" in text and "poisson sampling" in text
    assert "δ₂" in text and "one N-word tuple" in text


def test_statement_flags_budget_and_non_private():
    ledger = _ledger()
    ledger.update({"epsilon_budget": 0.1, "within_budget": False})
    assert "OVER BUDGET" in ledger_statement(ledger)
    np_ledger = accountant.ledger(events.non_private_event("vocab"), [events.dpsgd_event(1.1, 256, 60000, 10)], 1e-5)
    assert math.isinf(np_ledger["epsilon_total_pld"])
    assert "non-private" in ledger_statement(np_ledger)
