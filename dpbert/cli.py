"""The ``dpbert`` command line: thin over ``dpbert.*`` and ``pipeline.*``.

Exit codes: 0 success; 2 bad input (configuration, corpus, parameters) with a message naming the
field/file; 3 the planned ε exceeds ``privacy.epsilon_budget`` (nothing was written).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from typing import List, Optional

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from dpbert.config import ConfigError, load_config  # noqa: E402
from dpbert.data.readers import CorpusError  # noqa: E402

EXIT_BAD_INPUT = 2
EXIT_OVER_BUDGET = 3

log = logging.getLogger("dpbert")


def _json_default(value):
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _clean(obj):
    """Replace non-finite floats by strings so the output is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "inf" if obj > 0 else ("-inf" if obj < 0 else "nan")
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def print_json(obj):
    print(json.dumps(_clean(obj), indent=2, sort_keys=True, default=_json_default))


def _config_args(p: argparse.ArgumentParser):
    p.add_argument("--config", help="YAML configuration file (default: the built-in demo preset "
                                    "for `run`, the paper's defaults otherwise)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one configuration value (repeatable), e.g. --set vocab.sigma=50")


def _load(args, preset: Optional[str] = None):
    overrides = list(args.overrides)
    if getattr(args, "corpus", None):
        overrides.append(f"corpus.path={args.corpus}")
    if getattr(args, "output", None):
        overrides.append(f"pipeline.output_dir={args.output}")
    return load_config(args.config, overrides, preset=None if args.config else preset)


def _setup_logging(verbose: bool):
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("dpbert").setLevel(logging.INFO)
    # absl (TFX) logs at INFO through its own handler; keep it for component progress.
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.INFO if verbose else absl_logging.WARNING)
    except ImportError:  # pragma: no cover
        pass


# --- commands -------------------------------------------------------------------------------

def cmd_run(args) -> int:
    config = _load(args, preset="demo")
    from pipeline import guard
    planned = guard.check_budget(config)
    if planned is not None and not planned["within_budget"]:
        print(guard.over_budget_message(planned), file=sys.stderr)
        return EXIT_OVER_BUDGET
    from pipeline.local_runner import run_local

    where = run_local(config)
    print(f"artifacts:         {where['pipeline_root']}")
    print(f"ML Metadata store: {where['metadata']}")
    print(f"inspect with:      dpbert report --output {config.pipeline.output_dir}")
    return 0


def cmd_synth(args) -> int:
    from dpbert.data.synthetic import generate_notes, write_jsonl

    n = write_jsonl(generate_notes(args.patients, args.admissions, args.notes, args.seed), args.output)
    print(f"wrote {n} synthetic notes to {args.output}")
    return 0


