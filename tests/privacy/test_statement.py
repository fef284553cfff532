import pytest
import math

from dpbert.accounting import accountant
from dpbert.privacy import events, histogram
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


@pytest.mark.parametrize("sampling, adjacency, text", [
    ("poisson", "add_or_remove_one", "adding or removing one unit (add/remove adjacency)"),
    ("shuffle", "zero_out", "zero-out adjacency"),
])
def test_statement_names_the_adjacency_of_the_training_record(sampling, adjacency, text):
    from dpbert.accounting import accountant
    from dpbert.privacy import events, statement

    record = events.dpsgd_event(1.0, 10, 100, 20, sampling=sampling)
    ledger = accountant.ledger(None, [record], 1e-6)
    assert ledger["adjacency"] == adjacency == record["adjacency"]
    out = statement.ledger_statement({**ledger, "train_events": [record]})
    assert text in out
    if sampling == "shuffle":
        assert "does NOT cover adding or removing" in out and "adding or removing one unit (add" not in out


def test_public_vocabulary_is_stated_as_reading_no_private_data():
    public = dict(_ledger(), epsilon_vocab=0.0, delta_vocab=0.0)
    text = ledger_statement(public)
    assert "no private data read" in text and "Gaussian noise on per-tuple word counts" not in text
    assert "Gaussian noise on per-tuple word counts" in ledger_statement(_ledger())


def test_statement_reads_the_training_record_not_the_dp_count():
    """A run planned from a DP count writes [count record, DP-SGD record]; the statement prints the
    DP-SGD record's q and σ (not the count's "q = nan, noise multiplier 20.0"), the count apart, and
    keeps the patient note."""
    from dpbert.privacy import count

    counted = count.count_event(20.0, 682, unit="patient", max_contributions=4)
    train = events.dpsgd_event(2.0, 16, 682, 60, "poisson", 4, unit="patient")
    ledger = accountant.ledger(None, [counted, train], 1e-5)
    text = ledger_statement({**ledger, "train_events": [counted, train]})
    assert "q = nan" not in text and "noise multiplier 20.0, 60 optimizer" not in text
    assert f"q = {16 / 682:.4g}, σ 2, 60 optimizer steps" in text
    assert "user-level DP-SGD" in text and "ε_T is per patient" in text  # the patient note is kept
    assert "DP count of the training units (Gaussian, noise multiplier 20.0, released n̂ = 682" in text
    assert f"ε_T = {ledger['epsilon_train']:.4f}" in text and "(DP-SGD and the DP count)" in text
    # without a count: no count line
    assert "DP count" not in ledger_statement({**ledger, "train_events": [train]})


def test_statement_labels_the_effective_sigma_against_the_configured_one():
    """The ledger charges σ_eff (gradient + DP diagnostics): the statement labels it against the
    configured σ, rounded ("effective σ 0.776 (σ 0.8, ...)", not an unlabelled 0.7761140001162656)."""
    train = events.dpsgd_event(0.7761140001162656, 16, 1000, 60, "poisson", 4, unit="patient")
    ledger = accountant.ledger(None, [train], 1e-5)
    text = ledger_statement({**ledger, "train_events": [train], "noise_multiplier": 0.8})
    assert "effective σ 0.776 (σ 0.8, DP diagnostics included)" in text and "0.7761140001162656" not in text
    same = ledger_statement({**ledger, "train_events": [train], "noise_multiplier": 0.7761140001162656})
    assert "σ 0.776," in same and "effective" not in same and "DP diagnostics" not in same


#: A ledger as the statement reads it, with δ values that 3 significant digits would round down.
_EXACT_DELTAS = {"unit": "tuple", "adjacency": "add_or_remove_one", "epsilon_vocab": 0.4242, "delta_vocab": 1e-9,
                 "delta_threshold": 5e-10, "epsilon_train": 8.7, "epsilon_train_rdp": 9.1, "delta_train": 1.0001e-05,
                 "epsilon_total_basic": 9.2, "epsilon_total_rdp": 9.5, "epsilon_total_pld": 9.0882, "delta": 1.0001e-05,
                 "steps": 10, "train_events": [{"mechanism": "dp_sgd", "sampling": "poisson",
                                                "sampling_probability": 0.01, "noise_multiplier": 1.1}]}


def _delta_problems(text: str):
    """The statement's δ lines that do not show δ = 1.0001e-05 and δ_V = 1e-09 exactly."""
    found = []
    if "at δ_V = 1e-09 (of which the threshold's δ₂ = 5e-10)" not in text:
        found.append("δ_V")
    if "at δ_T = 1.0001e-05" not in text:
        found.append("δ_T")
    if text.count("at δ = 1.0001e-05") != 2 or "at δ = 1e-09 + 1.0001e-05" not in text:
        found.append("δ")
    if "1e-05" in text.replace("1.0001e-05", ""):
        found.append("a δ rounded down to 1e-05")
    return found


def test_statement_prints_delta_exactly_rounded_up():
    assert _delta_problems(ledger_statement(_EXACT_DELTAS)) == []


def test_statement_delta_check_positive_control(monkeypatch):
    """The check above catches a statement that prints δ to 3 significant digits."""
    from dpbert.privacy import statement

    monkeypatch.setattr(statement, "fmt_delta", lambda value: format(value, ".3g"))
    assert "a δ rounded down to 1e-05" in _delta_problems(ledger_statement(_EXACT_DELTAS))
