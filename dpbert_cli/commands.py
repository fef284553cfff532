"""The commands of ``dpbert`` over the core and the DAG: run, synth, report, release, privacy, budget.

Each ``cmd_*`` takes the parsed arguments and returns an exit code (``dpbert.exit_codes``);
configuration and corpus errors propagate to ``dpbert_cli.main``, which maps them to 2.
"""
from __future__ import annotations

import os
import shlex
import sys
from typing import Optional

from dpbert import exit_codes
from dpbert.config import load_config
from dpbert_cli.args import DEFAULT_PRESET
from dpbert_cli.output import print_error, print_json


class UserError(Exception):
    """Bad input found by a command before it does anything; ``main`` prints it (exit 2)."""


def check_output_file(option: str, path: str) -> None:
    """``path`` can be written as a file: not a directory, and its directory exists."""
    if os.path.isdir(path):
        raise UserError(f"{option} {path} is a directory; give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UserError(f"{option} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UserError(f"{option} {path}: directory {parent} is not writable")


def load(args, preset: str = DEFAULT_PRESET):
    """The configuration of ``--config`` (else the built-in ``preset``: the demo for every
    command), ``--set`` overrides, and the ``--corpus`` / ``--output`` shortcuts."""
    overrides = list(args.overrides)
    if getattr(args, "corpus", None):
        overrides.append(f"corpus.path={args.corpus}")
    if getattr(args, "output", None):
        overrides.append(f"pipeline.output_dir={args.output}")
    if getattr(args, "no_cache", False):  # dpbert run --no-cache
        overrides.append("pipeline.enable_cache=false")
    config = load_config(args.config, overrides, preset=None if args.config else preset)
    if getattr(args, "command", None) == "run":
        # Before anything is written: the output directory must be (or become) a directory.
        out = config.pipeline.output_dir
        option = "--output" if getattr(args, "output", None) else "pipeline.output_dir"
        if os.path.exists(out) and not os.path.isdir(out):
            raise UserError(f"{option} {out} is a file, not a directory")
        parent = os.path.dirname(os.path.abspath(out))
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise UserError(f"{option} {out}: {parent} is a file, not a directory")
        # The folder that will be written in (the output directory, or its nearest existing parent
        # where it will be created) must be writable: not a PermissionError traceback mid-run.
        target = out if os.path.isdir(out) else parent
        if not os.access(target, os.W_OK | os.X_OK):
            raise UserError(f"{option} {out}: directory {target} is not writable")
    return config


def cmd_run(args) -> int:
    config = load(args)
    from pipeline import guard

    planned = guard.check_budget(config)
    if planned is not None and not planned["within_budget"]:
        print(guard.over_budget_message(planned), file=sys.stderr)
        return exit_codes.OVER_BUDGET
    try:
        from pipeline.local_runner import RunInterrupted, RunRefused, run_local

        try:
            where = run_local(config)
        except RunRefused as refused:
            # The trainer refused a step over the budget; the ε already spent is on the run.
            print(f"dpbert run: {refused.message()}", file=sys.stderr)
            return exit_codes.OVER_BUDGET
        except RunInterrupted as interrupted:
            # One line, no traceback; the run is marked cancelled in ML Metadata (report, dashboard).
            print(f"dpbert run: {interrupted.message()}", file=sys.stderr)
            return exit_codes.INTERRUPTED
        except Exception as err:  # noqa: BLE001 -- a privacy verdict gets its exit code and one line
            code, verdict = privacy_verdict(err)
            if code is None:
                raise  # any other component failure keeps its traceback (exit 1)
            first = (str(verdict).splitlines() or [""])[0]
            print(f"dpbert run: {type(verdict).__name__}: {first}; the run is recorded FAILED with its "
                  f"evidence (dpbert report --output {shlex.quote(config.pipeline.output_dir)})", file=sys.stderr)
            return code
    except KeyboardInterrupt:  # while TFX and the DAG were being loaded: nothing ran
        print("dpbert run: interrupted before any component started; nothing was charged", file=sys.stderr)
        return exit_codes.INTERRUPTED
    print(f"artifacts:         {where['pipeline_root']}")
    print(f"ML Metadata store: {where['metadata']}")
    print(f"inspect with:      dpbert report --output {shlex.quote(config.pipeline.output_dir)}")
    # The ε the run spent on stdout, cached or not; the report's warnings on stderr.
    from dpbert import metadata, report

    try:
        run = metadata.get_run(metadata.open_store(where["metadata"]))  # the newest: this one
    except (OSError, LookupError) as err:  # the run itself succeeded: say why there is no summary
        print(f"dpbert run: no ε summary ({err})", file=sys.stderr)
        return exit_codes.OK
    lines, warnings = report.run_summary(run)
    print("\n".join(lines))
    for warning in warnings:
        print(f"dpbert run: warning: {warning}", file=sys.stderr)
    return exit_codes.OK


def _causes(err: BaseException):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def privacy_verdict(err: BaseException):
    """(exit code, the verdict's exception) of a run that a privacy check stopped inside the DAG:
    3 when the accountant found the total over ``privacy.epsilon_budget``, 5 when an audit refuted
    the accountant or a run-time integrity check of the training mechanism failed; (None, None)
    for any other failure. The verdicts' messages name checks and ε values, never raw text."""
    from dpbert.privacy.one_run_audit import AuditInconsistencyError
    from dpbert.privacy.event_check import IntegrityCheckFailed
    from dpbert.stages.accountant import BudgetExceededError
    from dpbert.ledger import BudgetRefused

    for cause in _causes(err):
        if isinstance(cause, (BudgetExceededError, BudgetRefused)):  # BudgetRefused: the dataset ledger
            return exit_codes.OVER_BUDGET, cause
        if isinstance(cause, (AuditInconsistencyError, IntegrityCheckFailed)):
            return exit_codes.AUDIT_FAILED, cause
    return None, None


def cmd_synth(args) -> int:
    from dpbert.data.synthetic import generate_notes, write_jsonl

    for option, value in (("--patients", args.patients), ("--admissions", args.admissions),
                          ("--notes", args.notes)):
        if value < 1:
            raise UserError(f"{option} must be >= 1, got {value}")
    check_output_file("--output", args.output)
    # write_jsonl writes a temporary file and renames it: an existing --output is replaced only
    # by a complete corpus.
    n = write_jsonl(generate_notes(args.patients, args.admissions, args.notes, args.seed), args.output)
    print(f"wrote {n} synthetic notes to {args.output}")
    return exit_codes.OK


_SQLITE_MAGIC = b"SQLite format 3\x00"


def open_metadata_store(path: str, option: str = "--metadata"):
    """The ML Metadata store at ``path`` opened read-only and queried once, or ``UserError``
    naming the file: a directory, an empty file, not SQLite, or SQLite but not ML Metadata."""
    from dpbert import metadata

    if os.path.isdir(path):
        raise UserError(f"{option} {path} is a directory; give the metadata.sqlite file (or --output DIR)")
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(_SQLITE_MAGIC))
    except OSError as err:
        raise UserError(f"{path}: cannot be read ({err.strerror})") from None
    if not head:
        raise UserError(f"{path} is empty (0 bytes), not an ML Metadata store")
    if head != _SQLITE_MAGIC:
        raise UserError(f"{path} is not an SQLite database, so not an ML Metadata store")
    try:
        store = metadata.open_store(path)
        store.get_contexts_by_type("pipeline_run")
    except Exception as err:  # RuntimeError / ml_metadata.errors.StatusError from the C++ store
        first = (str(err).splitlines() or [type(err).__name__])[0].rsplit(" query:", 1)[0]
        raise UserError(f"{path} is not a readable ML Metadata store (an SQLite database without "
                        f"its tables, or damaged: {first[:160]})") from None
    return store


