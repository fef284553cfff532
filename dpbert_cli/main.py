"""``dpbert``: the argument parser, logging, and the mapping of errors to exit codes.

Exit codes (``dpbert.exit_codes``): 0 success; 2 bad input (configuration, corpus, parameters,
files) with a one-line message naming the field/file; 3 the planned ε exceeds
``privacy.epsilon_budget`` (nothing was written); 4 the environment refused (a port in use, a
``gs://`` URI without usable Google Cloud credentials: one line naming the URI and the fix);
5 a privacy audit failed; 130 interrupted. No user error prints a Python traceback; a closed
stdout (``dpbert report | head``) ends the command quietly.

Logs are quiet by default: TensorFlow's C++ log (``TF_CPP_MIN_LOG_LEVEL=3``, set before anything
imports TensorFlow) and the known harmless warnings of TFX/absl, Beam's workers and Keras
(``QUIET_WARNINGS``) are hidden unless ``-v/--verbose``.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, Optional

from dpbert import exit_codes, storage
from dpbert.config import ConfigError
from dpbert.data.readers import CorpusError
from dpbert_cli import commands
from dpbert_cli.args import config_args
from dpbert_cli.output import print_error

#: (logger name prefix, message fragment) of warnings that say nothing actionable to a user.
QUIET_WARNINGS = (
    ("absl", "ArtifactQuery.property_predicate is not supported"),
    ("apache_beam", "semi_persistent_directory"),
    ("apache_beam", "Discarding unparseable args"),
    ("apache_beam", "python-snappy"),
    ("tensorflow", "compiled metrics have yet to be built"),
    ("tensorflow", "triggered tf.function retracing"),
    # google.auth probing for a Compute Engine metadata server off Google Cloud: a missing
    # credential is reported in one line instead (storage.CredentialsMissing, exit 4).
    ("google.auth", "Compute Engine Metadata server unavailable"),
    ("google.auth", "Authentication failed using Compute Engine authentication"),
)
#: Without --verbose only these dpbert loggers speak at INFO: training progress (one line every
#: 30 s off a terminal). Stage summaries are in the report; the ε is printed at the end of a run.
PROGRESS_LOGGERS = ("dpbert.engine.train",)


class QuietFilter(logging.Filter):
    """Drops the records of ``QUIET_WARNINGS`` (attached to the root handlers unless verbose)."""

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        for prefix, fragment in QUIET_WARNINGS:
            if (name == prefix or name.startswith(prefix + ".")) and fragment in record.getMessage():
                return False
        return True


def package_version() -> str:
    """The installed version of the ``dpbert`` distribution (setup.py), or ``unknown``."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("dpbert")
    except PackageNotFoundError:  # pragma: no cover - running from a checkout without install
        return "unknown"


def _quiet_native_logs(verbose: bool):
    """Before TensorFlow is imported: its C++ log (the CUDA "Unable to register cuFFT/cuDNN/
    cuBLAS factory" lines among others) only with --verbose. Inherited by Beam's workers."""
    if verbose:
        return
    try:
        level = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        level = 0
    if level < 3:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"


def _setup_logging(verbose: bool):
    _quiet_native_logs(verbose)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not verbose:
        for handler in logging.getLogger().handlers:
            if not any(isinstance(f, QuietFilter) for f in handler.filters):
                handler.addFilter(QuietFilter())
    logging.getLogger("dpbert").setLevel(logging.INFO if verbose else logging.WARNING)
    for name in PROGRESS_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
    # absl (TFX) logs at INFO through its own handler; keep it for component progress.
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.INFO if verbose else absl_logging.WARNING)
    except ImportError:  # pragma: no cover
        pass


