"""``dpbert readout``: did the model learn? (``dpbert.evaluate.readout``; docs/without-labels.md)

MODEL is a run (its output folder, or ``--output`` / ``--metadata`` with ``--run``): its DP model,
its tuples, vocabulary and held-out split are found in its ML Metadata store. Or the trainer's
artifact folder with ``--tuples DIR`` (the run's WordTuples folder; the held-out fraction is then
the configuration's). ``--config`` is the run's configuration (its public start is rebuilt from it,
its dataset's ledger is charged); what disagrees with the run is exit 2 before anything is read.

Prints the ε-free MLM loss on shipped public text (model vs its start) and, unless
``--public-only``, ONE DP release on the units' own text: reserved in the dataset's ledger before a
tuple is read (exit 3 over the budget), finalized after. Exit 2: no dataset identity
(corpus.dataset_id), a configuration that is not the run's, a missing tuples folder or key.
"""
from __future__ import annotations

import dataclasses
import uuid
from typing import Optional

from dpbert import exit_codes, schema, storage
from dpbert_cli.args import config_args
from dpbert_cli.commands import UserError
from dpbert_cli.output import print_json


def add_readout_parser(sub):
    from dpbert.evaluate import readout

    p = sub.add_parser("readout", help="did the model learn? a DP estimate of how much better than its start it "
                                       "predicts held-out patients' text (charged to the dataset's ledger), and an "
                                       "ε-free loss on public text")
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help="a run's output folder, or the trainer's model artifact folder (with --tuples); default: "
                        "the run of --output / --metadata")
    config_args(p)
    p.add_argument("--output", help="the run's output directory, instead of MODEL")
    p.add_argument("--metadata", help="path of the ML Metadata sqlite store, instead of MODEL")
    p.add_argument("--run", help="pipeline run id (default: the latest)")
    p.add_argument("--tuples", metavar="DIR", help="the run's WordTuples folder (MODEL an artifact folder)")
    p.add_argument("--epsilon", type=float, default=readout.DEFAULT_EPSILON,
                   help=f"ε of the release at δ = training.delta (default {readout.DEFAULT_EPSILON}), spent from "
                        "the dataset's budget")
    p.add_argument("--clip", type=float, default=readout.DEFAULT_CLIP,
                   help=f"c: each unit's difference is clipped to [-c, c] nats (default {readout.DEFAULT_CLIP})")
    p.add_argument("--seed", type=int, default=readout.DEFAULT_SEED, help="the masks' public seed (default 0)")
    p.add_argument("--public-only", action="store_true",
                   help="only the ε-free loss on shipped public text: no private text read, nothing charged")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_readout, tokenizer=None)


@dataclasses.dataclass
class RunParts:
    """What the readout reads of a run."""
    model_dir: str
    tokenizer_dir: str
    vocabulary_dir: str
    tuples_dir: Optional[str]
    fraction: Optional[float]     # the held-out fraction the model records (None: not recorded)
    key_id: Optional[str]
    dataset_id: Optional[str]     # the dataset the trainer charged (None: not recorded)
    folder: str


def _run_parts(args, output: Optional[str]) -> RunParts:
    from dpbert.accounting.target import LedgerTarget
    from dpbert_cli.commands import read_run

    run = read_run(args, output)
    models = run.artifacts(schema.type_name(schema.PRETRAINED_MODEL))
    tuples, vocabulary = (run.artifacts(schema.type_name(t)) for t in (schema.WORD_TUPLES, schema.DP_VOCABULARY))
    if not (models and tuples and vocabulary):
        raise UserError(f"run {run.run_id} has no trained model, tuples or vocabulary to read")
    chosen = next((a for a in models if not a.properties.get(schema.NON_PRIVATE)), models[0])
    trainer = next(c for c in run.components if any(a.id == chosen.id for a in c.outputs))
    target = LedgerTarget.from_json(trainer.properties.get("ledger_target", ""))
    fraction = chosen.properties.get(schema.HOLDOUT_FRACTION)
    return RunParts(storage.join(chosen.uri, schema.MODEL_DIR), storage.join(chosen.uri, schema.TOKENIZER_DIR),
                    vocabulary[0].uri, tuples[0].uri, 0.0 if fraction is None else float(fraction),
                    chosen.properties.get("holdout_key_id"), None if target is None else target.dataset_id,
                    output or storage.join(".", "demo_output"))


