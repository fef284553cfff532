"""The dataset's budget is pinned at its first reservation and only moves to committed levels; the
ledger is read fail-closed. The odometer is checked against the formula of docs/privacy.md,
computed here with dp-accounting directly (not with the ledger's code)."""
from __future__ import annotations

import json
import math

import dp_accounting
import pytest

from dpbert.accounting import gate, reserve
from dpbert.ledger import dataset, identity
from dpbert.privacy import events

DELTA = 1e-5


def _record(steps: int, sigma: float = 1.0):
    return events.dpsgd_event(sigma, 50, 1000, steps, "poisson")


def _reserve(uri, dataset_id, run, steps, budget):
    return reserve.reserve(uri, dataset_id, reserve.EntryKeys(run, f"/out/{run}"), "dp_sgd", [_record(steps)], "tuple",
                           request=gate.Request(budget, DELTA, first_plan=(_record(steps),)))


def _bytes(path):
    return path.read_bytes()


def test_another_budget_is_refused_until_raised_then_the_total_is_an_odometer(tmp_path, capsys):
    from dpbert_cli.main import main

    uri = identity.ledger_uri(str(tmp_path), "ward7")
    _reserve(uri, "ward7", "run-1", 20, 2.7)
    with pytest.raises(gate.BudgetRefused) as refused:
        _reserve(uri, "ward7", "run-2", 20, 2.7)  # the two runs compose over the pinned 2.7
    assert refused.value.verdict.reason == "over_budget"
    before = _bytes(tmp_path / "ward7.json")
    with pytest.raises(gate.BudgetRefused) as mismatch:  # the same run with the budget raised in its config
        _reserve(uri, "ward7", "run-2", 20, 12.14)
    assert mismatch.value.verdict.reason == "budget_mismatch" and "--raise-budget" in str(mismatch.value)
    assert _bytes(tmp_path / "ward7.json") == before
    assert main(["ledger", "--dataset", "Ward7", "--ledger", str(tmp_path), "--raise-budget", "3"]) == 0
    pin = json.loads((tmp_path / "ward7.json").read_text())["budget"]
    assert pin["level"] == 1 and pin["level_epsilon"] == pytest.approx(2.7 * math.sqrt(2))
    _reserve(uri, "ward7", "run-2", 20, pin["level_epsilon"])  # admitted at the raised level
    capsys.readouterr()
    assert main(["ledger", "--dataset", "ward7", "--ledger", str(tmp_path), "--json"]) == 0
    odometer = json.loads(capsys.readouterr().out)["totals"]["odometer"]
    assert odometer == pytest.approx(_odometer_by_hand(pin, [20, 20])) and odometer["level"] == 1


def _odometer_by_hand(pin, steps):
    """docs/privacy.md: the smallest level j whose filter covers Σρ(α*), ε_j = ε_B·2^(j/2), its bound
    ρ_B = ε_j − log(1 − 1/α) + log(δ^(j)·α)/(α − 1), δ^(0) = δ_c, δ^(j) = δ_c·6/(π²j²); δ = Σ_{i≤j} δ^(i) + pool."""
    (alpha,) = pin["orders"]
    rho = 0.0
    for t in steps:
        accountant = dp_accounting.rdp.RdpAccountant(orders=[alpha])
        accountant.compose(dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(50 / 1000, dp_accounting.GaussianDpEvent(1.0)), t))
        rho += accountant._rdp[0]  # noqa: SLF001
    delta_c = pin["delta_conversion"]

    def delta_level(j):
        return delta_c if j == 0 else delta_c * 6 / (math.pi ** 2 * j ** 2)

    for j in range(pin["level"] + 1):
        eps = pin["epsilon"] * 2 ** (j / 2)
        if rho <= eps - math.log1p(-1 / alpha) + math.log(delta_level(j) * alpha) / (alpha - 1):
            return {"level": j, "epsilon": eps,
                    "delta": sum(delta_level(i) for i in range(j + 1)) + pin["threshold_pool"]}
    raise AssertionError("no level covers the ledger")


@pytest.mark.parametrize("doc", [
    {"dataset_id": "ward7", "entries": {}},                                 # no schema key
    {"schema": "dpbert.ledger/9", "dataset_id": "ward7", "entries": {}},    # a newer writer
    {"schema": "something/1", "dataset_id": "ward7", "entries": {}},        # not ours
    {"schema": "dpbert.ledger/2", "dataset_id": "alpha", "entries": {}},    # alpha's ledger copied to ward7.json
])
def test_a_ledger_that_is_not_this_datasets_is_refused_and_never_replaced(tmp_path, capsys, doc):
    from dpbert_cli.main import main

    path = tmp_path / "ward7.json"
    path.write_text(json.dumps(doc))
    before = _bytes(path)
    with pytest.raises(dataset.LedgerInvalid, match="ward7.json"):
        _reserve(str(path), "ward7", "run-1", 10, None)  # even a budget-less run cannot replace it
    assert main(["ledger", "--dataset", "ward7", "--ledger", str(tmp_path)]) == 2
    assert "ward7.json" in capsys.readouterr().err
    assert _bytes(path) == before


def test_a_case_variant_of_an_id_is_the_same_ledger_and_each_rewrite_keeps_the_previous(tmp_path):
    first = _reserve(identity.ledger_uri(str(tmp_path), "Ward7"), "Ward7", "run-1", 10, None)
    _reserve(identity.ledger_uri(str(tmp_path), " ward7 "), " ward7 ", "run-2", 10, None)
    assert first.ledger_uri.endswith("/ward7.json") and sorted(p.name for p in tmp_path.glob("ward7*")) == [
        "ward7.json", "ward7.json.previous"]
    assert len(dataset.read_ledger(first.ledger_uri, "WARD7")["entries"]) == 2
    previous = json.loads((tmp_path / "ward7.json.previous").read_text())
    assert len(previous["entries"]) == 1  # the generation before the last rewrite
    assert identity.ledger_uri(str(tmp_path), "ward7-v2").endswith("/ward7-v2.json")  # another dataset
