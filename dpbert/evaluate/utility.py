"""The utility table of a run: how much of the in-domain pre-training gain the DP model
keeps. Plain Python and numpy (no TensorFlow).

Rows (those that ran): ``random`` (the architecture and vocabulary, random initialization),
``public`` (the public start the DP trainer starts from, no in-domain pre-training; absent when
``model.init = random``, where it IS the ``random`` row), ``dp`` (DP in-domain pre-training) and
``non_private`` (the non-private baseline). Columns: held-out MLM loss and accuracy, NER entity F1
mean ± std over fine-tuning seeds.

Gain kept (:func:`gain_kept`) = (m_ref − m_DP) / (m_ref − m_non_private), ``ref`` the public row
(the random one when there is no public start): 1 = DP kept all of the in-domain gain, 0 =
none, < 0 = worse than not pre-training in-domain. Its value is None, with a ``reason``, when a
row is missing, when the denominator is ~0 (|m_ref − m_non_private| ≤ ``tol``), and when the
non-private row does not beat the reference by more than its noise: a gain that is not there
cannot be "kept" (a ratio over a denominator within noise of 0 printed "98.31 ± 6408"). The rule:
n/a unless the non-private row is better (lower loss, higher F1) by more than
``Z_SIGNIFICANT`` · sqrt(se_ref² + se_NP²) (:data:`NOT_SIGNIFICANT`); with standard errors of 0
(one seed, no bootstrap) only the ``tol`` rule applies. The report prints ``n/a (<reason>)``.

Columns (``dpbert.schema.UTILITY_COLUMNS``): the primary NER task's F1 (``ner_f1_*``; the table's
``ner_task`` names it) and the in-domain synthetic task's (``ner_synthetic_f1_*``, None when not
evaluated), each with its own gain kept.

Uncertainty (``*_std`` next to each gain): first-order (delta-method) propagation of the standard
errors of the three metrics, assumed independent:
  Var(g) ≈ ((m_DP − m_NP)/b²)²·se_ref² + (1/b)²·se_DP² + (a/b²)²·se_NP²,  a = m_ref − m_DP, b = m_ref − m_NP.
For NER F1 each se is the F1's sample std over the fine-tuning seeds / √seeds. For the MLM loss
(deterministic given the held-out rows and masks) the uncertainty is the std of the gain over a
paired bootstrap of the held-out rows (:func:`bootstrap_gain_std`: the same resampled rows for
every model), and the significance of the non-private gain uses the bootstrap std of the paired
difference m_ref − m_NP (:func:`bootstrap_difference_std`).
"""
from __future__ import annotations

import math
from typing import Dict, Mapping, Optional, Sequence

import numpy as np

from dpbert import schema

ROWS = schema.UTILITY_ROWS
#: The columns of every row, in the report's contract.
COLUMNS = schema.UTILITY_COLUMNS
#: How the uncertainty of the gains is computed (shown in the report).
UNCERTAINTY = ("gain_kept_ner_*_std: delta method over the standard errors of the mean F1 (std over the "
               "NER seeds / sqrt(seeds)); gain_kept_mlm_loss_std: std over a paired bootstrap of "
               "the held-out rows; a gain is n/a unless the non-private row beats the reference by more "
               "than 2 standard errors of their difference")
DEFAULT_TOL = 1e-6
#: How many standard errors of (m_ref − m_NP) the non-private gain must exceed to be a gain.
Z_SIGNIFICANT = 2.0
#: The reasons of a gain kept without a value (the report prints ``n/a (<reason>)``).
MISSING = "a row is missing"
NO_GAIN = "no in-domain gain: the non-private row equals the reference"
NOT_SIGNIFICANT = "non-private gain not significant"
NOT_BETTER = "non-private row not better than the reference"


