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
from dpbert.privacy.numbers import fmt_delta, fmt_epsilon
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
    command), ``--set`` overrides, and the ``--corpus`` / ``--output`` / ``--pipeline-root`` shortcuts."""
    overrides = list(args.overrides)
    if getattr(args, "corpus", None):
        overrides.append(f"corpus.path={args.corpus}")
    if getattr(args, "output", None):
        overrides.append(f"pipeline.output_dir={args.output}")
    if getattr(args, "command", None) == "run" and args.pipeline_root:  # report's --pipeline-root reads a run
        overrides.append(f"pipeline.pipeline_root={args.pipeline_root}")
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

    guard.prechecks(config)  # the vocabulary threshold and the canaries against the declared sizes
    planned = guard.check_budget(config)
    if planned is not None and not planned["within_budget"]:
        print(guard.over_budget_message(planned), file=sys.stderr)
        return exit_codes.OVER_BUDGET
    from pipeline import corpus_index

    corpus_index.check_and_record(config, getattr(args, "same_corpus_as", None))  # one corpus, one budget
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
        run = metadata.MetadataRunReader(where["metadata"]).get_run()  # the newest: this one
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
    from dpbert.accounting.gate import BudgetRefused
    from dpbert.stages.accountant import BudgetExceededError

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


def run_reader(args, output: Optional[str]):
    """Where ``args`` reads runs from (``dpbert.metadata.RunReader``): ``--pipeline-root`` (no
    store), else the ML Metadata store of ``output`` / ``--metadata``, checked readable here so a
    bad path is a ``UserError`` naming the option."""
    from dpbert import metadata

    if getattr(args, "pipeline_root", None):
        from dpbert import pipeline_root

        if output or args.metadata:
            raise UserError("--pipeline-root reads a run without an ML Metadata store: give it without "
                            "--output/--metadata")
        return pipeline_root.PipelineRootRunReader(args.pipeline_root)
    if output and os.path.exists(output) and not os.path.isdir(output):
        raise UserError(f"--output {output} is a file; give the run's output directory "
                        f"(or the store with --metadata FILE)")
    try:
        path = metadata.metadata_path_for(output, args.metadata)
    except FileNotFoundError as err:
        raise UserError(str(err)) from None
    open_metadata_store(path, "--metadata" if args.metadata else "--output")
    return metadata.MetadataRunReader(path)


def read_run(args, output: Optional[str] = None):
    """The run ``--run`` (default: the newest) of ``run_reader(args, output)``, ``output``
    defaulting to ``--output``; ``UserError`` naming where it looked."""
    reader = run_reader(args, args.output if output is None else output)
    where = "--pipeline-root" if getattr(args, "pipeline_root", None) else reader.source
    try:
        return reader.get_run(args.run)
    except FileNotFoundError as err:  # a pipeline root without executor output: the message names it
        raise UserError(f"--pipeline-root {err}") from None
    except LookupError as err:
        raise UserError(f"{where}: {err}") from None


def cmd_report(args) -> int:
    from dpbert import report

    run = read_run(args)
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

    run = read_run(args)
    try:
        manifest = release.write_bundle(run, args.bundle)
    except (FileNotFoundError, LookupError, release.ReleaseError) as err:
        print_error("release", err)
        return exit_codes.BAD_INPUT
    if args.json:
        print_json(manifest)
    else:
        print(f"released run {manifest['run_id']} ({manifest['pipeline']}): "
              f"ε = {manifest['epsilon']:.4g}, δ = {fmt_delta(manifest['delta'] or 0)}, unit: {manifest['unit']}, "
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
        print(f"ε = {report['epsilon']:.4g} at δ = {fmt_delta(report['delta'])} "
              f"(threshold δ₂ = {fmt_delta(report['delta_threshold'])}); classic ε = {report['epsilon_classic']:.4g}")
        if report.get("warning"):
            print("WARNING: " + report["warning"])
    return exit_codes.OK


def cmd_privacy_dpsgd(args) -> int:
    from dpbert.accounting.accountant import dpsgd_report

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
              f"at δ = {fmt_delta(report['delta'])}{per}")
    return exit_codes.OK


def cmd_privacy_noise_check(args) -> int:
    from dpbert.diagnostics.noise_check import run_noise_check_cli

    return run_noise_check_cli(args)


def cmd_budget(args) -> int:
    """The planned ε per unit (vocabulary, DP count, training, whole run) against the budget
    (exit 3 when the whole run is over it), and before anything trains: whether the vocabulary
    threshold can be passed at the declared size, the canaries fit it, the declared sizes against
    ``--corpus`` (operator-only: an exact count), an estimate of the training time here, and the
    dataset's remaining budget (``guard.remaining_budget``). ``--target-epsilon``: the σ instead."""
    from dpbert.accounting.accountant import planned_ledger
    from pipeline import guard

    config = load(args)
    plan = guard.training_plan(config, dataset_size=args.examples)  # a usable public n, else exit 2 naming it
    n = guard.public_dataset_size(config, args.examples)
    # No public n configured (n only from --examples): the trainer plans from a DP count of its
    # units and charges it, so the planned ledger charges it too.
    dp_count = guard.public_dataset_size(config) is None and not config.training.non_private
    if args.compute is not None or args.min_steps is not None:
        return _plan_shape(config, plan, dp_count, args)
    if args.target_epsilon is not None:
        return _target_noise_multiplier(config, n, dp_count, args.target_epsilon, args.json,
                                        getattr(args, "target", "whole") or "whole")
    planned = planned_ledger(config, n, dp_count=dp_count)
    dataset = guard.dataset_budget(config, planned, guard.charged_chain(config) if guard.public_dataset_size(config) else None)
    if dataset is not None:  # the same gate and entries as dpbert run's guard and the reservation
        planned["dataset"] = dataset
        planned["within_budget"] = dataset["within_budget"]
    checks = budget_checks(config, planned, plan, getattr(args, "check_corpus", None))
    if args.json:
        print_json({**{k: v for k, v in planned.items() if k not in ("vocab_event", "train_events")}, **checks})
    else:
        print(guard.planned_statement(planned))
        if dp_count:
            print(f"  (no public n configured: the run plans from a DP count, σ_c = "
                  f"{config.training.count_noise_multiplier:g}, charged in ε_train)")
        print("\n".join(budget_check_lines(checks)))
    return exit_codes.OK if planned["within_budget"] else exit_codes.OVER_BUDGET


