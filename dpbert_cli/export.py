"""``dpbert export``: a trained model in the Hugging Face ``BertForMaskedLM`` layout
(``dpbert.model.hf_layout``): ``config.json``, ``model.safetensors``, ``vocab.txt``,
``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``.

The model is found as ``dpbert release`` finds it: a run (``--output DIR`` / ``--metadata FILE``,
``--run ID``; default the latest run of ``demo_output``): its DP ``PretrainedModel`` artifact, the
run's privacy ledger saying the run is DP (finite ε, within budget). Or MODEL, a path: the
trainer's artifact folder (``model/`` + ``tokenizer/`` + ``dp_events.json``), the ``model/``
folder inside one, or a run's output folder. A model folder is DP only if the ``dp_events.json``
next to it records no non-private stage; without one nothing shows that it is DP. That file covers
the training only: whether the vocabulary was DP is in the run's ledger, which the run form checks.

A non-DP model (the non-private baseline, a predictable noise seed, ε = ∞, over budget, or no
record) is refused unless ``--allow-private``; then the export is marked operator-only
(``dpbert_private`` in ``config.json`` and a ``PRIVATE-operator-only.txt`` file). Every path may be
remote (``gs://``): files go through ``dpbert.storage``. Everything is read and checked before the
first file is written.
"""
from __future__ import annotations

import math
import posixpath
from typing import Dict, Optional, Tuple

from dpbert import exit_codes, schema, storage
from dpbert_cli.commands import UserError
from dpbert_cli.output import print_json

PRIVATE_FILE = "PRIVATE-operator-only.txt"
PRIVATE_TEXT = ("Operator-only: this model was NOT trained with differential privacy (or nothing shows it\n"
                "was). It was exported with --allow-private. Never release it.\n")


def add_export_parser(sub):
    p = sub.add_parser("export", help="write a trained model in the Hugging Face BertForMaskedLM layout "
                                      "(config.json, model.safetensors, tokenizer files)")
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help="the trainer's model artifact folder (model/ + tokenizer/ + dp_events.json), its model/ "
                        "folder, or a run's output folder; default: the run of --output / --metadata")
    p.add_argument("--to", dest="target", required=True, metavar="DIR",
                   help="the directory to write (must not exist, or be empty; may be gs://)")
    p.add_argument("--output", help="the run's output directory (default demo_output), instead of MODEL")
    p.add_argument("--metadata", help="path of the ML Metadata sqlite store, instead of MODEL")
    p.add_argument("--run", help="pipeline run id (default: the latest)")
    p.add_argument("--tokenizer", metavar="DIR",
                   help="the tokenizer folder (vocab.txt, tokenizer.json); default: tokenizer/ of the artifact")
    p.add_argument("--allow-private", action="store_true",
                   help="export a model that is not shown to be DP, marked operator-only")
    p.add_argument("--json", action="store_true", help="print what was written as one JSON object")
    p.set_defaults(func=cmd_export)


def _store(uri: str):
    return storage.storage_for(uri)


def _exists(uri: str) -> bool:
    return _store(uri).exists(uri)


def _join(*parts: str) -> str:
    return storage.join(*parts)


