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


if __name__ == "__main__":
    sys.exit(main())