def epsilon_parts(planned: dict) -> dict:
    """The planned ε per privacy unit by part: ``vocabulary`` (ε_V), ``count`` (the DP count alone,
    at δ_T; 0 with a public n), ``training`` (ε_T: DP-SGD and the count composed), ``whole``
    (everything composed, PLD at the total δ)."""
    from dpbert.accounting.accountant import ledger

    counts = [r for r in planned.get("train_events") or [] if r.get("mechanism") == "dp_count"]
    count = ledger(None, counts, planned["delta_train"])["epsilon_train"] if counts else 0.0
    return {"unit": planned.get("unit") or "tuple", "vocabulary": planned["epsilon_vocab"], "count": count,
            "training": planned["epsilon_train"], "whole": planned["epsilon_total_pld"], "delta": planned["delta"]}


def budget_checks(config, planned: dict, plan, corpus_path: Optional[str] = None) -> dict:
    """What ``dpbert budget`` says before anything trains (see :func:`cmd_budget`)."""
    from dpbert.stages.canary import canary_rows, occurrences_problem, planned_occurrences
    from pipeline import guard

    out = {"epsilon_parts": epsilon_parts(planned), "vocabulary_threshold": guard.vocabulary_threshold(config),
           "canary_problem": occurrences_problem(config),
           "canary_occurrences": planned_occurrences(config.canary, canary_rows(config))
           if config.canary.enabled else None,
           "remaining_budget": guard.remaining_budget(config),
           "training_time_estimate": training_time_estimate(config, plan)}
    if corpus_path:
        out["corpus_sizes"] = corpus_sizes(config, corpus_path)
    return out


