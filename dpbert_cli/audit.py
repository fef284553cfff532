"""``dpbert audit``: the empirical privacy audits of a configuration (``dpbert.stages.audit``).

Exit codes: 0 the audit is consistent with the accountant; 5 (``exit_codes.AUDIT_FAILED``) its
lower bound exceeds the accountant's ε (the vocabulary test: the claimed (ε, δ) is refuted);
3 (``OVER_BUDGET``) the audited run does not fit the dataset's remaining budget (refused before it
trains); 2 bad configuration (``--no-charge`` on a user's corpus, no public or DP vocabulary there).

The white-box audit is a DP-SGD run: it is reserved in the dataset's ledger before it trains and
finalized after (``dpbert.stages.audit``); on a user's corpus its report is operator-only.
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
    p.add_argument("--vocabulary-dir", metavar="DIR",
                   help="the audited run's vocabulary: a DPVocabulary folder (dp_event.json a DP or public record), "
                        "e.g. a run's DPVocabularyGen/vocabulary/N; required on a user's corpus unless "
                        "vocab.source: public (never an exact WordPiece of private text)")
    p.add_argument("--no-charge", action="store_true",
                   help="do not reserve the audited run in the dataset's ledger: the embedded public corpus only "
                        "(refused on a user's corpus: there the audit is a DP release)")
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
        result = _audit_training(args, config, beta)
        if result is None:
            return exit_codes.OVER_BUDGET
        failed = not result["consistent"]
    if args.json:
        print_json(result)
    else:
        print(_summary(result, args.vocabulary))
    return exit_codes.AUDIT_FAILED if failed else exit_codes.OK


def _audit_training(args, config, beta: float):
    """The white-box audit, charged (``dpbert.stages.audit``); None when the dataset's ledger
    refused it (the message printed)."""
    from dpbert.accounting.gate import BudgetRefused
    from dpbert.stages import audit
    from dpbert_cli.commands import UserError
    from dpbert_cli.output import print_error

    if args.no_charge and not audit.is_embedded_corpus(config.corpus):
        raise UserError("--no-charge: refused on a user's corpus (corpus.path): an audit on private rows is a "
                        "DP-SGD release, always charged to the dataset's ledger")
    tokenizer, vocabulary = audit.audit_vocabulary_source(config, args.vocabulary_dir)
    try:
        return audit.audit_training(config, tokenizer=tokenizer, vocabulary=vocabulary, canaries=args.canaries,
                                    beta=beta, positive_control=args.positive_control,
                                    watch=audit.Watch(progress=not args.json),
                                    charge=not args.no_charge)
    except BudgetRefused as refused:
        print_error("audit", refused)
        return None


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
    lines.append(f"  vocabulary: {r.get('vocabulary')}")
    lines.append(f"  ledger: {'charged (entry ' + str(r['ledger_entry']) + ')' if r.get('charged') else 'not charged'}")
    lines.append(f"  {'PRIVATE ' if r.get('private') else ''}{r.get('release')}")
    return "\n".join(lines)
