"""The utility table of a run (issue 16): how much of the in-domain pre-training gain the DP model
keeps. Plain Python and numpy (no TensorFlow).

Rows (those that ran): ``random`` (the architecture and vocabulary, random initialization),
``public`` (the public start the DP trainer starts from, no in-domain pre-training; absent when
``model.init = random``, where it IS the ``random`` row), ``dp`` (DP in-domain pre-training) and
``non_private`` (the non-private baseline). Columns: held-out MLM loss and accuracy, NER entity F1
mean ± std over fine-tuning seeds.

Gain kept (:func:`gain_kept`) = (m_ref − m_DP) / (m_ref − m_non_private), ``ref`` the public row
(the random one when there is no public start): 1 = DP kept all of the in-domain gain, 0 =
none, < 0 = worse than not pre-training in-domain. It is None when a row is missing or the
denominator is ~0 (|m_ref − m_non_private| ≤ ``tol``): no in-domain gain to keep.

Uncertainty (``*_std`` next to each gain): first-order (delta-method) propagation of the standard
errors of the three metrics, assumed independent:
  Var(g) ≈ ((m_DP − m_NP)/b²)²·se_ref² + (1/b)²·se_DP² + (a/b²)²·se_NP²,  a = m_ref − m_DP, b = m_ref − m_NP.
For NER F1 each se is the F1's sample std over the fine-tuning seeds / √seeds. For the MLM loss
(deterministic given the held-out rows and masks) the uncertainty is the std of the gain over a
paired bootstrap of the held-out rows (:func:`bootstrap_gain_std`: the same resampled rows for
every model).
"""
from __future__ import annotations

import math
from typing import Dict, Mapping, Optional, Sequence

import numpy as np

ROWS = ("random", "public", "dp", "non_private")
#: The columns of every row, in the report's contract.
COLUMNS = ("heldout_mlm_loss", "heldout_mlm_accuracy", "ner_f1_mean", "ner_f1_std")
#: How the uncertainty of the gains is computed (shown in the report).
UNCERTAINTY = ("gain_kept_ner_f1_std: delta method over the standard errors of the mean F1 (std over the "
               "fine-tuning seeds / sqrt(seeds)); gain_kept_mlm_loss_std: std over a paired bootstrap of "
               "the held-out rows")
DEFAULT_TOL = 1e-6


def _num(value) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def gain_kept(reference, dp, non_private, reference_se=0.0, dp_se=0.0, non_private_se=0.0,
              tol: float = DEFAULT_TOL) -> Optional[Dict[str, float]]:
    """``{"value", "std"}`` of (reference − dp)/(reference − non_private) with the delta-method
    std from the three standard errors; None when a metric is missing or not finite, or when
    |reference − non_private| ≤ ``tol``."""
    r, d, n = _num(reference), _num(dp), _num(non_private)
    if r is None or d is None or n is None:
        return None
    a, b = r - d, r - n
    if abs(b) <= tol:
        return None
    ses = [_num(x) or 0.0 for x in (reference_se, dp_se, non_private_se)]
    variance = ((d - n) / b ** 2) ** 2 * ses[0] ** 2 + (1 / b) ** 2 * ses[1] ** 2 + (a / b ** 2) ** 2 * ses[2] ** 2
    return {"value": a / b, "std": math.sqrt(variance)}


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
        if g is not None:
            gains.append(g["value"])
    return float(np.std(gains, ddof=1)) if len(gains) >= 2 else None


def f1_summary(f1s: Sequence[float]) -> Dict[str, Optional[float]]:
    """Mean and sample std (ddof = 1; 0 for one seed) of the F1s of the fine-tuning seeds."""
    values = [float(f) for f in f1s]
    if not values:
        return {"mean": None, "std": None}
    return {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0}


def utility_table(rows: Mapping[str, Mapping[str, object]], seeds: int,
                  mlm_rows: Optional[Mapping[str, Mapping[str, Sequence[float]]]] = None,
                  bootstrap_seed: int = 0, tol: float = DEFAULT_TOL) -> Dict[str, object]:
    """The report's ``utility`` section from ``rows`` (name → the ``COLUMNS``), ``seeds`` (the
    fine-tuning seeds behind each F1) and, for the MLM gain's bootstrap, ``mlm_rows`` (name →
    ``{"row_loss_sum", "row_count"}``). The reference of the gains is ``public`` when that row
    exists, else ``random``."""
    table = {name: {c: _num(rows[name].get(c)) for c in COLUMNS} for name in ROWS if name in rows}
    reference = "public" if "public" in table else ("random" if "random" in table else None)
    ref, dp, npv = (table.get(k) or {} for k in (reference, "dp", "non_private"))
    f1 = gain_kept(ref.get("ner_f1_mean"), dp.get("ner_f1_mean"), npv.get("ner_f1_mean"),
                   standard_error(ref.get("ner_f1_std"), seeds), standard_error(dp.get("ner_f1_std"), seeds),
                   standard_error(npv.get("ner_f1_std"), seeds), tol=tol)
    loss = gain_kept(ref.get("heldout_mlm_loss"), dp.get("heldout_mlm_loss"), npv.get("heldout_mlm_loss"), tol=tol)
    loss_std = None
    if loss is not None and mlm_rows and all(k in mlm_rows for k in (reference, "dp", "non_private")):
        loss_std = bootstrap_gain_std(mlm_rows[reference]["row_loss_sum"], mlm_rows["dp"]["row_loss_sum"],
                                      mlm_rows["non_private"]["row_loss_sum"], mlm_rows["dp"]["row_count"],
                                      seed=bootstrap_seed, tol=tol)
    return {
        "rows": table,
        "reference": reference,
        "public_start": "public" in table,
        "ner_seeds": int(seeds),
        "gain_kept_mlm_loss": None if loss is None else loss["value"],
        "gain_kept_mlm_loss_std": loss_std,
        "gain_kept_ner_f1": None if f1 is None else f1["value"],
        "gain_kept_ner_f1_std": None if f1 is None else f1["std"],
        "uncertainty": UNCERTAINTY,
    }


__all__ = ["ROWS", "COLUMNS", "UNCERTAINTY", "gain_kept", "standard_error", "bootstrap_gain_std", "f1_summary",
           "utility_table"]