def budget_check_lines(checks: dict) -> list:
    parts = checks["epsilon_parts"]
    lines = [f"planned ε per {parts['unit']}: vocabulary {parts['vocabulary']:.4g}, count {parts['count']:.4g}, "
             f"training {parts['training']:.4g}, whole run {parts['whole']:.4g} (PLD, δ = {fmt_delta(parts['delta'])})"]
    vocabulary = checks["vocabulary_threshold"]
    lines.append("vocabulary: " + ("no DP vocabulary (vocab.source = public, or the non-private baseline)"
                                   if vocabulary is None else vocabulary["message"]))
    if checks.get("canary_occurrences") is not None:
        lines.append(f"canaries: occurrence groups {checks['canary_occurrences']}"
                     + (f" — REFUSED by dpbert run: {checks['canary_problem']}" if checks.get("canary_problem") else ""))
    sizes = checks.get("corpus_sizes")
    if sizes is None:
        lines.append("corpus: not read (give --corpus PATH to check the declared public sizes against it)")
    else:
        lines.append(f"corpus: {sizes['message']} (operator-only: exact count)")
    estimate = checks.get("training_time_estimate")
    if estimate is not None:
        lines.append(f"training time on this machine: ≈ {_duration(estimate['seconds'])} for {estimate['steps']} steps "
                     f"(an ESTIMATE: {estimate['how']})")
    remaining = checks.get("remaining_budget")
    lines.append("the dataset's budget gate still admits: " + (
        "no budget (none configured or pinned)" if remaining is None else
        f"{'at least ' if remaining.get('at_least') else ''}{remaining['steps']} DP-SGD steps of this plan "
        f"({remaining['planned_steps']} planned; that run alone: "
        f"ε_T = {fmt_epsilon(remaining['epsilon_train'])} at δ_T = {fmt_delta(remaining['delta_train'])})"))
    return lines


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def corpus_sizes(config, path: str) -> dict:
    """OPERATOR-ONLY: the corpus at ``path`` (read with the configured format, glob and encoding)
    counted exactly — patients and tuples — against the declared public size. Printed by ``dpbert
    budget --corpus`` on the operator's terminal, never logged or written."""
    import dataclasses

    from dpbert.data.corpus import PartitionStats, iter_tuples

    corpus = dataclasses.replace(config.corpus, path=path)
    stats = PartitionStats()
    for _ in iter_tuples(corpus, config.privacy.tuple_words, stats):
        pass
    patient = config.privacy.unit == "patient"
    field = "training.dataset_patients" if patient else "training.dataset_size"
    declared = config.training.dataset_patients if patient else config.training.dataset_size
    actual = stats.patients if patient else stats.tuples
    unit = "patients" if patient else "tuples"
    out = {"patients": stats.patients, "tuples": stats.tuples, "declared": declared, "field": field}
    if not declared:
        out["match"], text = None, f"{field} not declared"
    else:
        from dpbert.report import PUBLIC_SIZE_FACTOR, significant

        ratio = actual / declared
        out["match"] = 1 / PUBLIC_SIZE_FACTOR <= ratio <= PUBLIC_SIZE_FACTOR
        text = (f"{'matches' if out['match'] else 'does NOT match'} {field} = {declared:,} "
                f"({significant(ratio)}× the declared {unit})")
    out["message"] = f"{stats.patients:,} patients, {stats.tuples:,} tuples in {path}: {text}"
    return out


