"""The utility table's arithmetic (dpbert.evaluate.utility, issue 16): gain kept, its delta-method
uncertainty, the degenerate denominators, the paired bootstrap and the reference row."""
import math

import numpy as np
import pytest

from dpbert.evaluate import utility


def test_gain_kept_is_the_fraction_of_the_in_domain_gain():
    # the paper's i2b2 figures: public 76.3, non-private 86.8, DP 83.7 -> 70 % kept (higher is better)
    g = utility.gain_kept(76.3, 83.7, 86.8)
    assert g["value"] == pytest.approx((76.3 - 83.7) / (76.3 - 86.8)) and g["value"] == pytest.approx(0.7048, abs=1e-4)
    assert g["std"] == 0.0  # no standard errors given
    # lower is better (MLM loss): the same formula; DP halfway -> 0.5, DP = public -> 0, DP = non-private -> 1
    assert utility.gain_kept(6.0, 4.5, 3.0)["value"] == pytest.approx(0.5)
    assert utility.gain_kept(6.0, 6.0, 3.0)["value"] == 0.0
    assert utility.gain_kept(6.0, 3.0, 3.0)["value"] == 1.0
    # DP worse than the public start: negative
    assert utility.gain_kept(6.0, 7.0, 3.0)["value"] == pytest.approx(-1 / 3)


@pytest.mark.parametrize("reference, dp, non_private", [
    (5.0, 4.0, 5.0),            # no in-domain gain: denominator 0
    (5.0, 4.0, 5.0 + 1e-9),     # ~0
    (None, 4.0, 3.0), (5.0, None, 3.0), (5.0, 4.0, None),   # a row missing
    (float("nan"), 4.0, 3.0), (5.0, float("inf"), 3.0),     # not finite
    (True, 4.0, 3.0),           # not a number
])
def test_gain_kept_is_none_for_degenerate_denominators_and_missing_rows(reference, dp, non_private):
    g = utility.gain_kept(reference, dp, non_private)
    assert g["value"] is None and g["std"] is None and g["reason"] in (utility.MISSING, utility.NO_GAIN)


def test_gain_kept_tolerance_is_configurable():
    assert utility.gain_kept(0.50, 0.49, 0.48, tol=0.05)["value"] is None
    assert utility.gain_kept(0.50, 0.49, 0.48, tol=1e-6)["value"] == pytest.approx(0.5)


def test_gain_kept_is_na_when_the_non_private_gain_is_within_its_noise():
    """Issue 23's "gain kept, NER F1 98.31 ± 6408": public 0.448, non-private 0.4481 (± 0.01 over 3
    seeds), DP 0.435 — a ratio over a denominator within noise of 0 is n/a, not a number."""
    se = utility.standard_error(0.01, 3)
    g = utility.gain_kept(0.448, 0.435, 0.4481, se, se, se, lower_is_better=False)
    assert g == {"value": None, "std": None, "reason": utility.NOT_SIGNIFICANT}
    # the same rows with a clear non-private gain (> 2 standard errors of the difference): a value
    g = utility.gain_kept(0.448, 0.48, 0.52, se, se, se, lower_is_better=False)
    assert g["reason"] is None and g["value"] == pytest.approx((0.448 - 0.48) / (0.448 - 0.52))
    # the rule's edge: |b| = 2·sqrt(se_ref² + se_NP²) is n/a, a hair above is not
    b = 2 * math.sqrt(2) * se
    assert utility.gain_kept(0.4, 0.41, 0.4 + b, se, se, se, lower_is_better=False)["value"] is None
    assert utility.gain_kept(0.4, 0.41, 0.4 + b * 1.01, se, se, se, lower_is_better=False)["value"] is not None
    # a non-private row WORSE than the reference (loss up) keeps nothing either
    assert utility.gain_kept(6.0, 5.0, 6.5, lower_is_better=True)["reason"] == utility.NOT_BETTER
    assert utility.format_gain(None, None, utility.NOT_SIGNIFICANT) == "n/a (non-private gain not significant)"
    assert utility.format_gain(0.7048, 0.0123) == "0.7048 ± 0.0123"