def _run_of(args):
    """The run of ``--output`` / ``--metadata`` and ``--run`` (the store opened read-only)."""
    from dpbert import metadata

    if args.output and os.path.exists(args.output) and not os.path.isdir(args.output):
        raise UserError(f"--output {args.output} is a file; give the run's output directory "
                        f"(or the store with --metadata FILE)")
    try:
        path = metadata.metadata_path_for(args.output, args.metadata)
    except FileNotFoundError as err:
        raise UserError(str(err)) from None
    try:
        return metadata.get_run(open_metadata_store(path, "--metadata" if args.metadata else "--output"), args.run)
    except LookupError as err:
        raise UserError(f"{path}: {err}") from None


def cmd_report(args) -> int:
    from dpbert import report

    run = _run_of(args)
    built = report.build_report(run)
    if args.released:
        from dpbert.release import released_view

        built = released_view(built)
    if args.json:
        print_json(built)
    else:
        print(report.format_report(built))
    return exit_codes.OK


def cmd_release(args) -> int:
    from dpbert import release

    run = _run_of(args)
    try:
        manifest = release.write_bundle(run, args.bundle)
    except (FileNotFoundError, LookupError, release.ReleaseError) as err:
        print_error("release", err)
        return exit_codes.BAD_INPUT
    if args.json:
        print_json(manifest)
    else:
        print(f"released run {manifest['run_id']} ({manifest['pipeline']}): "
              f"ε = {manifest['epsilon']:.4g}, δ = {manifest['delta'] or 0:.3g}, unit: {manifest['unit']}, "
              f"adjacency: {manifest['adjacency']}")
        print(f"{len(manifest['files'])} files in {args.bundle} "
              f"(manifest: {os.path.join(args.bundle, release.MANIFEST_FILE)})")
    return exit_codes.OK