def training_time_estimate(config, plan) -> Optional[dict]:
    """An ESTIMATE of the DP-SGD training time on this machine: steps × (FLOPs of one step ÷ the
    matmul rate measured here with a tiny numpy timing). FLOPs of a step ≈ 6 × tokens × (encoder
    weights + the MLM head's on the masked positions) (forward + backward); tokens = B (× k tuples
    per patient) × max_seq_length. Public warm-up steps added. Checked against the demo's note
    (a 2-layer MiniLM-width DP step over 64 tuples of 32 tokens ≈ 2 s on 2 cores): within ±3×.
    None when the model's sizes are unknown here."""
    import time

    import numpy as np

    sizes = _model_sizes(config)
    if sizes is None:
        return None
    h, layers, inter, vocab = sizes
    mc, tc = config.model, config.training
    per_unit = plan.max_contributions if config.privacy.unit == "patient" else 1
    tokens = plan.batch_size * per_unit * mc.max_seq_length
    encoder = layers * (4 * h * h + 2 * h * inter)
    head = 0.15 * vocab * h  # the MLM head's output layer on the masked positions
    flops = 6 * tokens * (encoder + head)
    warmup = 6 * mc.public_warmup_steps * mc.public_warmup_batch_size * mc.max_seq_length * (encoder + head)
    a = np.ones((512, 512), dtype=np.float32)
    a @ a  # warm the BLAS threads
    start = time.perf_counter()
    for _ in range(10):
        a @ a
    rate = 10 * 2 * 512 ** 3 / max(time.perf_counter() - start, 1e-9)
    seconds = (plan.steps * flops + warmup) / rate
    return {"seconds": seconds, "steps": plan.steps, "matmul_gflops": rate / 1e9, "step_seconds": flops / rate,
            "how": f"{plan.steps} steps × ≈ {flops / 1e9:.3g} GFLOP each at this machine's measured "
                   f"{rate / 1e9:.0f} GFLOP/s matmul rate; ±3×"}


def _model_sizes(config):
    """(hidden, layers, intermediate, vocabulary) of the configured model, from the public
    checkpoint's config.json (model.init = minilm) or the preset table; None when unavailable."""
    mc = config.model
    try:
        if mc.init == "minilm":  # the checkpoint's config.json (no TensorFlow import)
            from dpbert import schema
            from dpbert.resources.checkpoint import checkpoint_dir

            s = schema.loads((checkpoint_dir(mc.init_dir) / "config.json").read_text(encoding="utf-8"))
            layers = mc.public_layers or s["num_hidden_layers"]
            vocab = s["vocab_size"] + (config.vocab.max_new_tokens if config.vocab.source == "public+dp" else 0)
            return s["hidden_size"], layers, s["intermediate_size"], vocab
        from dpbert.network.bert import PRESETS

        s = dict(PRESETS.get(mc.preset, {}))
        for name in ("hidden_size", "num_layers", "intermediate_size"):
            if getattr(mc, name) is not None:
                s[name] = getattr(mc, name)
        return s["hidden_size"], s["num_layers"], s["intermediate_size"], config.vocab.size
    except (OSError, KeyError, ValueError, ImportError):
        return None