def test_delta_method_std_matches_finite_differences_and_monte_carlo():
    r, d, n, se = 0.40, 0.47, 0.55, (0.01, 0.02, 0.015)
    g = utility.gain_kept(r, d, n, *se)
    f = lambda r, d, n: (r - d) / (r - n)  # noqa: E731
    h = 1e-6
    grads = [(f(r + h, d, n) - f(r - h, d, n)) / (2 * h), (f(r, d + h, n) - f(r, d - h, n)) / (2 * h),
             (f(r, d, n + h) - f(r, d, n - h)) / (2 * h)]
    assert g["std"] == pytest.approx(math.sqrt(sum((gr * s) ** 2 for gr, s in zip(grads, se))), rel=1e-5)
    rng = np.random.default_rng(0)
    samples = f(r + rng.normal(0, se[0], 200000), d + rng.normal(0, se[1], 200000), n + rng.normal(0, se[2], 200000))
    assert g["std"] == pytest.approx(np.std(samples), rel=0.1)


def test_standard_error_and_f1_summary():
    assert utility.standard_error(0.03, 9) == pytest.approx(0.01)
    assert utility.standard_error(0.03, 1) == 0.0 and utility.standard_error(None, 3) == 0.0
    s = utility.f1_summary([0.5, 0.6, 0.7])
    assert s["mean"] == pytest.approx(0.6) and s["std"] == pytest.approx(0.1)
    assert utility.f1_summary([0.5]) == {"mean": 0.5, "std": 0.0}
    assert utility.f1_summary([]) == {"mean": None, "std": None}


def test_bootstrap_std_is_zero_for_proportional_rows_and_positive_otherwise():
    counts = np.full(50, 10.0)
    ref = np.full(50, 60.0)
    assert utility.bootstrap_gain_std(ref, ref * 0.75, ref * 0.5, counts) == pytest.approx(0.0, abs=1e-12)
    rng = np.random.default_rng(1)
    noisy_dp = ref * 0.75 + rng.normal(0, 5, 50)
    std = utility.bootstrap_gain_std(ref, noisy_dp, ref * 0.5, counts)
    assert 0 < std < 0.2
    assert utility.bootstrap_gain_std(ref, noisy_dp, ref, counts) is None  # denominator always 0
    assert utility.bootstrap_gain_std(ref[:1], ref[:1], ref[:1], counts[:1]) is None


def _row(loss, acc, f1, std):
    return {"heldout_mlm_loss": loss, "heldout_mlm_accuracy": acc, "ner_f1_mean": f1, "ner_f1_std": std}