def cmd_report(args) -> int:
    from dpbert import metadata, report

    try:
        path = metadata.metadata_path_for(args.output, args.metadata)
        run = metadata.get_run(metadata.open_store(path), args.run)
    except (FileNotFoundError, LookupError) as err:
        print(f"dpbert report: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    built = report.build_report(run)
    if args.json:
        print_json(built)
    else:
        print(report.format_report(built))
    return 0


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
    return 0


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
    return 0


def cmd_privacy_noise_check(args) -> int:
    from dpbert.model.noise_check import run_noise_check_cli

    return run_noise_check_cli(args)


def cmd_budget(args) -> int:
    from dpbert.privacy import accountant

    config = _load(args, preset=None)
    if args.target_epsilon is not None:
        t = config.training
        n = args.examples or t.dataset_size
        if n is None:
            from dpbert.data.corpus import count_tuples

            n = count_tuples(config.corpus, config.privacy.tuple_words)
        steps = t.steps if t.steps is not None else accountant.steps_for(n, t.batch_size, t.epochs)
        q = min(1.0, t.batch_size / n)
        sigma = accountant.noise_multiplier_for_target(args.target_epsilon, q, steps, t.delta, t.sampling)
        out = {"target_epsilon": args.target_epsilon, "noise_multiplier": sigma, "sampling_probability": q,
               "steps": steps, "delta": t.delta, "sampling": t.sampling,
               "epsilon_pld": accountant.dpsgd_epsilon(sigma, q, steps, t.delta, t.sampling)}
        if args.json:
            print_json(out)
        else:
            print(f"noise multiplier σ = {sigma:.4f} gives ε_T = {out['epsilon_pld']:.4g} ≤ {args.target_epsilon} "
                  f"(q = {q:.4g}, {steps} steps, δ = {t.delta:.3g}, {t.sampling} sampling)")
        return 0
    from pipeline import guard

    planned = guard.planned(config, dataset_size=args.examples)
    if args.json:
        print_json({k: v for k, v in planned.items() if k not in ("vocab_event", "train_events")})
    else:
        print(guard.planned_statement(planned))
    return 0 if planned["within_budget"] else EXIT_OVER_BUDGET


def cmd_reserved(args) -> int:
    print(f"dpbert {args.command}: not available in this version yet", file=sys.stderr)
    return EXIT_BAD_INPUT


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpbert",
        description="Differentially private BERT pre-training on clinical text (a TFX pipeline).")
    parser.add_argument("-v", "--verbose", action="store_true", help="log INFO messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("run", help="run the DAG locally (LocalDagRunner, Beam DirectRunner)")
    _config_args(p)
    p.add_argument("--corpus", help="corpus path (directory of .txt, .jsonl or .csv); "
                                    "default: the embedded synthetic corpus")
    p.add_argument("--output", help="output directory (artifacts + ML Metadata sqlite)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("synth", help="write the embedded synthetic clinical corpus as JSONL")
    p.add_argument("--output", required=True)
    p.add_argument("--patients", type=int, default=40)
    p.add_argument("--admissions", type=int, default=2)
    p.add_argument("--notes", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("report", help="the latest (or given) run's results, read from ML Metadata")
    p.add_argument("--output", help="the run's output directory (default demo_output)")
    p.add_argument("--metadata", help="path of the ML Metadata sqlite store (instead of --output)")
    p.add_argument("--run", help="pipeline run id (default: the latest)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("privacy", help="privacy calculators: histogram, dpsgd, noise-check")
    psub = p.add_subparsers(dest="privacy_command", metavar="CALCULATOR")
    psub.required = True
    q = psub.add_parser("histogram", help="threshold and (ε, δ) of the DP vocabulary histogram")
    q.add_argument("--sigma", type=float, required=True, help="noise standard deviation per count")
    q.add_argument("--delta", type=float, required=True, help="total δ of the histogram")
    q.add_argument("--tuple-words", type=int, default=256, help="N, words per tuple (default 256)")
    q.add_argument("--threshold-mode", choices=("correct", "paper"), default="correct")
    q.add_argument("--max-contributions", type=int, default=1,
                   help="k tuples per privacy unit (patient-level unit); default 1")
    q.add_argument("--threshold-delta-fraction", type=float, default=1.0,
                   help="fraction of δ given to the threshold (1 = the paper's Corollary 1; "
                        "0.5 = Google DP library's split)")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_privacy_histogram)
    q = psub.add_parser("dpsgd", help="ε of DP-SGD (RDP and PLD accountants)")
    q.add_argument("--examples", type=int, required=True, help="n, training examples (tuples)")
    q.add_argument("--batch-size", type=int, required=True, help="B, logical batch size")
    q.add_argument("--noise-multiplier", type=float, required=True)
    q.add_argument("--delta", type=float, required=True)
    g = q.add_mutually_exclusive_group(required=True)
    g.add_argument("--epochs", type=float)
    g.add_argument("--steps", type=int)
    q.add_argument("--sampling", choices=("poisson", "shuffle"), default="poisson")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_privacy_dpsgd)
    q = psub.add_parser("noise-check", help="measure the DP-SGD noise std of the real training step")
    q.add_argument("--replicas", type=int, default=1, help="P, replicas (logical CPU devices here)")
    q.add_argument("--accumulation", type=int, default=1, help="T, accumulation micro-steps")
    q.add_argument("--noise-multiplier", type=float, required=True)
    q.add_argument("--clip", type=float, required=True)
    q.add_argument("--batch-size", type=int, required=True, help="B, logical batch size")
    q.add_argument("--steps", type=int, default=200, help="noisy steps to measure over")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_privacy_noise_check)

    p = sub.add_parser("budget", help="the planned ε of a configuration against privacy.epsilon_budget "
                                      "(exit 3 when over), or the σ that meets --target-epsilon")
    _config_args(p)
    p.add_argument("--examples", type=int, help="n, tuples to plan with (default: training.dataset_size, "
                                                "else counted from the corpus)")
    p.add_argument("--target-epsilon", type=float, help="print the training noise multiplier that meets "
                                                        "this ε_T instead")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_budget)

    from kubeflow.runner import add_compile_parser  # Vertex AI / KFP v2: docs/running-on-vertex.md

    add_compile_parser(sub)

    from dpbert.local_privacy.cli import add_privatize_parser  # dχ-privacy (local, metric DP)

    add_privatize_parser(sub)

    try:  # read-only web UI over ML Metadata (dashboard/; web dependencies: the `dashboard` extra)
        from dashboard.cli import add_dashboard_parser
    except ImportError:  # an install without the dashboard package keeps the reserved stub below
        pass
    else:
        add_dashboard_parser(sub)

    for name, text in (("privacy", "privacy calculators (histogram, dpsgd, noise-check)"),
                       ("budget", "the planned ε of a configuration against its budget"),
                       ("report", "the latest run's results from ML Metadata"),
                       ("compile", "compile the DAG for Kubeflow Pipelines / Vertex AI"),
                       ("dashboard", "serve the read-only dashboard"),
                       ("evaluate", "evaluate a model (NER)"),
                       ("privatize", "dχ-privatize a text file")):
        if name not in sub.choices:
            sub.add_parser(name, help=text + " (reserved)").set_defaults(func=cmd_reserved)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    try:
        return args.func(args)
    except (ConfigError, CorpusError) as err:
        print(f"dpbert {args.command}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ValueError as err:
        # Parameter errors of the calculators (dpbert.privacy raises ValueError naming the
        # parameter). `run` lets component failures propagate with their traceback instead.
        if args.command == "run":
            raise
        print(f"dpbert {args.command}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
