"""The commands of ``dpbert`` over the core and the DAG: run, synth, report, release, privacy, budget.

Each ``cmd_*`` takes the parsed arguments and returns an exit code (``dpbert.exit_codes``);
configuration and corpus errors propagate to ``dpbert_cli.main``, which maps them to 2.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

from dpbert import exit_codes
from dpbert.config import load_config
from dpbert_cli.output import print_error, print_json


def load(args, preset: Optional[str] = None):
    """The configuration of ``--config`` (else ``preset``), ``--set`` overrides, and the
    ``--corpus`` / ``--output`` shortcuts."""
    overrides = list(args.overrides)
    if getattr(args, "corpus", None):
        overrides.append(f"corpus.path={args.corpus}")
    if getattr(args, "output", None):
        overrides.append(f"pipeline.output_dir={args.output}")
    return load_config(args.config, overrides, preset=None if args.config else preset)


def cmd_run(args) -> int:
    config = load(args, preset="demo")
    from pipeline import guard

    planned = guard.check_budget(config)
    if planned is not None and not planned["within_budget"]:
        print(guard.over_budget_message(planned), file=sys.stderr)
        return exit_codes.OVER_BUDGET
    from pipeline.local_runner import run_local

    where = run_local(config)
    print(f"artifacts:         {where['pipeline_root']}")
    print(f"ML Metadata store: {where['metadata']}")
    print(f"inspect with:      dpbert report --output {config.pipeline.output_dir}")
    return exit_codes.OK


def cmd_synth(args) -> int:
    from dpbert.data.synthetic import generate_notes, write_jsonl

    n = write_jsonl(generate_notes(args.patients, args.admissions, args.notes, args.seed), args.output)
    print(f"wrote {n} synthetic notes to {args.output}")
    return exit_codes.OK


def _run_of(args):
    """The run of ``--output`` / ``--metadata`` and ``--run`` (the store opened read-only)."""
    from dpbert import metadata

    path = metadata.metadata_path_for(args.output, args.metadata)
    return metadata.get_run(metadata.open_store(path), args.run)


def cmd_report(args) -> int:
    from dpbert import report

    try:
        run = _run_of(args)
    except (FileNotFoundError, LookupError) as err:
        print_error("report", err)
        return exit_codes.BAD_INPUT
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

    try:
        run = _run_of(args)
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

    report = dpsgd_report(args.examples, args.batch_size, args.noise_multiplier, args.delta,
                          epochs=args.epochs, steps=args.steps, sampling=args.sampling)
    if args.json:
        print_json(report)
    else:
        print(f"DP-SGD ({report['sampling']} sampling, q = {report['sampling_probability']:.4g}, "
              f"{report['steps']} steps, σ = {report['noise_multiplier']}): "
              f"ε = {report['epsilon_pld']:.4g} (PLD), {report['epsilon_rdp']:.4g} (RDP) "
              f"at δ = {report['delta']:.3g}")
    return exit_codes.OK


def cmd_privacy_noise_check(args) -> int:
    from dpbert.model.noise_check import run_noise_check_cli

    return run_noise_check_cli(args)


def cmd_budget(args) -> int:
    from pipeline import guard

    config = load(args, preset=None)
    if args.target_epsilon is not None:
        return _target_noise_multiplier(config, guard.training_plan(config, dataset_size=args.examples),
                                        args.target_epsilon, args.json)
    planned = guard.planned(config, dataset_size=args.examples)
    if args.json:
        print_json({k: v for k, v in planned.items() if k not in ("vocab_event", "train_events")})
    else:
        print(guard.planned_statement(planned))
    return exit_codes.OK if planned["within_budget"] else exit_codes.OVER_BUDGET


def _target_noise_multiplier(config, plan, target_epsilon: float, as_json: bool) -> int:
    """The training σ whose ε_T meets ``target_epsilon`` under ``plan`` (q and steps)."""
    from dpbert.privacy import accountant

    t = config.training
    q, steps = plan.sampling_probability, plan.steps
    sigma = accountant.noise_multiplier_for_target(target_epsilon, q, steps, t.delta, t.sampling)
    out = {"target_epsilon": target_epsilon, "noise_multiplier": sigma, "sampling_probability": q,
           "steps": steps, "delta": t.delta, "sampling": t.sampling,
           "epsilon_pld": accountant.dpsgd_epsilon(sigma, q, steps, t.delta, t.sampling)}
    if as_json:
        print_json(out)
    else:
        print(f"noise multiplier σ = {sigma:.4f} gives ε_T = {out['epsilon_pld']:.4g} ≤ {target_epsilon} "
              f"(q = {q:.4g}, {steps} steps, δ = {t.delta:.3g}, {t.sampling} sampling)")
    return exit_codes.OK