def test_utility_table_reference_is_public_else_random_and_gains_need_the_non_private_row():
    rows = {"random": _row(7.0, 0.02, 0.30, 0.02), "public": _row(6.0, 0.10, 0.60, 0.01),
            "dp": _row(4.5, 0.25, 0.63, 0.01), "non_private": _row(3.0, 0.40, 0.66, 0.01)}
    t = utility.utility_table(rows, seeds=3)
    assert list(t["rows"]) == ["random", "public", "dp", "non_private"] and t["reference"] == "public"
    assert set(t["rows"]["dp"]) == set(utility.COLUMNS)
    assert t["gain_kept_mlm_loss"] == pytest.approx(0.5) and t["gain_kept_ner_f1"] == pytest.approx(0.5)
    se = 0.01 / math.sqrt(3)
    assert t["gain_kept_ner_f1_std"] == pytest.approx(
        utility.gain_kept(0.60, 0.63, 0.66, se, se, se)["std"])
    assert t["gain_kept_mlm_loss_std"] is None  # no per-row sums given
    # model.init = random: no public row, the gains are measured from the random row
    no_public = {k: v for k, v in rows.items() if k != "public"}
    t = utility.utility_table(no_public, seeds=3)
    assert t["reference"] == "random" and not t["public_start"]
    assert t["gain_kept_mlm_loss"] == pytest.approx((7.0 - 4.5) / (7.0 - 3.0))
    # no baseline: no gains
    t = utility.utility_table({k: v for k, v in rows.items() if k != "non_private"}, seeds=3)
    assert t["gain_kept_mlm_loss"] is None and t["gain_kept_ner_f1"] is None and t["gain_kept_ner_f1_std"] is None
    assert t["gain_kept_ner_f1_reason"] == utility.MISSING
    # a non-private row as good as the public start: nothing to keep
    flat = dict(rows, non_private=_row(6.0, 0.10, 0.60, 0.01))
    t = utility.utility_table(flat, seeds=3)
    assert t["gain_kept_mlm_loss"] is None and t["gain_kept_ner_f1"] is None
    # NER F1 of the non-private row within 2 standard errors of the public row: n/a with its reason
    close = dict(rows, non_private=_row(3.0, 0.40, 0.61, 0.01))
    t = utility.utility_table(close, seeds=3, ner_task="bc5cdr", ner_mode="probe")
    assert t["gain_kept_ner_f1"] is None and t["gain_kept_ner_f1_reason"] == utility.NOT_SIGNIFICANT
    assert t["gain_kept_mlm_loss"] == pytest.approx(0.5) and (t["ner_task"], t["ner_mode"]) == ("bc5cdr", "probe")
    # the in-domain (synthetic) column has its own gain; absent columns are None
    assert t["rows"]["dp"]["ner_synthetic_f1_mean"] is None and t["gain_kept_ner_synthetic_f1_reason"] == utility.MISSING
    synth = {k: dict(v, ner_synthetic_f1_mean=f, ner_synthetic_f1_std=0.01)
             for (k, v), f in zip(rows.items(), (0.2, 0.30, 0.36, 0.42))}
    t = utility.utility_table(synth, seeds=3)
    assert t["gain_kept_ner_synthetic_f1"] == pytest.approx(0.5) and t["gain_kept_ner_synthetic_f1_reason"] is None


def test_utility_table_bootstraps_the_mlm_gain_over_paired_rows():
    rng = np.random.default_rng(2)
    counts = np.full(40, 8.0)
    sums = {"public": counts * 6 + rng.normal(0, 3, 40), "dp": counts * 4.5 + rng.normal(0, 3, 40),
            "non_private": counts * 3 + rng.normal(0, 3, 40)}
    rows = {k: _row(float(v.sum() / counts.sum()), 0.1, 0.5, 0.0) for k, v in sums.items()}
    mlm_rows = {k: {"row_loss_sum": v, "row_count": counts} for k, v in sums.items()}
    t = utility.utility_table(rows, seeds=3, mlm_rows=mlm_rows)
    assert 0 < t["gain_kept_mlm_loss_std"] < 0.1
    assert t["gain_kept_mlm_loss_std"] == utility.utility_table(rows, seeds=3, mlm_rows=mlm_rows)["gain_kept_mlm_loss_std"]
    # a non-private model no better than the public start on the held-out rows, but for noise: n/a
    sums["non_private"] = sums["public"] + rng.normal(0, 1, 40)
    rows = {k: _row(float(v.sum() / counts.sum()), 0.1, 0.5, 0.0) for k, v in sums.items()}
    mlm_rows = {k: {"row_loss_sum": v, "row_count": counts} for k, v in sums.items()}
    t = utility.utility_table(rows, seeds=3, mlm_rows=mlm_rows)
    assert t["gain_kept_mlm_loss"] is None and t["gain_kept_mlm_loss_reason"] in (utility.NOT_SIGNIFICANT,
                                                                                  utility.NOT_BETTER)