def cmd_privacy_histogram(args) -> int:
    from dpbert.privacy.histogram import histogram_report

    report = histogram_report(args.sigma, args.delta, args.tuple_words, args.threshold_mode,
                              args.max_contributions,
                              threshold_delta_fraction=args.threshold_delta_fraction)
    if args.json:
        print_json(report)
    else:
        print(f"threshold C = {report['threshold']:.1f} ({report['threshold_mode']})")
        print(f"ε = {report['epsilon']:.4g} at δ = {report['delta']:.3g} "
              f"(threshold δ₂ = {report['delta_threshold']:.3g}); classic ε = {report['epsilon_classic']:.4g}")
        if report.get("warning"):
            print("WARNING: " + report["warning"])
    return exit_codes.OK


def cmd_privacy_dpsgd(args) -> int:
    from dpbert.privacy.accountant import dpsgd_report

    unit = getattr(args, "unit", "tuple")
    if unit == "patient":
        if args.patients is None or args.patients_per_step is None:
            raise UserError("--unit patient needs --patients P and --patients-per-step B")
        if args.examples is not None or args.batch_size is not None:
            raise UserError("--unit patient takes --patients and --patients-per-step, not --examples / --batch-size")
        if args.sampling != "poisson":
            raise UserError("--unit patient (user-level DP-SGD) samples patients with --sampling poisson only")
        report = dpsgd_report(args.patients, args.patients_per_step, args.noise_multiplier, args.delta,
                              epochs=args.epochs, steps=args.steps, sampling=args.sampling,
                              max_contributions=args.max_tuples_per_patient, unit="patient")
    else:
        if args.examples is None or args.batch_size is None:
            raise UserError("--examples N and --batch-size B are required (or --unit patient with --patients "
                            "and --patients-per-step)")
        if args.patients is not None or args.patients_per_step is not None:
            raise UserError("--patients / --patients-per-step need --unit patient")
        report = dpsgd_report(args.examples, args.batch_size, args.noise_multiplier, args.delta,
                              epochs=args.epochs, steps=args.steps, sampling=args.sampling)
    if args.json:
        print_json(report)
    else:
        per = (f", per patient (user-level: {report['batch_size']} of {report['examples']} patients per step, "
               f"<= {report['max_contributions']} tuples each)" if report["unit"] == "patient" else "")
        print(f"DP-SGD ({report['sampling']} sampling, q = {report['sampling_probability']:.4g}, "
              f"{report['steps']} steps, σ = {report['noise_multiplier']}): "
              f"ε = {report['epsilon_pld']:.4g} (PLD), {report['epsilon_rdp']:.4g} (RDP) "
              f"at δ = {report['delta']:.3g}{per}")
    return exit_codes.OK


