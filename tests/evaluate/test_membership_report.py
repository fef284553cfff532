"""How the run report shows a MembershipReport (dpbert.report.membership_rows) and the dashboard
shows those rows."""
import math

import pytest

from dpbert import report as report_lib
from dashboard import views
from dpbert.evaluate import membership as mi


def test_membership_rows_one_per_model_and_attack_in_attack_order():
    attacks = {"non_dp": {"S-BBA": {"advantage": 0.3, "auc": 0.7}},
               "dp": {name: {"advantage": 0.01, "auc": 0.51} for name in sorted(mi.ATTACKS)}}
    curves = {"dp": {"S-BBA": {"fpr": [0, 1], "tpr": [0, 1]}}}
    ledger = {"epsilon_total_pld": 2.0, "delta": 1e-6, "unit": "tuple"}
    rows = report_lib.membership_rows(attacks, curves, ledger)
    assert [r["name"] for r in rows] == [f"{a} (DP)" for a in mi.ATTACKS] + ["S-BBA (non-DP)"]
    assert rows[0]["fpr"] == [0, 1] and rows[1]["fpr"] == []
    bound = (math.exp(2.0) - 1 + 2e-6) / (math.exp(2.0) + 1)
    assert rows[0]["advantage_bound"] == pytest.approx(bound)
    assert "advantage_bound" not in rows[2] and "advantage_bound" not in rows[-1]  # P-BBA, non-DP
    # Shapes the dashboard also accepts pass through unchanged.
    legacy = [{"name": "loss threshold", "auc": 0.53}]
    assert report_lib.membership_rows(legacy) is legacy


def test_membership_rows_feed_the_dashboard_view():
    rows = report_lib.membership_rows({"dp": {"S-BBA": {"advantage": 0.1, "auc": 0.6}}},
                                      {"dp": {"S-BBA": {"fpr": [0.0, 0.5, 1.0], "tpr": [0.0, 0.7, 1.0]}}})
    shown = views.membership_attacks({"membership_inference": rows})
    assert shown[0]["name"] == "S-BBA (DP)" and shown[0]["fpr"] == [0.0, 0.5, 1.0]
    assert dict(shown[0]["stats"])["auc"] == views.fmt(0.6)