def _num(value) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def gain_kept(reference, dp, non_private, reference_se=0.0, dp_se=0.0, non_private_se=0.0,
              tol: float = DEFAULT_TOL, lower_is_better: Optional[bool] = None, difference_se=None,
              z: float = Z_SIGNIFICANT) -> Dict[str, object]:
    """``{"value", "std", "reason"}``: (reference − dp)/(reference − non_private) with the
    delta-method std from the three standard errors, reason None; or value and std None with the
    reason (module docstring): a metric missing or not finite (:data:`MISSING`),
    |reference − non_private| ≤ ``tol`` (:data:`NO_GAIN`), the non-private row worse than the
    reference (:data:`NOT_BETTER`; ``lower_is_better`` says which way is better, None: either) or
    better by no more than ``z`` standard errors of the difference (:data:`NOT_SIGNIFICANT`;
    ``difference_se``: that standard error when known, e.g. from a paired bootstrap, else
    sqrt(reference_se² + non_private_se²))."""
    r, d, n = _num(reference), _num(dp), _num(non_private)
    if r is None or d is None or n is None:
        return {"value": None, "std": None, "reason": MISSING}
    a, b = r - d, r - n
    if abs(b) <= tol:
        return {"value": None, "std": None, "reason": NO_GAIN}
    if lower_is_better is not None and (b > 0) != bool(lower_is_better):
        return {"value": None, "std": None, "reason": NOT_BETTER}
    ses = [_num(x) or 0.0 for x in (reference_se, dp_se, non_private_se)]
    se_b = _num(difference_se)
    if se_b is None:
        se_b = math.sqrt(ses[0] ** 2 + ses[2] ** 2)
    if abs(b) <= z * se_b:
        return {"value": None, "std": None, "reason": NOT_SIGNIFICANT}
    variance = ((d - n) / b ** 2) ** 2 * ses[0] ** 2 + (1 / b) ** 2 * ses[1] ** 2 + (a / b ** 2) ** 2 * ses[2] ** 2
    return {"value": a / b, "std": math.sqrt(variance), "reason": None}


def format_gain(value, std=None, reason=None, spec: str = ".4g") -> str:
    """A gain kept as the report and dashboard print it: ``value ± std``, or ``n/a (reason)``."""
    value = _num(value)
    if value is None:
        return f"n/a ({reason})" if reason else "n/a"
    std = _num(std)
    return format(value, spec) + ("" if std is None else f" ± {format(std, spec)}")


def standard_error(std, n) -> float:
    """std / √n (0 for n ≤ 1 or a missing std: one seed says nothing about the spread)."""
    std = _num(std)
    return 0.0 if std is None or not n or n <= 1 else std / math.sqrt(n)


def bootstrap_gain_std(reference_rows: Sequence[float], dp_rows: Sequence[float], non_private_rows: Sequence[float],
                       counts: Sequence[float], resamples: int = 200, seed: int = 0,
                       tol: float = DEFAULT_TOL) -> Optional[float]:
    """Std of the loss gain over a paired bootstrap of held-out rows: ``*_rows`` the per-row loss
    sums of each model (same rows, same masks), ``counts`` the masked positions per row. None
    when fewer than two resamples have a usable denominator."""
    ref, dp, npv = (np.asarray(x, np.float64) for x in (reference_rows, dp_rows, non_private_rows))
    counts = np.asarray(counts, np.float64)
    if not (len(ref) == len(dp) == len(npv) == len(counts)) or len(counts) < 2:
        return None
    rng = np.random.default_rng([int(seed), 0xB007])
    gains = []
    for _ in range(int(resamples)):
        idx = rng.integers(0, len(counts), len(counts))
        total = counts[idx].sum()
        if total <= 0:
            continue
        g = gain_kept(ref[idx].sum() / total, dp[idx].sum() / total, npv[idx].sum() / total, tol=tol)
        if g["value"] is not None:
            gains.append(g["value"])
    return float(np.std(gains, ddof=1)) if len(gains) >= 2 else None


def bootstrap_difference_std(reference_rows: Sequence[float], other_rows: Sequence[float], counts: Sequence[float],
                             resamples: int = 200, seed: int = 0) -> Optional[float]:
    """Std of the loss difference reference − other over a paired bootstrap of held-out rows (the
    same resamples as :func:`bootstrap_gain_std` for the same seed); None for fewer than 2 rows."""
    ref, other = np.asarray(reference_rows, np.float64), np.asarray(other_rows, np.float64)
    counts = np.asarray(counts, np.float64)
    if not (len(ref) == len(other) == len(counts)) or len(counts) < 2:
        return None
    rng = np.random.default_rng([int(seed), 0xB007])
    diffs = []
    for _ in range(int(resamples)):
        idx = rng.integers(0, len(counts), len(counts))
        total = counts[idx].sum()
        if total > 0:
            diffs.append((ref[idx].sum() - other[idx].sum()) / total)
    return float(np.std(diffs, ddof=1)) if len(diffs) >= 2 else None


