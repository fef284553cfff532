"""Reproduce the local-privacy measurements: deniability, inversion, privatized fine-tuning.

    python -m dpbert.local_privacy.experiments --out DIR [--model DIR] [--etas 200,150,100,75,50]
        [--draws 100] [--tokens 200] [--corpus bc5cdr|synthetic] [--corpus-tokens 5000]
        [--classification] [--class-etas 150,100,75] [--pretrain-steps 150] [--seed 0]

Writes ``deniability.png``, ``inversion.png``, ``results.json`` and ``results.md`` (and with
``--classification`` the accuracy table) to ``--out``. The table comes from ``--model`` or the
default public checkpoint (``dpbert.local_privacy.embeddings.load_embeddings``).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from dpbert import schema
from dpbert.vocab.wordpiece import special_ids

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _floats(text: str) -> List[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _log(message: str):
    print(message, file=sys.stderr, flush=True)


def public_pretraining_ids(tokenizer, max_seq_length: int, patients: int = 60, seed: int = 99) -> np.ndarray:
    """A public pre-training corpus: synthetic clinical notes (generated from public lexicons;
    a different seed from the demo corpus), cut into ``[CLS] … [SEP]`` sequences of L tokens."""
    from dpbert.local_privacy.deniability import corpus_token_ids, synthetic_words

    ids = corpus_token_ids(tokenizer, synthetic_words(patients, seed))
    width = max_seq_length - 2
    n = ids.size // width
    body = ids[:n * width].reshape(n, width)
    specials = special_ids(tokenizer)
    return np.concatenate([np.full((n, 1), specials.cls), body, np.full((n, 1), specials.sep)],
                          axis=1).astype(np.int32)


def run_classification(embeddings, etas: Sequence[float], *, pretrain_steps: int = 150, epochs: int = 3,
                       max_seq_length: int = 64, encoder=None, seed: int = 0,
                       objectives: Sequence[str] = ("vanilla", "prob", "denoising"), batch_size: int = 32,
                       log=_log) -> Dict[str, object]:
    """Fine-tuning accuracy on original vs privatized BC5CDR "has a Chemical" sentences, for a
    randomly initialised encoder and for encoders pre-trained with each objective at each η.
    ``encoder``: the layers and heads (``pretrain.Encoder``; default 2 layers, 4 heads); its
    ``pad_id`` is the tokenizer's."""
    from dpbert.local_privacy import finetune, pretrain

    encoder = pretrain.Encoder(num_heads=4) if encoder is None else encoder
    num_layers, num_heads = encoder.num_layers, encoder.num_heads

    tokenizer = embeddings.tokenizer
    mechanism = embeddings.mechanism()
    specials = special_ids(tokenizer)
    keep = [specials.pad, specials.cls, specials.sep]
    task = finetune.chemical_sentence_task(tokenizer, max_seq_length)
    public = public_pretraining_ids(tokenizer, max_seq_length)
    log(f"classification: {len(task['train_labels'])} train / {len(task['test_labels'])} test sentences; "
        f"public pre-training corpus {public.shape[0]} sequences of {max_seq_length}")
    build = dict(max_seq_length=max_seq_length, num_layers=num_layers, num_heads=num_heads,
                 pad_id=specials.pad)
    cache: Dict[tuple, list] = {}
    pretrain_log: List[dict] = []

    def pretrained(objective):
        def factory(eta):
            key = (objective, "mlm" if math.isinf(eta) else eta)
            if key not in cache:
                result = pretrain.pretrain(public, mechanism, pretrain.Objective(objective, specials.mask, keep), eta,
                                           encoder=dataclasses.replace(encoder, pad_id=specials.pad),
                                           steps=pretrain_steps, batch_size=batch_size, seed=seed)
                cache[key] = result.models.mlm.get_weights()
                pretrain_log.append(result.to_dict())
                log(f"pre-trained {objective} at η={eta:g}: loss {pretrain_log[-1]['initial_loss']:.2f} → "
                    f"{pretrain_log[-1]['final_loss']:.2f} in {result.seconds:.0f} s")
            models = pretrain.build_frozen_bert(mechanism.table, seed=seed, **build)
            models.mlm.set_weights(cache[key])
            return models
        return factory

    encoders = {"none (random encoder)": lambda eta: pretrain.build_frozen_bert(mechanism.table, seed=seed, **build)}
    for objective in objectives:
        encoders[f"{objective} MLM"] = pretrained(objective)
    rows = finetune.classification_table(mechanism, task, list(etas), encoders, keep_ids=keep, epochs=epochs,
                                         seed=seed, pad_id=specials.pad, log=log)
    return {"rows": rows, "pretraining": pretrain_log, "table": finetune.format_classification_table(rows),
            "settings": {"pretrain_steps": pretrain_steps, "epochs": epochs, "max_seq_length": max_seq_length,
                         "num_layers": num_layers, "num_heads": num_heads, "batch_size": batch_size}}