def _add_privacy_parser(sub):
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
    q.set_defaults(func=commands.cmd_privacy_histogram)
    q = psub.add_parser("dpsgd", help="ε of DP-SGD (RDP and PLD accountants), per tuple or per patient")
    q.add_argument("--unit", choices=("tuple", "patient"), default="tuple",
                   help="unit of privacy: tuple (default: --examples, --batch-size) or patient (user-level "
                        "DP-SGD: --patients, --patients-per-step; the ε is per patient)")
    q.add_argument("--examples", type=int, help="n, training examples (tuples); --unit tuple")
    q.add_argument("--batch-size", type=int, help="B, logical batch size (tuples); --unit tuple")
    q.add_argument("--patients", type=int, metavar="P",
                   help="public number of patients trained on; --unit patient")
    q.add_argument("--patients-per-step", type=int, metavar="B",
                   help="expected patients per step (q = B/P); --unit patient")
    q.add_argument("--max-tuples-per-patient", type=int, default=8, metavar="K",
                   help="k, tuples a sampled patient contributes per step (recorded; the per-patient "
                        "ε does not depend on it); --unit patient, default 8")
    q.add_argument("--noise-multiplier", type=float, required=True)
    q.add_argument("--delta", type=float, required=True)
    g = q.add_mutually_exclusive_group(required=True)
    g.add_argument("--epochs", type=float)
    g.add_argument("--steps", type=int)
    q.add_argument("--sampling", choices=("poisson", "shuffle"), default="poisson")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=commands.cmd_privacy_dpsgd)
    q = psub.add_parser("noise-check", help="measure the DP-SGD noise std of the real training step")
    q.add_argument("--replicas", type=int, default=1, help="P, replicas (logical CPU devices here)")
    q.add_argument("--accumulation", type=int, default=1, help="T, accumulation micro-steps")
    q.add_argument("--noise-multiplier", type=float, required=True)
    q.add_argument("--clip", type=float, required=True)
    q.add_argument("--batch-size", type=int, required=True, help="B, logical batch size")
    q.add_argument("--steps", type=int, default=200, help="noisy steps to measure over")
    q.add_argument("--workers", type=int, default=1,
                   help="W worker processes on loopback (training.strategy multi_worker: "
                        "MultiWorkerMirroredStrategy, one replica each; TF_CONFIG set per process)")
    q.add_argument("--timeout", type=float, default=300.0, help="--workers: seconds before every worker is killed")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=commands.cmd_privacy_noise_check)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpbert",
        description="Differentially private BERT pre-training on clinical text (a TFX pipeline).")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log INFO messages, and the TensorFlow / absl / Beam warnings hidden by default")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("run", help="run the DAG locally (LocalDagRunner, Beam DirectRunner)")
    config_args(p)
    p.add_argument("--corpus", help="corpus path (directory of .txt, .jsonl or .csv); "
                                    "default: the embedded synthetic corpus")
    p.add_argument("--output", help="local output directory (the ML Metadata sqlite; the artifacts too unless "
                                    "--pipeline-root)")
    p.add_argument("--pipeline-root", metavar="URI",
                   help="where the artifacts and the trainer state go: gs://BUCKET/ROOT or a local folder "
                        "(= --set pipeline.pipeline_root=URI; default OUTPUT/pipeline_root); the ML Metadata "
                        "sqlite stays in --output (docs/running-on-vertex.md)")
    p.add_argument("--no-cache", action="store_true",
                   help="re-run every component instead of re-using TFX's cached outputs "
                        "(= --set pipeline.enable_cache=false); a changed corpus is re-read without it")
    p.add_argument("--same-corpus-as", metavar="DATASET_ID",
                   help="this corpus's content is already indexed under DATASET_ID in the ledger folder, and "
                        "spending from corpus.dataset_id too is intended (docs/privacy.md: one corpus, one budget)")
    from dpbert_cli.tune import add_tune_parser, add_tuned_argument  # lr and C chosen on a public proxy

    add_tuned_argument(p)
    p.set_defaults(func=commands.cmd_run)

    p = sub.add_parser("synth", help="write the embedded synthetic clinical corpus as JSONL",
                       description="Write the embedded synthetic clinical corpus (what `dpbert run` reads "
                                   "without --corpus) as JSONL: one note per line with text, patient_id, "
                                   "admission_id and note_id. Deterministic for a seed and sizes. The file is "
                                   "written to a temporary name and renamed: an existing file is replaced "
                                   "only by a complete corpus.")
    p.add_argument("--output", required=True, metavar="FILE",
                   help="the JSONL file to write (its directory must exist)")
    p.add_argument("--patients", type=int, default=40, metavar="N", help="patients (default 40, >= 1)")
    p.add_argument("--admissions", type=int, default=2, metavar="N",
                   help="admissions per patient (default 2, >= 1)")
    p.add_argument("--notes", type=int, default=2, metavar="N",
                   help="notes per admission (default 2, >= 1): total notes = patients × admissions × notes")
    p.add_argument("--seed", type=int, default=1234, help="generator seed (default 1234)")
    p.set_defaults(func=commands.cmd_synth)

    p = sub.add_parser("report", help="the latest (or given) run's results, read from ML Metadata")
    p.add_argument("--output", help="the run's output directory (default demo_output)")
    p.add_argument("--metadata", help="path of the ML Metadata sqlite store (instead of --output)")
    p.add_argument("--pipeline-root", metavar="URI",
                   help="read the run from a pipeline root's executor_output.json files (Vertex AI's gs://…, "
                        "a kubeflow.local_v2 rehearsal's folder) instead of an ML Metadata store")
    p.add_argument("--run", help="pipeline run id (default: the latest)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--released", action="store_true",
                   help="only what leaves the trust boundary (dpbert.release.released_view): the ε ledger "
                        "and DP values, without the operator-only sections")
    p.set_defaults(func=commands.cmd_report)

    p = sub.add_parser("release", help="copy a DP run's released files (dpbert.release.RELEASED) into a "
                                       "bundle with a manifest naming the ε/δ/unit covering each file")
    p.add_argument("--output", help="the run's output directory (default demo_output)")
    p.add_argument("--metadata", help="path of the ML Metadata sqlite store (instead of --output)")
    p.add_argument("--run", help="pipeline run id (default: the latest)")
    p.add_argument("--to", dest="bundle", required=True, metavar="BUNDLE",
                   help="the bundle directory to write (must not exist, or be empty)")
    p.add_argument("--json", action="store_true", help="print the manifest")
    p.set_defaults(func=commands.cmd_release)

    _add_privacy_parser(sub)

    p = sub.add_parser("budget", help="the planned ε of a configuration against privacy.epsilon_budget "
                                      "(exit 3 when over), or the σ that meets --target-epsilon",
                       description="The planned ε of a configuration (default: the demo preset) from its "
                                   "public sizes alone: nothing private is read or counted. It needs the "
                                   "public n (training.dataset_size, or dataset_patients with privacy.unit = "
                                   "patient, or --examples). Exit 3 when over privacy.epsilon_budget.")
    config_args(p)
    p.add_argument("--examples", type=int, help="the public n to plan with: tuples (patients with privacy.unit = "
                                                "patient); default: the configuration's training.dataset_size "
                                                "(dataset_patients). budget reads no corpus: with neither it "
                                                "exits 2")
    p.add_argument("--target-epsilon", type=float, help="print the training noise multiplier that meets "
                                                        "this ε instead (see --target)")
    p.add_argument("--target", choices=("whole", "training"), default="whole",
                   help="what --target-epsilon bounds: the whole run's ε (vocabulary + count + training; "
                        "default) or ε_T (training only)")
    p.add_argument("--corpus", dest="check_corpus", metavar="PATH",
                   help="also count this corpus (exactly: operator-only) and say whether the declared public "
                        "sizes match it; without it budget reads no corpus")
    p.add_argument("--compute", metavar="N", help="with --target-epsilon: choose the batch, steps and σ for it "
                                                  "within N tuple-steps (B·T·k), or a time (e.g. 2h, 90min, 600s) "
                                                  "at --tuples-per-second (docs/training.md)")
    p.add_argument("--min-steps", type=int, help="with --compute: the fewest steps a shape may take (default 100)")
    p.add_argument("--tuples-per-second", type=float, help="with --compute: the measured training rate (default: "
                                                           "this machine's estimate for the configured model)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=commands.cmd_budget)

    from kubeflow.runner import add_compile_parser  # Vertex AI / KFP v2: docs/running-on-vertex.md

    add_compile_parser(sub)

    from dpbert_cli.privatize import add_privatize_parser  # dχ-privacy (local, metric DP)

    add_privatize_parser(sub)

    from dpbert_cli.dashboard import add_dashboard_parser  # read-only web UI over ML Metadata

    add_dashboard_parser(sub)

    from dpbert_cli.audit import add_audit_parser  # empirical privacy audits (dpbert.stages.audit)

    add_audit_parser(sub)

    from dpbert_cli.ledger import add_ledger_parser  # the dataset privacy ledger (dpbert.ledger)

    add_ledger_parser(sub)

    from dpbert_cli.export import add_export_parser  # the Hugging Face BertForMaskedLM layout

    add_export_parser(sub)

    from dpbert_cli.predict import add_predict_parser  # fill-mask on a text (dpbert.evaluate.fill_mask)

    add_predict_parser(sub)

    from dpbert_cli.readout import add_readout_parser  # did the model learn? (dpbert.evaluate.readout)

    add_readout_parser(sub)
    add_tune_parser(sub)  # dpbert tune (dpbert.tuning)
    return parser


def _stdout_closed() -> int:
    """stdout's reader went away (``dpbert report | head``): end quietly, as Unix tools do.
    Later writes (Python's flush at exit) go to /dev/null instead of raising again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # pragma: no cover - stdout without a file descriptor
        pass
    return 128 + 13  # what a shell reports for a command ended by SIGPIPE


def _file_error(err: OSError) -> str:
    """``PATH: reason`` of an OSError (no traceback)."""
    if err.filename is not None:
        return f"{err.filename}: {err.strerror or err}"
    return str(err)


def _credentials_missing(err: BaseException) -> Optional[storage.CredentialsMissing]:
    """The ``storage.CredentialsMissing`` that ``err`` is or was raised from (a stage or the
    runner may wrap it), or None."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, storage.CredentialsMissing):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    try:
        return _dispatch(args)
    except Exception as err:  # noqa: BLE001 -- only a missing credential is mapped; the rest re-raised
        # The environment refused: a gs:// URI (ledger, pipeline root, output) and no Google Cloud
        # credentials. One line naming the URI and the fix, never the client's traceback.
        missing = _credentials_missing(err)
        if missing is None:
            raise
        print_error(args.command, missing)
        return exit_codes.ENVIRONMENT


def _dispatch(args) -> int:
    """Run the command; bad input (exit 2) as one line."""
    try:
        code = args.func(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _stdout_closed()
    except (ConfigError, CorpusError, commands.UserError) as err:
        print_error(args.command, err)
        return exit_codes.BAD_INPUT
    except ValueError as err:
        # Parameter errors of the calculators (dpbert.privacy raises ValueError naming the
        # parameter). `run` lets component failures propagate with their traceback instead.
        if args.command == "run":
            raise
        print_error(args.command, err)
        return exit_codes.BAD_INPUT
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError,
            FileExistsError) as err:
        # A file named on the command line that cannot be used; `run` keeps the traceback of a
        # failing component (its inputs were checked before the DAG started).
        if args.command == "run":
            raise
        print_error(args.command, _file_error(err))
        return exit_codes.BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