def _target_noise_multiplier(config, n: int, dp_count: bool, target_epsilon: float, as_json: bool,
                             target: str = "whole") -> int:
    """The ``training.noise_multiplier`` σ whose PLANNED ledger records ε ≤ ``target_epsilon``:
    ``target`` whole — the whole run's ε (``epsilon_total_pld``: vocabulary + DP count + training,
    ``accountant.noise_multiplier_for_whole_target``); training — ε_T, the ledger's ``epsilon_train`` (PLD
    at δ_T = training.delta: the DP-SGD steps at σ_eff, gradient + DP diagnostics, and the DP count
    when the run draws one). The printed numbers are ``planned_ledger`` at the printed σ; exit 3
    when that whole run is over ``privacy.epsilon_budget``."""
    import dataclasses

    from dpbert.accounting import accountant

    if target == "whole":
        sigma = accountant.noise_multiplier_for_whole_target(config, target_epsilon, n, dp_count)
    else:
        sigma = accountant.noise_multiplier_for_planned_target(config, target_epsilon, n, dp_count=dp_count)
    configured = dataclasses.replace(config, training=dataclasses.replace(config.training, noise_multiplier=sigma))
    planned = accountant.planned_ledger(configured, n, dp_count=dp_count)
    train = [r for r in planned["train_events"] if r.get("mechanism") == "dp_sgd"][0]
    key = "epsilon_total_pld" if target == "whole" else "epsilon_train"
    out = {"target": key, "target_epsilon": target_epsilon, "noise_multiplier": sigma,
           "effective_noise_multiplier": train["noise_multiplier"],
           "sampling_probability": planned["sampling_probability"], "steps": planned["steps"],
           "delta": planned["delta_train"], "sampling": planned["sampling"],
           "dataset_size": planned["dataset_size"], "dataset_size_source": planned["dataset_size_source"],
           "epsilon_pld": planned[key], "epsilon_train": planned["epsilon_train"],
           "epsilon_train_rdp": planned["epsilon_train_rdp"], "epsilon_vocab": planned["epsilon_vocab"],
           "epsilon_total_pld": planned["epsilon_total_pld"], "delta_total": planned["delta"],
           "epsilon_budget": planned["epsilon_budget"], "within_budget": planned["within_budget"]}
    if as_json:
        print_json(out)
    else:
        count = (f" + the DP count (σ_c = {config.training.count_noise_multiplier:g})" if dp_count else "")
        diagnostics = " with its DP diagnostics" if config.training.dp_diagnostics else ""
        aim = ("the whole run's ε (vocabulary + count + training)" if target == "whole" else "ε_T (training)")
        print(f"training.noise_multiplier σ = {sigma:.4f} meets {aim} ≤ {target_epsilon:g}: the planned ledger records "
              f"ε_T = {planned['epsilon_train']:.6g} (PLD at δ_T = {fmt_delta(planned['delta_train'])}; DP-SGD at "
              f"σ_eff = {train['noise_multiplier']:.4f}{diagnostics}{count}; q = {planned['sampling_probability']:.4g}, "
              f"{planned['steps']} steps, {planned['sampling']} sampling)")
        budget = planned["epsilon_budget"]
        print(f"whole run (vocabulary included): ε = {planned['epsilon_total_pld']:.4g} (PLD) at δ = "
              f"{fmt_delta(planned['delta'])}" + ("" if budget is None else
                                          f"; budget {budget:g}: {'within' if planned['within_budget'] else 'OVER BUDGET'}"))
    return exit_codes.OK if planned["within_budget"] else exit_codes.OVER_BUDGET


