"""``dpbert predict``: fill-mask on a text you write (``dpbert.evaluate.fill_mask``).

MODEL is found as ``dpbert export`` finds it — a run (``--output DIR`` / ``--metadata FILE``,
``--run ID``; a run's output folder as MODEL), the trainer's artifact folder or its ``model/``
folder (the tokenizer next to it, or ``--tokenizer``) — or is a Hugging Face export folder
(``dpbert export --to``). It runs on this machine and writes nothing: a model that is not shown DP
is read too (what it prints is then operator-only, as the model is). Exit 2: no ``[MASK]`` in the
text, a text longer than the model's positions, a MODEL that is none of these.
"""
from __future__ import annotations

from dpbert import exit_codes, storage
from dpbert_cli.commands import UserError
from dpbert_cli.output import print_json


def add_predict_parser(sub):
    from dpbert.evaluate.fill_mask import DEFAULT_TOP_K

    p = sub.add_parser("predict", help="fill-mask: the model's most probable tokens at each [MASK] of a text")
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help="a Hugging Face export folder (dpbert export), the trainer's model artifact folder, its "
                        "model/ folder, or a run's output folder; default: the run of --output / --metadata")
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", help='the text, with [MASK] where a word is to be filled, e.g. "the patient was '
                                     'given [MASK] for the infection"')
    text.add_argument("--file", metavar="PATH", help="read the text from this file (UTF-8)")
    p.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, metavar="K",
                   help=f"tokens shown per [MASK] (default {DEFAULT_TOP_K})")
    p.add_argument("--output", help="the run's output directory, instead of MODEL")
    p.add_argument("--metadata", help="path of the ML Metadata sqlite store, instead of MODEL")
    p.add_argument("--run", help="pipeline run id (default: the latest)")
    p.add_argument("--tokenizer", metavar="DIR", help="the tokenizer folder (default: tokenizer/ of the artifact)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_predict)


def _text(args) -> str:
    if args.text is not None:
        return args.text
    try:
        return storage.read_text(args.file)
    except FileNotFoundError:
        raise UserError(f"--file {args.file} does not exist") from None
    except UnicodeDecodeError as err:
        raise UserError(f"--file {args.file}: not UTF-8 text ({err})") from None


def _load(args):
    """(models, tokenizer, what was read, its folder, why it is not shown DP or None)."""
    from dpbert.evaluate import fill_mask
    from dpbert.network import hf_layout
    from dpbert_cli.export import find_model

    if args.model and storage.storage_for(args.model).exists(storage.join(args.model, hf_layout.WEIGHTS_FILE)):
        if args.output or args.metadata:
            raise UserError("give MODEL or --output / --metadata, not both")
        models, tokenizer, what = fill_mask.load_model(args.model)
        return models, tokenizer, what, args.model, None
    source = find_model(args)
    models, tokenizer, what = fill_mask.load_model(source.model_dir, source.tokenizer_dir)
    return models, tokenizer, what, source.model_dir, source.why


def cmd_predict(args) -> int:
    from dpbert.evaluate.fill_mask import FillMaskError, fill_mask

    text = _text(args)
    if "[MASK]" not in text:  # before the model is read (the tokenizer keeps [MASK] whole, upper case)
        raise UserError("the text has no [MASK] (write it as [MASK], upper case, where a word is to be filled)")
    if args.top_k < 1:
        raise UserError(f"--top-k must be >= 1, got {args.top_k}")
    models, tokenizer, what, folder, why = _load(args)
    try:
        predictions = fill_mask(models, tokenizer, text, args.top_k)
    except FillMaskError as err:
        hint = (" (a model that started from the public checkpoint reads more positions once exported: dpbert "
                "export)") if "positions" in str(err) and models.spec.preset == "minilm" else ""
        raise UserError(f"{err}{hint}") from None
    if args.json:
        print_json({"model": folder, "read_as": what, "positions": models.spec.max_seq_length,
                    "not_shown_dp": why, "predictions": [p.to_dict() for p in predictions]})
        return exit_codes.OK
    print(f"{what} {folder} ({models.spec.max_seq_length} positions)"
          + (f"; NOT shown DP, operator-only: {why}" if why else ""))
    for p in predictions:
        shown = ", ".join(f"{token} {probability:.4f}" for token, probability in p.candidates)
        print(f"[MASK] {p.number} (token {p.position}): {shown}")
    return exit_codes.OK
