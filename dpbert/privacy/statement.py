"""A readable privacy statement for a ledger (in the spirit of tensorflow-privacy's
``compute_dp_sgd_privacy_statement``), stating δ and its split next to every ε. A δ is printed
exactly enough and rounded up (``numbers.fmt_delta``): a true 1.0001e-05 never reads 1e-05."""
from __future__ import annotations

import math
from typing import Any, Mapping

from dpbert.privacy.numbers import fmt_delta

ADJACENCY_TEXT = {
    "add_or_remove_one": "neighbouring datasets differ by adding or removing one unit "
                         "(add/remove adjacency).",
    "zero_out": "neighbouring datasets differ by replacing one unit with a null unit that contributes "
                "nothing (zero-out adjacency: shuffled batches; this does NOT cover adding or removing "
                "a unit).",
}


def _eps(x) -> str:
    if x is None:
        return "-"
    return "∞ (non-private)" if math.isinf(x) else f"{x:.4f}"


def sigma_text(accounted, configured=None) -> str:
    """The σ the ledger charged, labelled: ``σ 0.8`` when it is the configured gradient σ, else
    ``effective σ 0.776 (σ 0.8, DP diagnostics included)`` — the DP diagnostics' noisy sums share
    the privacy of every step, so the accountant charges a smaller σ_eff
    (``dpbert.privacy.diagnostics.effective_noise_multiplier``)."""
    if not isinstance(accounted, (int, float)) or isinstance(accounted, bool):
        return "σ ?"
    if isinstance(configured, (int, float)) and not isinstance(configured, bool) and configured > 0 \
            and not math.isclose(accounted, configured, rel_tol=1e-9):
        return f"effective σ {accounted:.3g} (σ {configured:.3g}, DP diagnostics included)"
    return f"σ {accounted:.3g}"


def training_record(records) -> Mapping[str, Any]:
    """The DP-SGD record of a ledger's training records (the one whose q, σ and sampling unit the
    statement prints): the first ``dp_sgd`` record, else the first that is not a DP count
    (a non-private record), else {}. A DP count (``dp_count``) is stated separately."""
    records = [r for r in records if isinstance(r, Mapping)]
    for record in records:
        if record.get("mechanism") == "dp_sgd":
            return record
    return next((r for r in records if r.get("mechanism") != "dp_count"), {})


def ledger_statement(ledger: Mapping[str, Any]) -> str:
    """The statement for ``dpbert.accounting.accountant.ledger`` output (plus optional budget keys)."""
    unit = ledger.get("unit", "tuple")
    unit_text = (f"one N-word tuple" if unit == "tuple"
                 else f"one patient (at most {ledger.get('max_contributions')} tuples)")
    records = [r for r in (ledger.get("train_events") or []) if isinstance(r, Mapping)]
    train = training_record(records)
    counts = [r for r in records if r.get("mechanism") == "dp_count"]
    lines = [
        "DP-BERT privacy statement",
        "=========================",
        f"Unit of privacy: {unit_text}; {ADJACENCY_TEXT[ledger.get('adjacency', 'add_or_remove_one')]}",
        "",
        *(["Vocabulary: the public checkpoint's (vocab.source: public; no private data read): ε_V = 0"]
          if not ledger.get('epsilon_vocab') and not ledger.get('delta_vocab') else [
            "Vocabulary (Gaussian noise on per-tuple word counts + threshold):",
            f"  ε_V = {_eps(ledger.get('epsilon_vocab'))} at δ_V = {fmt_delta(ledger.get('delta_vocab', 0))}"
            f" (of which the threshold's δ₂ = {fmt_delta(ledger.get('delta_threshold', 0))})"]),
        "",
        f"Pre-training (DP-SGD, {train.get('sampling', ledger.get('sampling', '?'))} sampling, "
        f"q = {train.get('sampling_probability', float('nan')):.4g}, "
        f"{sigma_text(train.get('noise_multiplier'), ledger.get('noise_multiplier'))}, "
        f"{ledger.get('steps')} optimizer steps actually taken):",
        *[f"  DP count of the training units (Gaussian, noise multiplier {c.get('noise_multiplier')}, released "
          f"n̂ = {c.get('released')}; it planned q and the steps): charged in ε_T" for c in counts],
        f"  ε_T = {_eps(ledger.get('epsilon_train'))} (PLD), {_eps(ledger.get('epsilon_train_rdp'))} (RDP)"
        f" at δ_T = {fmt_delta(ledger.get('delta_train', 0))}" + (" (DP-SGD and the DP count)" if counts else ""),
        "",
        "Whole run (vocabulary + pre-training):",
        f"  basic composition  ε = {_eps(ledger.get('epsilon_total_basic'))} at δ = "
        f"{fmt_delta(ledger.get('delta_vocab', 0))} + {fmt_delta(ledger.get('delta_train', 0))}",
        f"  RDP composition    ε = {_eps(ledger.get('epsilon_total_rdp'))} at δ = {fmt_delta(ledger.get('delta', 0))}",
        f"  PLD composition    ε = {_eps(ledger.get('epsilon_total_pld'))} at δ = {fmt_delta(ledger.get('delta', 0))}"
        f"   ← the run's ε",
        "  (PLD/RDP: the vocabulary's Gaussian and the training steps in one accountant; the",
        "   threshold's δ₂ is added to δ at the end.)",
    ]
    budget = ledger.get("epsilon_budget")
    if budget is not None:
        verdict = "within budget" if ledger.get("within_budget") else "OVER BUDGET: run refused"
        lines += ["", f"Budget: ε ≤ {budget:g} → {verdict}"]
    if train.get("sampling_unit") == "patient":
        lines += ["", f"Note: user-level DP-SGD — every step Poisson-samples PATIENTS (q above is the patient rate, "
                      f"{train.get('batch_size')} of {train.get('dataset_size')} patients expected per step); a sampled "
                      f"patient brings at most {train.get('max_contributions')} tuples and the SUM of their gradients is "
                      f"clipped as one vector, so ε_T is per patient (no group-privacy factor)."]
    elif unit == "patient" and train.get("mechanism") == "dp_sgd":
        lines += ["", "Note: the training record samples tuples, not patients: its per-patient ε is a "
                      "group-privacy bound over the patient's tuples."]
    if train.get("sampling") == "shuffle":
        lines += ["", "Note: shuffled fixed-size batches are accounted without privacy amplification."]
    if ledger.get("non_private"):
        lines += ["", "Note: a stage ran without privacy (baseline): the run's ε is infinite."]
    return "\n".join(lines)