_DURATION = {"s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}


def _compute_budget(text: str, tuples_per_second: Optional[float]) -> int:
    """``--compute``: tuple-steps (an integer), or a duration (``2h``, ``90min``, ``600s``) times
    the tuples per second."""
    import re

    from dpbert.accounting.shape import budget_tuple_steps

    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(s|sec|min|m|h)\s*", str(text))
    try:
        if found:
            return budget_tuple_steps(seconds=float(found.group(1)) * _DURATION[found.group(2)],
                                      tuples_per_second=tuples_per_second)
        value = float(text)
        if value != int(value):
            raise ValueError
        return budget_tuple_steps(compute=int(value))
    except ValueError:
        raise UserError(f"--compute {text}: give tuple-steps (an integer >= 1, B·T·k) or a time such as 2h, "
                        f"90min or 600s") from None


def _shape_rate(config, plan, args) -> tuple:
    """(tuples per second, how it was found): ``--tuples-per-second``, else this machine's ESTIMATE
    for the configured model (``training_time_estimate``: ±3×)."""
    if args.tuples_per_second is not None:
        if not args.tuples_per_second > 0:
            raise UserError(f"--tuples-per-second must be > 0, got {args.tuples_per_second}")
        return args.tuples_per_second, "--tuples-per-second"
    estimate = training_time_estimate(config, plan)
    if estimate is None:
        return None, None
    k = plan.max_contributions if config.privacy.unit == "patient" else 1
    return plan.batch_size * k / estimate["step_seconds"], "an ESTIMATE for this machine (±3×)"


def _plan_shape(config, plan, dp_count: bool, args) -> int:
    """``dpbert budget --target-epsilon E --compute N [--min-steps T]``: the batch, steps and σ with
    the smallest σ/B for ε_T = E (``dpbert.accounting.shape``), the alternatives weighed, and the
    planned ledger of the chosen shape (exit 3 when that whole run is over the budget)."""
    import dataclasses

    from dpbert.accounting import shape
    from dpbert.accounting.accountant import planned_ledger
    from dpbert.accounting.sigma import accounted_sigma
    from pipeline import guard

    if args.target_epsilon is None or args.compute is None:
        raise UserError("--compute and --min-steps go with --target-epsilon E and --compute N (tuple-steps or a time)")
    if config.training.non_private or dp_count:
        raise UserError("--compute plans DP-SGD at a PUBLIC n: " + (
            "training.non_private is set" if config.training.non_private else
            "set training.dataset_patients (privacy.unit = patient) or training.dataset_size"))
    if args.check_corpus:
        sizes = corpus_sizes(config, args.check_corpus)  # operator-only, as budget --corpus
        if sizes["match"] is False:
            raise UserError(f"corpus: {sizes['message']}")
    rate, how = _shape_rate(config, plan, args)
    tc, k = config.training, plan.max_contributions if config.privacy.unit == "patient" else 1
    chosen = shape.plan_shape(plan.dataset_size, args.target_epsilon, tc.delta, _compute_budget(args.compute, rate),
                              shape.ShapeGrid(args.min_steps or shape.DEFAULT_MIN_STEPS, k,
                                              multiple=tc.replicas * tc.accumulation_steps),
                              sigma_scale=accounted_sigma(1.0, tc), tuples_per_second=rate)
    best = chosen.chosen
    configured = dataclasses.replace(config, training=dataclasses.replace(
        tc, batch_size=best.batch_size, steps=best.steps, epochs=None, noise_multiplier=best.noise_multiplier))
    planned = planned_ledger(configured, guard.public_dataset_size(config, args.examples))
    out = {**chosen.to_dict(), "unit": config.privacy.unit, "rate_source": how,
           "epsilon_train": planned["epsilon_train"], "epsilon_total_pld": planned["epsilon_total_pld"],
           "delta_total": planned["delta"], "epsilon_budget": planned["epsilon_budget"],
           "within_budget": planned["within_budget"]}
    if args.json:
        print_json(out)
    else:
        print("\n".join(_shape_lines(chosen, out, config.privacy.unit)))
    return exit_codes.OK if planned["within_budget"] else exit_codes.OVER_BUDGET


def _shape_lines(plan, out: dict, unit: str) -> list:
    units = "patients" if unit == "patient" else "tuples"
    lines = [f"shapes for ε_T ≤ {plan.target_epsilon:g} (DP-SGD, PLD at δ_T = {fmt_delta(plan.delta)}) over n = "
             f"{plan.dataset_size:,} {units}, compute ≤ {plan.budget:,} tuple-steps (B·T·k), T ≥ {plan.min_steps}; "
             f"chosen: the smallest σ/B",
             f"  {'B':>7} {'T':>6} {'k':>3} {'σ':>8} {'σ_eff':>8} {'σ/B':>10} {'σ/(B√T)':>10} {'ε_T':>7} "
             f"{'B·T·k':>12} {'time':>8}"]
    for s in plan.alternatives:
        mark = "→" if s == plan.chosen else " "
        time = "-" if s.seconds is None else _duration(s.seconds)
        lines.append(f"{mark} {s.batch_size:>7} {s.steps:>6} {s.k:>3} {s.noise_multiplier:>8.4f} "
                     f"{s.sigma_accounted:>8.4f} {s.noise_batch_ratio:>10.3e} {s.noise_over_steps:>10.3e} "
                     f"{s.epsilon:>7.4f} {s.tuple_steps:>12,} {time:>8}")
    c = plan.chosen
    lines.append(f"chosen: --set training.batch_size={c.batch_size} --set training.steps={c.steps} "
                 f"--set training.noise_multiplier={c.noise_multiplier:.4f}")
    if out["rate_source"]:
        lines.append(f"time: at {c.tuple_steps / c.seconds:,.0f} tuples/s ({out['rate_source']})")
    budget = out["epsilon_budget"]
    lines.append(f"planned ledger of the chosen shape: ε_T = {out['epsilon_train']:.4g}, whole run (vocabulary "
                 f"included) ε = {out['epsilon_total_pld']:.4g} (PLD) at δ = {fmt_delta(out['delta_total'])}"
                 + ("" if budget is None else f"; budget {budget:g}: "
                    f"{'within' if out['within_budget'] else 'OVER BUDGET'}"))
    return lines
