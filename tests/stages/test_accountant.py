"""dpbert.stages.accountant without TFX: the ledger from recorded events, the budget."""
import json

import pytest

from dpbert.config import PrivacyConfig
from dpbert.privacy import events, histogram
from dpbert.stages import accountant as stage

MODEL = {"sampling_mode": "poisson", "sampling_rate": 0.01, "noise_multiplier": 1.0, "steps_planned": 100}


def _events():
    vocab = events.histogram_event(histogram.histogram_report(10.0, 1e-6, 256, "correct", 1, unit="tuple"))
    train = [events.dpsgd_event(1.0, 64, 6400, 100, "poisson")]
    return vocab, train


def test_ledger_report_and_properties(tmp_path):
    from dpbert.accounting import accountant

    vocab, train = _events()
    result = stage.account(str(tmp_path), events.to_json(vocab), events.to_json(train), 1e-5,
                           PrivacyConfig(epsilon_budget=None), MODEL)
    expected = accountant.ledger(vocab, train, vocab["delta"] + 1e-5)
    props = result.properties
    assert result.failure is None and props["within_budget"] is True and "epsilon_budget" not in props
    for key in ("epsilon_vocab", "epsilon_train", "epsilon_total_pld"):
        assert props[key] == pytest.approx(expected[key])
    assert props["sampling_probability"] == 0.01 and props["statement"]
    report = events.from_json((tmp_path / stage.REPORT_FILE).read_text())
    assert report["steps_planned"] == 100 and report["vocab_event"] == json.loads(events.to_json(vocab))
    assert (tmp_path / stage.STATEMENT_FILE).read_text().strip() == props["statement"]
    # Decoded records (what dpbert.schema decodes a JSON property to) give the same ledger.
    again = stage.account(str(tmp_path / "again"), vocab, train, 1e-5, PrivacyConfig(), MODEL)
    assert again.properties == props


def test_over_budget_is_reported_then_refused(tmp_path):
    vocab, train = _events()
    result = stage.account(str(tmp_path), vocab, train, 1e-5, PrivacyConfig(epsilon_budget=0.01), MODEL)
    assert result.properties["within_budget"] is False and result.properties["epsilon_budget"] == 0.01
    assert (tmp_path / stage.REPORT_FILE).exists()
    with pytest.raises(stage.BudgetExceededError, match="exceeds privacy.epsilon_budget"):
        result.raise_failure()
