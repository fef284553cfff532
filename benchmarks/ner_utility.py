"""Cost and F1 of the utility table's NER evaluation on a public MiniLM.

    TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python benchmarks/ner_utility.py \\
        --layers 2 --mode finetune --learning-rate 3e-4 --epochs 6 --seeds 0 [--train-sentences N]
    ... --mode probe --learning-rate 0.01 --epochs 30 --patience 5 --seeds 0,1,2
    ... --membership 600   (time the membership features of the same model on 600 synthetic tuples)

The public start without warm-up (the installed all-MiniLM-L6-v2, its first ``--layers`` layers,
the PUBLIC WordPiece vocabulary: ``vocab.source: public``) fine-tuned (or probed) on the bundled
BC5CDR subset exactly as ``dpbert.stages.ner`` does: dev split = 10 % of the TRAINING sentences,
early stopping on dev entity F1, test = the bundled test split. One JSON line per seed: test F1,
per-type F1, dev F1 per epoch, best epoch, wall and CPU seconds (2 threads: CPU s / 2 ≈ wall on
two free cores).
"""
from __future__ import annotations

import argparse
import json
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=None, help="public layers (default: all 6)")
    parser.add_argument("--mode", choices=("finetune", "probe"), default="finetune")
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--patience", type=int, default=2)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--train-sentences", type=int, default=None)
    parser.add_argument("--membership", type=int, default=0, help="also time membership features on N tuples")
    args = parser.parse_args()

    from dpbert.config import ModelConfig
    from dpbert.evaluate import ner
    from dpbert.network import bert as bert_lib
    from dpbert.network import init_public
    from dpbert.vocab import public

    tok, _ = public.build_vocabulary("public")
    tokens = [tok.id_to_token(i) for i in range(tok.get_vocab_size())]
    spec = init_public.spec_for_public(ModelConfig(init="minilm", public_layers=args.layers, max_seq_length=128),
                                       tok.get_vocab_size())

    def models():
        m = bert_lib.build_bert(spec, seed=0)
        init_public.init_from_checkpoint(m, tokens, None, 0)
        return m

    train_all, test = ner.bundled_bc5cdr("train"), ner.bundled_bc5cdr("test")
    if args.train_sentences:
        train_all = train_all[:args.train_sentences]
    train, dev = ner.split_dev(train_all, 0.1, 0)
    cache: dict = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        t, c = time.time(), time.process_time()
        settings = ner.NERSettings(args.epochs, max_seq_length=128, batch_size=16, learning_rate=args.learning_rate,
                                   seed=seed, patience=args.patience, train_encoder=args.mode == "finetune")
        r = ner.finetune_and_score(lambda: models().encoder, tok, train, test, settings, dev_sentences=dev,
                                   features_cache=cache)
        print(json.dumps({"mode": args.mode, "layers": spec.num_layers, "lr": args.learning_rate, "seed": seed,
                          "train": len(train), "dev": len(dev), "f1": round(r["f1"], 4),
                          "per_type": {k: round(v["f1"], 3) for k, v in r["per_type"].items()},
                          "dev_f1": [round(x, 3) for x in r["dev_f1_history"]], "best_epoch": r["best_epoch"],
                          "wall_s": round(time.time() - t, 1), "cpu_s": round(time.process_time() - c, 1)}),
              flush=True)
    if args.membership:
        from dpbert.data.synthetic import generate_notes
        from dpbert.data.tuples import corpus_tuples
        from dpbert.evaluate import membership
        from dpbert.vocab.wordpiece import special_ids, tokenize_tuples

        m = models()
        tuples = list(corpus_tuples(generate_notes(patients=80, seed=5), 256))[:args.membership]
        ids = tokenize_tuples(tok, (x.words for x in tuples), 128)
        sp = special_ids(tok)
        kw = dict(special_token_ids=tuple(sp), mask_token_id=sp.mask)
        for name, fn in (("losses", lambda: membership.sample_losses(m, ids, 0, batch_size=32, **kw)),
                         ("attention", lambda: membership.attention_features(m, ids, batch_size=32)),
                         ("gradients", lambda: membership.gradient_features(m, ids, 0, batch_size=16, **kw))):
            t, c = time.time(), time.process_time()
            fn()
            print(json.dumps({"membership": name, "layers": spec.num_layers, "samples": int(ids.shape[0]),
                              "wall_s": round(time.time() - t, 1), "cpu_s": round(time.process_time() - c, 1)}),
                  flush=True)


if __name__ == "__main__":
    main()