def f1_summary(f1s: Sequence[float]) -> Dict[str, Optional[float]]:
    """Mean and sample std (ddof = 1; 0 for one seed) of the F1s of the fine-tuning seeds."""
    values = [float(f) for f in f1s]
    if not values:
        return {"mean": None, "std": None}
    return {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0}


def utility_table(rows: Mapping[str, Mapping[str, object]], seeds: int,
                  mlm_rows: Optional[Mapping[str, Mapping[str, Sequence[float]]]] = None,
                  bootstrap_seed: int = 0, tol: float = DEFAULT_TOL, ner_task: Optional[str] = None,
                  ner_mode: Optional[str] = None) -> Dict[str, object]:
    """The report's ``utility`` section from ``rows`` (name → the ``COLUMNS``; a column not
    given is None), ``seeds`` (the NER seeds behind each F1) and, for the MLM gain's bootstrap,
    ``mlm_rows`` (name → ``{"row_loss_sum", "row_count"}``). The reference of the gains is
    ``public`` when that row exists, else ``random``. ``ner_task`` names the primary NER column,
    ``ner_mode`` what its seeds are (probe | finetune)."""
    table = {name: {c: _num(rows[name].get(c)) for c in COLUMNS} for name in ROWS if name in rows}
    reference = "public" if "public" in table else ("random" if "random" in table else None)
    ref, dp, npv = (table.get(k) or {} for k in (reference, "dp", "non_private"))
    out: Dict[str, object] = {
        "rows": table,
        "reference": reference,
        "public_start": "public" in table,
        "ner_seeds": int(seeds),
        "ner_task": ner_task,
        "ner_mode": ner_mode,
    }
    for column, gain in (("ner_f1", "gain_kept_ner_f1"), ("ner_synthetic_f1", "gain_kept_ner_synthetic_f1")):
        mean, std = column + "_mean", column + "_std"
        g = gain_kept(ref.get(mean), dp.get(mean), npv.get(mean), standard_error(ref.get(std), seeds),
                      standard_error(dp.get(std), seeds), standard_error(npv.get(std), seeds), tol=tol,
                      lower_is_better=False)
        out.update({gain: g["value"], gain + "_std": g["std"], gain + "_reason": g["reason"]})
    paired = bool(mlm_rows) and all(k in mlm_rows for k in (reference, "dp", "non_private"))
    difference_se = bootstrap_difference_std(mlm_rows[reference]["row_loss_sum"],
                                             mlm_rows["non_private"]["row_loss_sum"],
                                             mlm_rows["dp"]["row_count"], seed=bootstrap_seed) if paired else None
    loss = gain_kept(ref.get("heldout_mlm_loss"), dp.get("heldout_mlm_loss"), npv.get("heldout_mlm_loss"), tol=tol,
                     lower_is_better=True, difference_se=difference_se)
    loss_std = None
    if loss["value"] is not None and paired:
        loss_std = bootstrap_gain_std(mlm_rows[reference]["row_loss_sum"], mlm_rows["dp"]["row_loss_sum"],
                                      mlm_rows["non_private"]["row_loss_sum"], mlm_rows["dp"]["row_count"],
                                      seed=bootstrap_seed, tol=tol)
    out.update({"gain_kept_mlm_loss": loss["value"], "gain_kept_mlm_loss_std": loss_std,
                "gain_kept_mlm_loss_reason": loss["reason"], "uncertainty": UNCERTAINTY})
    return out


__all__ = ["ROWS", "COLUMNS", "UNCERTAINTY", "Z_SIGNIFICANT", "MISSING", "NO_GAIN", "NOT_SIGNIFICANT", "NOT_BETTER",
           "gain_kept", "format_gain", "standard_error", "bootstrap_gain_std", "bootstrap_difference_std",
           "f1_summary", "utility_table"]