def main(argv: Optional[List[str]] = None) -> int:
    from dpbert.local_privacy import deniability as den
    from dpbert.local_privacy.embeddings import load_embeddings

    p = argparse.ArgumentParser(prog="python -m dpbert.local_privacy.experiments", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--model")
    p.add_argument("--etas", type=_floats, default=[200, 150, 100, 75, 50])
    p.add_argument("--draws", type=int, default=100, help="n, privatizations per token for N_w / S_w")
    p.add_argument("--tokens", type=int, default=200, help="vocabulary tokens sampled for N_w / S_w")
    p.add_argument("--corpus", choices=("bc5cdr", "synthetic"), default="bc5cdr")
    p.add_argument("--corpus-tokens", type=int, default=5000, help="corpus tokens attacked (prefix)")
    p.add_argument("--classification", action="store_true")
    p.add_argument("--class-etas", type=_floats, default=[150, 100, 75])
    p.add_argument("--pretrain-steps", type=int, default=150)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    embeddings = load_embeddings(args.model)
    mechanism = embeddings.mechanism()
    _log(f"table: {embeddings.describe()}")
    results: Dict[str, object] = {"embeddings": embeddings.describe(), "etas": args.etas, "seed": args.seed}

    start = time.time()
    tokens = den.sample_tokens(mechanism, args.tokens, rng=args.seed)
    rows = den.deniability_report(mechanism, args.etas, n_draws=args.draws, token_ids=tokens, rng=args.seed + 1)
    words = den.bc5cdr_words("train") if args.corpus == "bc5cdr" else den.synthetic_words(20)
    corpus = den.corpus_token_ids(embeddings.tokenizer, words)[:args.corpus_tokens]
    inversion = den.inversion_report(mechanism, corpus, args.etas, rng=args.seed + 2)
    _log(f"deniability + inversion: {time.time() - start:.0f} s")
    den.plot_deniability(rows, out / "deniability.png")
    den.plot_inversion(inversion, out / "inversion.png", title=f"nearest-neighbour inversion ({args.corpus})")
    results["deniability"] = [{k: v for k, v in r.items() if k not in ("N", "S")} for r in rows]
    results["inversion"] = inversion
    results["inversion_corpus"] = args.corpus
    markdown = [f"table: {embeddings.source} (d = {embeddings.dim}, {mechanism.candidate_ids.size} candidates); "
                f"E‖z‖ = d/η", "", den.format_tables(rows, inversion)]

    if args.classification:
        classification = run_classification(embeddings, [math.inf] + list(args.class_etas),
                                            pretrain_steps=args.pretrain_steps, epochs=args.epochs, seed=args.seed)
        results["classification"] = {k: v for k, v in classification.items() if k != "table"}
        markdown += ["", "BC5CDR sentence has a Chemical: test accuracy (train and test privatized at η)", "",
                     classification["table"]]
    (out / "results.json").write_text(schema.dumps(results, indent=2), encoding="utf-8")
    (out / "results.md").write_text("\n".join(markdown) + "\n", encoding="utf-8")
    print("\n".join(markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