def _parts(args) -> RunParts:
    from dpbert_cli.export import find_model

    if args.model and storage.storage_for(args.model).exists(storage.join(args.model, "metadata.sqlite")):
        return _run_parts(args, args.model)
    if not args.model:
        return _run_parts(args, args.output)
    source = find_model(args)
    return RunParts(source.model_dir, source.tokenizer_dir, source.tokenizer_dir, args.tuples, None, None, None,
                    args.model)


def _check(config, parts: RunParts, spec):
    """The configuration is the run's: its sizes, start, unit and held-out fraction (exit 2 naming the field)."""
    mc = config.model
    problems = []
    if mc.max_seq_length != spec.max_seq_length:
        problems.append(f"model.max_seq_length = {mc.max_seq_length}, the model's is {spec.max_seq_length}")
    if (mc.init == "minilm") != (spec.preset == "minilm"):
        problems.append(f"model.init = {mc.init}, the model {'did' if spec.preset == 'minilm' else 'did not'} start "
                        "from the public checkpoint")
    if parts.fraction is not None and parts.fraction != config.membership.holdout_patient_fraction:
        problems.append(f"membership.holdout_patient_fraction = {config.membership.holdout_patient_fraction}, the "
                        f"model records {parts.fraction}")
    if not problems and mc.init == "minilm":
        from dpbert.network import init_public

        rebuilt = init_public.spec_for_public(mc, spec.vocab_size, config.training.mask_probability, mc.init_dir)
        if dataclasses.replace(rebuilt, dropout=spec.dropout, attention_dropout=spec.attention_dropout) != spec:
            problems.append(f"its public start is {rebuilt}, the model is {spec}")
    if problems:
        raise UserError("--config is not the run's configuration: " + "; ".join(problems))


def _start(config, tokenizer, vocabulary_dir: str, spec):
    """The model's start rebuilt from the configuration (no private input; its shape checked by
    ``_check``), or None: the uniform guess."""
    if config.model.init != "minilm":
        return None
    from dpbert.network import bert as bert_lib
    from dpbert.engine.public_warmup import public_start_weights

    weights, _, _ = public_start_weights(config.model, config.training, tokenizer, vocabulary_dir)
    start = bert_lib.build_bert(spec)
    start.mlm.set_weights(weights)
    return start


def _request(args, config, parts: RunParts):
    """The release's ``readout.Request`` and the held-out key (checked before anything is charged)."""
    from dpbert.accounting.target import ledger_target
    from dpbert.data import splits
    from dpbert.evaluate import readout

    target = ledger_target(config)
    if target is None:
        raise UserError("corpus.dataset_id is not set: the readout is a DP release on the corpus, charged to the "
                        "dataset's ledger, which needs the dataset's identity (the run's --config)")
    if parts.dataset_id is not None and parts.dataset_id != target.dataset_id:
        raise UserError(f"--config names dataset {target.dataset_id}, the run charged {parts.dataset_id}")
    if parts.tuples_dir is None or not storage.storage_for(parts.tuples_dir).exists(parts.tuples_dir):
        raise UserError(f"--tuples {parts.tuples_dir}: give the run's WordTuples folder (MODEL is not a run)")
    fraction = config.membership.holdout_patient_fraction
    key = None
    if fraction > 0:
        key = splits.read_holdout_key(parts.tuples_dir)
        if parts.key_id is not None and splits.key_fingerprint(key) != parts.key_id:
            raise UserError(f"{parts.tuples_dir}: its holdout key is not the one the model was trained with")
    patient = config.privacy.unit == "patient"
    public_n = config.training.dataset_patients if patient else config.training.dataset_size
    declared = None if public_n is None else float(public_n) * (fraction if fraction > 0 else 1.0)
    where = storage.join(parts.folder, "readout", "dpbert-readout", "gaussian_sum", uuid.uuid4().hex[:12])
    return readout.Request(args.epsilon, config.training.delta, args.clip, declared, target, where, args.seed), key