# ------------------------------------------------------------------------------ finding the model
def _events_privacy(path: str) -> Optional[str]:
    """Why the model next to ``path`` (its ``dp_events.json``) is not shown DP, or None when it is."""
    if not _exists(path):
        return f"there is no {schema.DP_EVENTS_FILE} next to it: nothing shows it was trained with DP"
    try:
        records = schema.loads(_store(path).read_bytes(path).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not a DP event record list ({err})") from None
    records = records if isinstance(records, list) else [records]
    if not records or not all(isinstance(r, dict) for r in records):
        raise UserError(f"{path}: not a DP event record list")
    if any(r.get("mechanism") == "non_private" for r in records):
        return f"{path} records a non-private stage (ε = ∞)"
    return None


def _folder_source(path: str, tokenizer: Optional[str]) -> Tuple[str, str, Optional[str]]:
    """(model dir, tokenizer dir, why not DP or None) of a model folder or artifact folder."""
    from dpbert.model.bert import MODEL_CONFIG_FILE

    if _exists(_join(path, MODEL_CONFIG_FILE)):
        model_dir, artifact = path, posixpath.dirname(path.rstrip("/")) or "."
    elif _exists(_join(path, schema.MODEL_DIR, MODEL_CONFIG_FILE)):
        model_dir, artifact = _join(path, schema.MODEL_DIR), path
    else:
        raise UserError(f"MODEL {path}: no {MODEL_CONFIG_FILE} in it or in its {schema.MODEL_DIR}/ (give the "
                        "trainer's model artifact folder, its model/ folder, or a run's output folder)")
    return (model_dir, tokenizer or _join(artifact, schema.TOKENIZER_DIR),
            _events_privacy(_join(artifact, schema.DP_EVENTS_FILE)))


def _run_privacy(run) -> Optional[str]:
    """Why the run is not DP (its ledger: ε = ∞ or over budget), or None."""
    ledger = next((a.properties for a in run.artifacts(schema.type_name(schema.PRIVACY_REPORT))
                   if not a.private), None)
    if ledger is None:
        return f"run {run.run_id} has no privacy report"
    epsilon = ledger.get(schema.EPSILON_TOTAL_PLD)
    if ledger.get(schema.NON_PRIVATE) or not isinstance(epsilon, (int, float)) or not math.isfinite(epsilon):
        return f"run {run.run_id} is not differentially private (ε = ∞)"
    if ledger.get(schema.WITHIN_BUDGET) in (False, 0):
        return f"run {run.run_id} is over its privacy budget"
    return None


def _run_source(args, output: Optional[str]) -> Tuple[str, str, Optional[str]]:
    """(model dir, tokenizer dir, why not DP or None) of the run's model: the DP one when it has one."""
    from dpbert import metadata
    from dpbert_cli.commands import open_metadata_store

    try:
        path = metadata.metadata_path_for(output, args.metadata)
        run = metadata.get_run(open_metadata_store(path, "--metadata" if args.metadata else "--output"), args.run)
    except (FileNotFoundError, LookupError) as err:
        raise UserError(str(err)) from None
    models = run.artifacts(schema.type_name(schema.PRETRAINED_MODEL))
    dp = [a for a in models if not a.private and not a.properties.get(schema.NON_PRIVATE)]
    if not models:
        raise UserError(f"run {run.run_id} has no trained model (PretrainedModel)")
    why = _run_privacy(run) if dp else f"run {run.run_id} has only a non-private model"
    artifact = (dp or models)[0].uri
    return _join(artifact, schema.MODEL_DIR), args.tokenizer or _join(artifact, schema.TOKENIZER_DIR), why


def find_model(args) -> Tuple[str, str, Optional[str]]:
    """(model dir, tokenizer dir, why the model is not shown DP or None) named by the arguments."""
    if args.model and (args.output or args.metadata):
        raise UserError("give MODEL or --output / --metadata, not both")
    if args.model and not _exists(args.model):
        raise UserError(f"MODEL {args.model} does not exist")
    if args.model and _exists(_join(args.model, "metadata.sqlite")):
        return _run_source(args, args.model)
    if args.model:
        return _folder_source(args.model, args.tokenizer)
    return _run_source(args, args.output)


# ------------------------------------------------------------------------------ reading and writing
def _tokenizer_files(directory: str, spec) -> Dict[str, bytes]:
    """``vocab.txt`` (required) and ``tokenizer.json`` (when there), checked against the model."""
    from dpbert.vocab import wordpiece

    files = {}
    for name in (wordpiece.VOCAB_FILE, wordpiece.TOKENIZER_FILE):
        if _exists(_join(directory, name)):
            files[name] = _store(directory).read_bytes(_join(directory, name))
    vocab_path = _join(directory, wordpiece.VOCAB_FILE)
    if wordpiece.VOCAB_FILE not in files:
        raise UserError(f"{vocab_path} does not exist (give the tokenizer folder with --tokenizer)")
    tokens = [t for t in files[wordpiece.VOCAB_FILE].decode("utf-8").split("\n") if t]
    if len(tokens) != spec.vocab_size:
        raise UserError(f"{vocab_path} has {len(tokens)} tokens, the model's vocab_size is {spec.vocab_size}")
    if tokens[spec.pad_id] != wordpiece.PAD:
        raise UserError(f"{vocab_path}: line {spec.pad_id + 1} (the model's pad id) is not {wordpiece.PAD}")
    if wordpiece.TOKENIZER_FILE in files:
        from tokenizers import Tokenizer

        vocab = Tokenizer.from_str(files[wordpiece.TOKENIZER_FILE].decode("utf-8")).get_vocab(with_added_tokens=True)
        if vocab != {t: i for i, t in enumerate(tokens)}:
            raise UserError(f"{_join(directory, wordpiece.TOKENIZER_FILE)} does not match {vocab_path}")
    return files


def _check_target(target: str):
    if _exists(target) and (not _store(target).isdir(target) or _store(target).listdir(target)):
        raise UserError(f"--to {target} exists and is not an empty directory; choose a new directory")


def cmd_export(args) -> int:
    from dpbert.model import hf_layout

    _check_target(args.target)
    model_dir, tokenizer_dir, why = find_model(args)
    if why is not None and not args.allow_private:
        raise UserError(f"{why}: refused (a model that is not shown DP is operator-only; --allow-private "
                        "exports it marked private)")
    models = hf_layout.load_dpbert(model_dir)
    files = hf_layout.hf_files(models, _tokenizer_files(tokenizer_dir, models.spec),
                               {"dpbert_private": why is not None})
    if why is not None:
        files[PRIVATE_FILE] = PRIVATE_TEXT.encode("utf-8")
    hf_layout.write_files(args.target, files)
    summary = {"to": args.target, "model": model_dir, "tokenizer": tokenizer_dir, "files": sorted(files),
               "private": why is not None, "architecture": hf_layout.ARCHITECTURE}
    if args.json:
        print_json(summary)
    else:
        spec = models.spec
        print(f"exported {model_dir} to {args.target} as {hf_layout.ARCHITECTURE} ({spec.num_layers} layers, "
              f"hidden {spec.hidden_size}, vocabulary {spec.vocab_size}): {', '.join(sorted(files))}")
        if why is not None:
            print(f"PRIVATE (operator-only): {why}")
    return exit_codes.OK
