"""``dpbert tune``: the learning rate and clip norm of a configuration's planned DP-SGD run, chosen on
a PUBLIC proxy (``dpbert.tuning``; docs/training.md, "Choosing the learning rate and clip norm
without spending ε"). No ε is spent: nothing private is read, nothing is charged.

It plans the run from the configuration's public numbers (B, T, σ, ε_T over the public n), trains
every grid point on the proxy at batch b with σ_b = σ·b/B, writes the choice with every row and its
provenance to ``--out`` (strict JSON, any storage URI) and prints the row table. ``dpbert run
--tuned FILE`` applies the file when the run starts: ``--set training.learning_rate=… --set
training.clip_norm=…`` at the place ``--tuned`` stands among the ``--set`` options (a later ``--set`` wins), plus
``training.tuned_from`` (the file, its sha256 and its provenance) where the configuration has it.
Exit 2: a configuration without a public n, a bad grid or proxy batch, an unreadable ``--tuned`` file.
"""
from __future__ import annotations

import argparse
import dataclasses

from dpbert import exit_codes
from dpbert_cli.args import config_args
from dpbert_cli.output import print_json


def _floats(text: str):
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def add_tune_parser(sub):
    from dpbert.tuning import proxy, tune

    p = sub.add_parser("tune", help="choose training.learning_rate and training.clip_norm on a public proxy "
                                    "(no ε spent); writes the choice for `dpbert run --tuned FILE`",
                       description="Plan the configuration's DP-SGD run from its public numbers, train every "
                                   "(learning rate, clip norm) of the grid on a PUBLIC proxy at a small batch b "
                                   "with σ_b = σ·b/B (the same noise on the mean gradient, the same steps), and "
                                   "write the one with the lowest held-out proxy MLM loss. Reads no private data.")
    config_args(p)
    p.add_argument("--proxy", choices=proxy.SOURCES, default="synthetic",
                   help="synthetic: the synthetic clinical generator at a public seed (default); public: the "
                        "shipped BC5CDR abstracts")
    p.add_argument("--out", default="tuned.json", metavar="FILE", help="where to write the choice (default tuned.json)")
    p.add_argument("--proxy-batch", type=int, metavar="b", help=f"the proxy's batch (default min(B, {tune.PROXY_BATCH}))")
    p.add_argument("--learning-rates", type=_floats, metavar="LR,…",
                   help=f"the grid's learning rates (default {','.join(map(str, tune.LEARNING_RATES))})")
    p.add_argument("--clip-norms", type=_floats, metavar="C,…",
                   help=f"the grid's clip norms (default {','.join(map(str, tune.CLIP_NORMS))})")
    p.add_argument("--repeats", type=int, default=1, help="noise seeds per grid point, losses averaged (default 1)")
    p.add_argument("--seed", type=int, default=proxy.PROXY_SEED,
                   help=f"the public seed of the synthetic proxy and of the noise (default {proxy.PROXY_SEED})")
    p.add_argument("--patients", type=int, help=f"synthetic proxy: patients to train on (default "
                                                f"{proxy.PROXY_PATIENTS}; a fifth as many are held out)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=cmd_tune)


class TunedAction(argparse.Action):
    """``--tuned FILE``: remembers where it stands among the ``--set`` options; the file is read when
    the command runs (:func:`apply_tuned`), never while the command line is parsed."""

    def __call__(self, parser, namespace, values, option_string=None):
        tuned = list(getattr(namespace, "tuned_at", None) or [])
        tuned.append((len(getattr(namespace, "overrides", None) or []), values))
        namespace.tuned_at = tuned
        if not tuned[:-1]:  # the command, once: apply the files, then run it
            command = namespace.func

            def run_tuned(args):
                apply_tuned(args)
                return command(args)

            namespace.func = run_tuned
        setattr(namespace, self.dest, values)


def apply_tuned(args) -> None:
    """Insert each ``--tuned`` file's overrides (``dpbert.tuning.tune.tuned_overrides``) where it
    stood among the ``--set`` options; a file that cannot be used is a ``UserError`` (exit 2)."""
    from dpbert.config import TrainingConfig
    from dpbert.tuning.tune import tuned_overrides
    from dpbert_cli.commands import UserError

    fields = [f.name for f in dataclasses.fields(TrainingConfig)]
    overrides = list(args.overrides)
    for at, path in reversed(getattr(args, "tuned_at", None) or []):
        try:
            overrides[at:at] = tuned_overrides(path, fields)
        except OSError as err:
            raise UserError(f"--tuned {path}: {err.strerror or 'cannot be read'}") from None
        except ValueError as err:  # names the file
            raise UserError(f"--tuned {err}") from None
    args.overrides, args.tuned_at = overrides, []


def add_tuned_argument(p: argparse.ArgumentParser) -> None:
    """``dpbert run --tuned FILE``."""
    p.add_argument("--tuned", metavar="FILE", action=TunedAction,
                   help="apply the learning rate and clip norm `dpbert tune` chose (and record where they came from)")


def _table(result) -> str:
    lines = [f"{'learning rate':>14} {'clip norm':>10} {'held-out loss':>14}"]
    for row in result.rows:
        chosen = (row["learning_rate"], row["clip_norm"]) == (result.choice["learning_rate"], result.choice["clip_norm"])
        lines.append(f"{row['learning_rate']:>14g} {row['clip_norm']:>10g} {row['heldout_loss']:>14.4f}"
                     + ("  ← chosen" if chosen else ""))
    p = result.provenance
    plan = p["plan"]
    lines.append(f"proxy {p['proxy']['source']}: b = {p['proxy_batch']}, σ_b = {p['proxy_noise_multiplier']:.6g}, "
                 f"T = {p['steps']} (planned B = {plan['batch_size']}, σ = {plan['noise_multiplier']:g}, "
                 f"ε_T = {plan['epsilon_train']:.4g} at δ = {plan['delta']:g}); loss: nats")
    return "\n".join(lines)


def cmd_tune(args) -> int:
    from dpbert import storage
    from dpbert.tuning import tune
    from dpbert_cli.commands import check_output_file, load

    config = load(args)
    if not storage.is_remote(args.out):
        check_output_file("--out", args.out)
    grid = tune.Grid(args.learning_rates or tune.LEARNING_RATES, args.clip_norms or tune.CLIP_NORMS)
    result = tune.tune(config, args.proxy, grid=grid, proxy_batch=args.proxy_batch, seed=args.seed,
                       repeats=args.repeats, patients=args.patients)
    tune.write_tuned(result, args.out)
    if args.json:
        print_json(result.to_dict())
    else:
        print(_table(result))
        print(f"wrote {args.out}: dpbert run --tuned {args.out}")
    return exit_codes.OK
