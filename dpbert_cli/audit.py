"""``dpbert audit``: the empirical privacy audits of a configuration (``dpbert.stages.audit``).

Exit codes: 0 the audit is consistent with the accountant; 5 (``exit_codes.AUDIT_FAILED``) its
lower bound exceeds the accountant's ε (the vocabulary test: the claimed (ε, δ) is refuted);
2 bad configuration.
"""
from __future__ import annotations

import math

from dpbert import exit_codes
from dpbert_cli.args import config_args
from dpbert_cli.output import print_json


def add_audit_parser(sub):
    from dpbert.stages.audit import DEFAULT_CANARIES, DEFAULT_VOCAB_TRIALS

    p = sub.add_parser(
        "audit", help="empirical privacy audit: white-box one-run audit of the configured DP-SGD training "
                      "(exit 5 when it refutes the accountant), or --vocabulary")
    config_args(p)
    p.add_argument("--vocabulary", action="store_true",
                   help="audit the vocabulary mechanism (noise + threshold) instead: a distinguishing test")
    p.add_argument("--canaries", type=int, default=DEFAULT_CANARIES,
                   help=f"m, gradient canaries (default {DEFAULT_CANARIES})")
    p.add_argument("--trials", type=int, default=DEFAULT_VOCAB_TRIALS,
                   help=f"--vocabulary: runs on each neighbouring histogram (default {DEFAULT_VOCAB_TRIALS})")
    p.add_argument("--positive-control", action="store_true",
                   help="also score the same run's sums read BEFORE the noise (must exceed the claimed ε); not "
                        "private: refused on a user's corpus")
    p.add_argument("--confidence", type=float, default=0.95, help="1 − β of the bound (default 0.95)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_audit)


def cmd_audit(args) -> int:
    from dpbert.stages import audit
    from dpbert_cli.commands import load

    config = load(args)  # the demo preset without --config: what `dpbert run` would run
    if not 0 < args.confidence < 1:
        raise ValueError(f"--confidence must be in (0, 1), got {args.confidence}")
    beta = 1.0 - args.confidence
    if args.vocabulary:
        result = audit.audit_vocabulary(config, trials=args.trials, beta=beta)
        result["epsilon_vocab_ledger"], result["ledger_unit"] = _ledger_epsilon_vocab(config)
        failed = bool(result["flagged"])
    else:
        if args.canaries < 2:
            raise ValueError(f"--canaries must be >= 2, got {args.canaries}")
        result = audit.audit_training(config, canaries=args.canaries, beta=beta,
                                      positive_control=args.positive_control, progress=not args.json)
        failed = not result["consistent"]
    if args.json:
        print_json(result)
    else:
        print(_summary(result, args.vocabulary))
    return exit_codes.AUDIT_FAILED if failed else exit_codes.OK


def _ledger_epsilon_vocab(config):
    """(ε_V the ledger charges per privacy unit, the unit): k = privacy.max_tuples_per_patient
    tuples per patient (``histogram_report``), one tuple per tuple."""
    from dpbert.privacy.histogram import histogram_report

    vc, unit = config.vocab, config.privacy.unit
    k = config.privacy.max_tuples_per_patient if unit == "patient" else 1
    report = histogram_report(vc.sigma, vc.delta, config.privacy.tuple_words, vc.threshold_mode, k, unit=unit)
    return float(report["epsilon"]), unit


def _fmt(x) -> str:
    return "∞" if isinstance(x, float) and math.isinf(x) else f"{x:.3g}"


def _summary(r, vocabulary: bool) -> str:
    if vocabulary:
        return "\n".join([
            f"vocabulary distinguishing test ({r['trials']} trials on D and D′, {r['confidence']:.0%}):",
            f"  claimed (ε, δ) = ({_fmt(r['claimed_epsilon'])}, {_fmt(r['claimed_delta'])}) for a neighbour of "
            f"{r.get('neighbour', 'one tuple')}; measured δ ≥ {_fmt(r['delta_lower_bound'])} at that ε, "
            f"ε ≥ {_fmt(r['epsilon_lower_bound'])} at that δ — {'REFUTED' if r['flagged'] else 'not refuted'}",
            *([f"  (the ledger's ε_V = {_fmt(r['epsilon_vocab_ledger'])} is per {r['ledger_unit']}, up to "
               f"privacy.max_tuples_per_patient tuples: this test exercises a one-tuple neighbour, not that one)"]
              if r.get("ledger_unit") == "patient" and r.get("epsilon_vocab_ledger") is not None else []),
            f"  resolution: events below p ≈ {_fmt(r['detection_floor'])} are not seen "
            f"(the claimed δ is {'below' if r['claimed_delta'] < r['detection_floor'] else 'above'} it)",
            f"  positive control ({r['positive_control']}): "
            f"{'flagged' if r['positive_control_flagged'] else 'NOT flagged'}, "
            f"δ ≥ {_fmt(r['positive_control_delta_lower_bound'])}"])
    lines = [
        f"white-box one-run audit of the configured loop ({r['canaries']} gradient canaries, each one "
        f"{r['audited_unit']} of the run's sampler, k = {r['max_contributions']}, {r['steps']} steps, "
        f"q = {r['q']:.4g}, {r['confidence']:.0%}, δ = {r['delta']:.3g}, {r['corpus']}):",
        f"  trainable {','.join(r['trainable'])}: canaries on {r['probe_variable']} (d' = {r['canary_dims']})",
        f"  ε ≥ {r['epsilon_lower_bound']:.3f} (audit)   ε ≤ {r['epsilon_upper_bound']:.3f} (accountant) — "
        f"{'consistent' if r['consistent'] else 'AUDIT REFUTES THE ACCOUNTANT'}",
        f"  power: {r['max_reachable_lower_bound']:.3f} with every guess right "
        f"({'can' if r['max_reachable_lower_bound'] > r['epsilon_upper_bound'] else 'CANNOT'} refute this ε)"]
    if "positive_control_lower_bound" in r:
        lines.append(f"  positive control (the same run's sums before the noise): ε ≥ "
                     f"{r['positive_control_lower_bound']:.3f} "
                     f"({'detected' if r['positive_control_exceeds_upper_bound'] else 'NOT detected'})")
    lines.append(f"  {r['seconds']['total']:.0f} s")
    if r.get("private"):
        lines.append("  private: computed on the configured corpus (operator-only); the audited run is a DP "
                     "release on it (dp_event)")
    return "\n".join(lines)
