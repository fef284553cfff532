"""The DP vocabulary's Beam job as a command: ``python -m beam_jobs.dp_histogram``.

A thin entry over the core: it reads a configuration, builds a Beam pipeline from its ``beam``
section (plus any Beam options after ``--``) and runs the vocabulary stage
(``dpbert.stages.vocabulary.dp_vocabulary``) over an ingested tuples folder. The job's code is
``dpbert.vocab.beam_histogram``; σ and the threshold come from the configuration through
``dpbert.privacy.histogram`` and the histogram is reserved in the dataset's ledger before the
tuples are read, as in the DAG. Nothing here computes a privacy number.

Exit codes (``dpbert.exit_codes``): 0, 2 for bad input (configuration, tuples, parameters; one
line naming it, nothing written), 3 when the dataset's budget refuses the histogram.
docs/scaling-out.md ("The vocabulary's Beam job").
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from dpbert import exit_codes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m beam_jobs.dp_histogram",
        description="Run the DP vocabulary (histogram + WordPiece) on a Beam runner; Beam options after --.")
    parser.add_argument("--config", required=True, help="a dpbert configuration file (YAML)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override a configuration field (repeatable)")
    parser.add_argument("--tuples", required=True, help="the ingested tuples folder (any dpbert.storage URI)")
    parser.add_argument("--vocabulary", required=True, help="the output vocabulary folder")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    beam_options = argv[argv.index("--") + 1:] if "--" in argv else []
    args = build_parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    from dpbert.accounting.gate import BudgetRefused
    from dpbert.config import ConfigError, load_config

    try:
        config = load_config(args.config, args.set)
        return _run(config, args.tuples, args.vocabulary, beam_options)
    except BudgetRefused as err:
        print(f"dp_histogram: {err}", file=sys.stderr)
        return exit_codes.OVER_BUDGET
    except (ConfigError, ValueError, FileNotFoundError) as err:  # CorpusError is a ValueError
        print(f"dp_histogram: {err}", file=sys.stderr)
        return exit_codes.BAD_INPUT


def _run(config, tuples: str, vocabulary: str, beam_options: List[str]) -> int:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from dpbert.accounting.target import ledger_target_json
    from dpbert.privacy.numbers import fmt_delta, fmt_epsilon
    from dpbert.stages.vocabulary import dp_vocabulary

    pipeline = beam.Pipeline(options=PipelineOptions(config.beam.pipeline_args() + beam_options))
    result = dp_vocabulary(pipeline, tuples, vocabulary, config.vocab, config.privacy,
                           checkpoint_dir=config.model.init_dir,
                           ledger_target=ledger_target_json(config, with_plan=False))
    props = result.properties
    print(f"vocabulary: {props['vocab_size']} tokens, {props.get('words_kept', 0)} DP words released, written to "
          f"{vocabulary}; the histogram's ε = {fmt_epsilon(props['epsilon'])} at δ = {fmt_delta(props.get('delta'))}")
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