def cmd_readout(args) -> int:
    from dpbert.accounting.gate import BudgetRefused
    from dpbert.evaluate import readout
    from dpbert.network import hf_layout
    from dpbert.vocab.wordpiece import load_tokenizer
    from dpbert_cli.commands import load
    from dpbert_cli.export import model_spec
    from dpbert_cli.output import print_error

    if not (args.epsilon > 0 and args.clip > 0):
        raise UserError(f"--epsilon and --clip must be > 0, got {args.epsilon} and {args.clip}")
    config, parts = load(args), _parts(args)
    _check(config, parts, model_spec(parts.model_dir))  # everything checked before anything is charged or built
    request, key, charge = None, None, None
    if not args.public_only:
        request, key = _request(args, config, parts)
        try:
            charge = readout.reserve(request)
        except BudgetRefused as refused:
            print_error("readout", refused)
            return exit_codes.OVER_BUDGET
    model, tokenizer = hf_layout.load_dpbert(parts.model_dir), load_tokenizer(parts.tokenizer_dir)
    start = _start(config, tokenizer, parts.vocabulary_dir, model.spec)
    p = config.training.mask_probability
    out = {"model": parts.model_dir, "public_signal": readout.public_signal(model, start, tokenizer,
                                                                           model.spec.max_predictions, p, args.seed)}
    if charge is not None:
        out["readout"] = readout.run_readout(request, charge, model, start, tokenizer,
                                             _units(config, parts, tokenizer, model.spec, key), p)
        out["readout"]["unit"] = config.privacy.unit
    if args.json:
        print_json(out)
    else:
        print("\n".join(_lines(out)))
    return exit_codes.OK


def _units(config, parts: RunParts, tokenizer, spec, key):
    """The reader of the units' rows (called by ``run_readout`` after the reservation)."""
    from dpbert.data.tfrecord import read_tuples
    from dpbert.evaluate import readout

    patient = config.privacy.unit == "patient"
    k = config.privacy.max_tuples_per_patient if patient else 1
    return lambda: readout.heldout_units(read_tuples(parts.tuples_dir), tokenizer, spec.max_seq_length,
                                         fraction=config.membership.holdout_patient_fraction, key=key,
                                         patient_unit=patient, max_tuples=k)


def _lines(out) -> list:
    from dpbert.privacy.numbers import fmt_delta, fmt_epsilon

    s = out["public_signal"]
    lines = [f"model {out['model']}",
             f"  ε-free, public text ({s['text']}; {s['masked_tokens']} masked tokens): MLM loss {s['model']:.4f} "
             f"nats, its start {s['start']:.4f} nats (start − model = {s['difference']:+.4f})"]
    if "readout" not in out:
        return lines + ["  no DP readout (--public-only): nothing private read, nothing charged"]
    r, e = out["readout"], out["readout"]["result"]
    who = f"held-out {r['unit']}s" if r["held_out"] else f"the {r['unit']}s it trained on (no held-out ones)"
    divisor = (f"the declared count {e['divisor']:g} (public)" if e["divisor_source"] == "declared"
               else f"a DP count {e['divisor']:.1f} (noise std {r['released']['count_std']:.4g})")
    return lines + [
        f"  DP estimate over {who}: mean of (start's loss − model's loss) = {e['estimate']:+.4f} nats, "
        f"{e['level']:.0%} interval [{e['low']:+.4f}, {e['high']:+.4f}]: {e['verdict']} (start: {r['start']})",
        f"  released: the sum of differences clipped to ±{r['clip']:g}, {r['released']['sum']:+.4f} (noise std "
        f"{r['released']['sum_std']:.4g}), divided by {divisor}",
        f"  charged: ε = {fmt_epsilon(r['epsilon'])} at δ = {fmt_delta(r['delta'])} (one Gaussian, noise multiplier "
        f"{r['noise_multiplier']:.4f}), entry {r['ledger_entry']} of dataset {r['dataset_id']} "
        f"(dpbert ledger --dataset {r['dataset_id']})"]