def cmd_privacy_noise_check(args) -> int:
    from dpbert.model.noise_check import run_noise_check_cli

    return run_noise_check_cli(args)


def cmd_budget(args) -> int:
    from dpbert.privacy.accountant import planned_ledger
    from pipeline import guard

    config = load(args)
    guard.training_plan(config, dataset_size=args.examples)  # a usable public n, else exit 2 naming it
    n = guard.public_dataset_size(config, args.examples)
    # No public n configured (n only from --examples): the trainer plans from a DP count of its
    # units and charges it, so the planned ledger charges it too.
    dp_count = guard.public_dataset_size(config) is None and not config.training.non_private
    if args.target_epsilon is not None:
        return _target_noise_multiplier(config, n, dp_count, args.target_epsilon, args.json)
    planned = planned_ledger(config, n, dp_count=dp_count)
    if args.json:
        print_json({k: v for k, v in planned.items() if k not in ("vocab_event", "train_events")})
    else:
        print(guard.planned_statement(planned))
        if dp_count:
            print(f"  (no public n configured: the run plans from a DP count, σ_c = "
                  f"{config.training.count_noise_multiplier:g}, charged in ε_train)")
    return exit_codes.OK if planned["within_budget"] else exit_codes.OVER_BUDGET


def _target_noise_multiplier(config, n: int, dp_count: bool, target_epsilon: float, as_json: bool) -> int:
    """The ``training.noise_multiplier`` σ whose PLANNED ledger records ε_T ≤ ``target_epsilon``:
    ε_T is the ledger's ``epsilon_train`` (PLD at δ_T = training.delta) — the DP-SGD steps at σ_eff
    (gradient + DP diagnostics) and the DP count when the run draws one; the vocabulary is in the
    whole run's ε, printed next to it. The printed numbers are ``planned_ledger`` at the printed σ."""
    import dataclasses

    from dpbert.privacy import accountant

    sigma = accountant.noise_multiplier_for_planned_target(config, target_epsilon, n, dp_count=dp_count)
    configured = dataclasses.replace(config, training=dataclasses.replace(config.training, noise_multiplier=sigma))
    planned = accountant.planned_ledger(configured, n, dp_count=dp_count)
    train = [r for r in planned["train_events"] if r.get("mechanism") == "dp_sgd"][0]
    out = {"target": "epsilon_train", "target_epsilon": target_epsilon, "noise_multiplier": sigma,
           "effective_noise_multiplier": train["noise_multiplier"],
           "sampling_probability": planned["sampling_probability"], "steps": planned["steps"],
           "delta": planned["delta_train"], "sampling": planned["sampling"],
           "dataset_size": planned["dataset_size"], "dataset_size_source": planned["dataset_size_source"],
           "epsilon_pld": planned["epsilon_train"], "epsilon_train": planned["epsilon_train"],
           "epsilon_train_rdp": planned["epsilon_train_rdp"], "epsilon_vocab": planned["epsilon_vocab"],
           "epsilon_total_pld": planned["epsilon_total_pld"], "delta_total": planned["delta"],
           "epsilon_budget": planned["epsilon_budget"], "within_budget": planned["within_budget"]}
    if as_json:
        print_json(out)
    else:
        count = (f" + the DP count (σ_c = {config.training.count_noise_multiplier:g})" if dp_count else "")
        diagnostics = " with its DP diagnostics" if getattr(config.training, "dp_diagnostics", True) else ""
        print(f"training.noise_multiplier σ = {sigma:.4f}: the planned ledger records ε_T = "
              f"{planned['epsilon_train']:.6g} ≤ {target_epsilon:g} (PLD at δ_T = {planned['delta_train']:.3g}; "
              f"DP-SGD at σ_eff = {train['noise_multiplier']:.4f}{diagnostics}{count}; "
              f"q = {planned['sampling_probability']:.4g}, {planned['steps']} steps, {planned['sampling']} sampling)")
        print(f"whole run (vocabulary included): ε = {planned['epsilon_total_pld']:.4g} (PLD) at δ = "
              f"{planned['delta']:.3g}")
    return exit_codes.OK
