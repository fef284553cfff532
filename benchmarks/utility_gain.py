"""The table a data owner reads: how much of the in-domain pre-training gain DP keeps,
per trainable set and ε per patient. A benchmark, never a test: it runs for an hour or more.

    TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python benchmarks/utility_gain.py \\
        --out bench_utility [--patients 10000] [--sets all,bias] [--epsilons 1,3,8] [--seeds 3]

What it runs, in-process over the core stages (no TFX, so the public row, the non-private rows and
the corpus are computed once, not once per DAG run):

1. the embedded synthetic corpus at ``--patients`` patients (public sizes, one note each), ingested
   into N-word tuples (``dpbert.stages.ingest``); ``vocab.source: public`` — the public
   checkpoint's vocabulary, ε_V = 0, so the ε below is the WHOLE ε per patient (the
   ``public+dp`` vocabulary would add its ε_V: printed beside the table from the planned ledger);
2. the patient as the unit (k = ``--k`` tuples per patient per step), the demo's public start
   (the first ``--layers`` MiniLM layers + the MLM-head warm-up, ``dpbert.stages.pretrain``);
3. rows: ``public`` (the start, no in-domain training); ``non-private <set>`` for ``all`` and each
   other set; ``DP <set> ε=E`` for every set and E in ``--epsilons``, σ from the planner's target-ε
   solver (``accountant.noise_multiplier_for_planned_target``: what the ledger will record,
   diagnostics included), with ``--seeds`` DP training seeds at ε = 3 (paired against the public
   row: the same held-out rows and NER seeds for every model);
4. columns: held-out MLM loss and accuracy on FRESH patients (a public seed no training corpus
   uses), NER F1 (probe: the frozen encoder + a linear head, 3 seeds) on every task the NER stage
   knows (BC5CDR; the in-domain synthetic task when available), gain kept = (public − DP) /
   (public − non-private all) with its uncertainty (``dpbert.evaluate.utility``), wall time;
5. ``table.md`` (the README's table), ``results.json`` and ``gain_vs_epsilon.png`` (gain kept on
   held-out MLM loss vs ε, one line per trainable set) under ``--out``.

The scale is a choice of what fits the machine (``--patients``, ``--k``, ``--steps``, ``--layers``,
``--seq-len``): state it with the figures. Everything else is the demo preset.

Rows are cached by name under ``--out``, so a long table can be trained by several processes at
once — ``--train-only`` with disjoint ``--sets`` / ``--epsilons`` / ``--only`` (never two processes
on one row) — and then tabulated by the full command, which trains nothing already finished.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import time
from typing import Dict, List

log = logging.getLogger("utility_gain")


def _config(args):
    from dpbert.config import load_config

    overrides = [
        f"corpus.synthetic.patients={args.patients}", "corpus.synthetic.admissions_per_patient=1",
        "corpus.synthetic.notes_per_admission=1", f"corpus.synthetic.seed={args.corpus_seed}",
        "privacy.unit=patient", f"privacy.max_tuples_per_patient={args.k}", f"privacy.tuple_words={args.tuple_words}",
        "privacy.epsilon_budget=null", "vocab.source=public", f"model.public_layers={args.layers}",
        f"model.max_seq_length={args.seq_len}", f"training.dataset_patients={args.patients}",
        f"training.dataset_size={args.patients * args.k}", f"training.batch_size={args.batch_patients}",
        f"training.steps={args.steps}", f"training.learning_rate={args.learning_rate}",
        f"training.warmup_steps={max(1, args.steps // 20)}", f"training.checkpoint_every={args.steps}",
        "training.train_non_private_baseline=false", "membership.holdout_patient_fraction=0",
        "ner.mode=probe", "ner.learning_rate=0.01", "ner.epochs=30", "ner.patience=5", f"ner.seeds={args.ner_seeds}",
    ]
    return load_config(None, overrides + list(args.set), preset="demo")


def _trainable_field(training_config) -> bool:
    return "trainable" in {f.name for f in dataclasses.fields(training_config)}


def _split_set(spec: str):
    """``bias+head@0.01`` → ("bias+head", 0.01): a trainable set and its own learning rate
    (Adam's step size bounds how far a few hundred noisy steps can move a weight: a small set
    needs a larger one); no ``@``: the common ``--learning-rate``."""
    name, _, lr = spec.partition("@")
    return name, (float(lr) if lr else None)


def _training_config(config, spec: str, sigma=None, seed=0, non_private=False):
    tc = config.training
    trainable, lr = _split_set(spec)
    changes = {"seed": seed, "non_private": non_private}
    if lr is not None:
        changes["learning_rate"] = lr
    if sigma is not None:
        changes["noise_multiplier"] = float(sigma)
    if _trainable_field(tc):
        changes["trainable"] = [s for s in trainable.split("+")]
    elif trainable != "all":
        raise SystemExit(f"this checkout has no training.trainable: only --sets all ({trainable!r} given)")
    return dataclasses.replace(tc, **changes)


def _sigma_for(config, epsilon: float, trainable: str) -> float:
    from dpbert.accounting import accountant

    tc = _training_config(config, trainable)
    return accountant.noise_multiplier_for_planned_target(dataclasses.replace(config, training=tc), epsilon)


def _train(config, tc, tuples_dir, vocab_dir, out, name) -> Dict:
    from dpbert.stages import pretrain

    model_dir = os.path.join(out, "models", name)
    if os.path.exists(os.path.join(model_dir, "dp_events.json")):
        with open(os.path.join(model_dir, "bench_row.json"), encoding="utf-8") as f:
            return json.load(f)  # resumable: a finished row is not trained again
    os.makedirs(model_dir, exist_ok=True)
    t0 = time.time()
    result = pretrain.pretrain(pretrain.PretrainInputs(tuples_dir, vocab_dir, vocab_event=None), model_dir,
                               model_config=config.model, training_config=tc, privacy_config=config.privacy,
                               membership_config=config.membership, pipeline_root=os.path.join(out, "root", name),
                               options=pretrain.PretrainOptions(export_saved_model=False))
    row = {"name": name, "model_dir": model_dir, "train_seconds": round(time.time() - t0, 1),
           "epsilon": result.epsilon, "sigma": tc.noise_multiplier if not tc.non_private else 0.0,
           "steps": result.properties.get("steps_taken_total")}
    with open(os.path.join(model_dir, "bench_row.json"), "w", encoding="utf-8") as f:
        json.dump(row, f)
    return row


def _ner_tasks(config):
    """(name, train, dev, test) of every NER task the stage knows: BC5CDR, and the in-domain
    synthetic task when this checkout has it (``ner.task: synthetic``)."""
    from dpbert.stages import ner as ner_stage

    tasks = []
    fields = {f.name for f in dataclasses.fields(config.ner)}
    for task in ("bc5cdr", "synthetic"):
        if task == "synthetic" and "task" not in fields:
            continue
        cfg = dataclasses.replace(config.ner, **({"task": task} if "task" in fields else {}))
        train, dev, test, _ = ner_stage.load_ner_data(cfg)
        tasks.append((task, train, dev, test))
    return tasks


def _heldout_ids(config, tokenizer, spec):
    """Token ids of the held-out MLM rows: notes of FRESH patients (the NER stage's public held-out
    seed, 10× its patients) that no training corpus uses."""
    from dpbert.data.synthetic import generate_notes
    from dpbert.data.tuples import corpus_tuples
    from dpbert.stages.ner import HELDOUT_PATIENTS, HELDOUT_SEED
    from dpbert.vocab.wordpiece import tokenize_tuples

    return tokenize_tuples(tokenizer, (t.words for t in corpus_tuples(
        generate_notes(patients=HELDOUT_PATIENTS * 10, seed=HELDOUT_SEED), config.privacy.tuple_words)),
        spec.max_seq_length)


def _evaluate(config, rows: List[Dict], vocab_dir: str, out_dir: str):
    """Held-out MLM loss/accuracy and NER F1 per task for every row (the public start included),
    one row at a time, each cached next to its model (``bench_metrics.json``): rows added to a
    finished table cost only their own evaluation."""
    from dpbert.evaluate.ner import NERSettings
    from dpbert.evaluate.ner_models import HeldoutMLM, encoder_builder, evaluate_rows, mlm_builder
    from dpbert.network.bert import load_bert
    from dpbert.stages.pretrain import public_start_weights
    from dpbert.vocab.wordpiece import SPECIAL_TOKENS, load_tokenizer

    tokenizer = load_tokenizer(vocab_dir)
    spec = load_bert(os.path.join(rows[0]["model_dir"], "model")).spec
    specials = [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]
    heldout = _heldout_ids(config, tokenizer, spec)
    seeds = [config.ner.seed + i for i in range(config.ner.seeds)]
    tasks = _ner_tasks(config)
    weights = None
    out: Dict[str, Dict] = {}
    mlm_sums: Dict[str, Dict] = {}
    for name, model_dir in [("public", os.path.join(out_dir, "public"))] + [(r["name"], r["model_dir"]) for r in rows]:
        cache = os.path.join(model_dir, "bench_metrics.json")
        if os.path.exists(cache):
            with open(cache, encoding="utf-8") as f:
                stored = json.load(f)
            out[name], mlm_sums[name] = stored["metrics"], stored["mlm"]
            continue
        if name == "public":
            if weights is None:
                weights, _, _ = public_start_weights(config.model, config.training, tokenizer, vocab_dir)
            encoder, mlm = (encoder_builder(None, spec, seed=config.training.seed, weights=weights),
                            mlm_builder(None, spec, seed=config.training.seed, weights=weights))
        else:
            encoder, mlm = encoder_builder(model_dir), mlm_builder(model_dir)
        metrics: Dict = {}
        t0 = time.time()
        for task, train, dev, test in tasks:
            results, mlm_rows = evaluate_rows(
                {name: encoder}, {name: mlm}, tokenizer, (train, dev, test),
                HeldoutMLM(heldout, specials, tokenizer.token_to_id("[MASK]"), spec.max_predictions,
                           seed=config.ner.seed),
                NERSettings(config.ner.epochs, max_seq_length=spec.max_seq_length, batch_size=config.ner.batch_size,
                            learning_rate=config.ner.learning_rate, patience=config.ner.patience,
                            train_encoder=False), seeds)
            r = results[name]
            metrics.update({"heldout_mlm_loss": r["heldout_mlm_loss"], "heldout_mlm_accuracy": r["heldout_mlm_accuracy"],
                            f"ner_{task}_f1_mean": r["f1_mean"], f"ner_{task}_f1_std": r["f1_std"],
                            f"ner_{task}_f1_seeds": r["f1_seeds"]})
            sums = {k: [float(x) for x in v] if hasattr(v, "__len__") else v for k, v in mlm_rows[name].items()}
        metrics["eval_seconds"] = round(time.time() - t0, 1)
        os.makedirs(model_dir, exist_ok=True)
        with open(cache, "w", encoding="utf-8") as f:
            json.dump({"metrics": metrics, "mlm": sums}, f)
        out[name], mlm_sums[name] = metrics, sums
    return out, mlm_sums, len(seeds)


def _pilot_report(config, rows: List[Dict], vocab_dir: str, out: str):
    """Held-out MLM loss of every DP row and of the public start (the choice of the best set)."""
    from dpbert.evaluate.mlm_loss import heldout_mlm_metrics
    from dpbert.evaluate.ner_models import mlm_builder
    from dpbert.network.bert import load_bert
    from dpbert.stages.pretrain import public_start_weights
    from dpbert.vocab.wordpiece import SPECIAL_TOKENS, load_tokenizer

    tokenizer = load_tokenizer(vocab_dir)
    spec = load_bert(os.path.join(rows[0]["model_dir"], "model")).spec
    specials = [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]
    heldout = _heldout_ids(config, tokenizer, spec)
    weights, _, _ = public_start_weights(config.model, config.training, tokenizer, vocab_dir)
    builders = {"public": mlm_builder(None, spec, seed=config.training.seed, weights=weights)}
    builders.update({row["name"]: mlm_builder(row["model_dir"]) for row in rows})
    lines = []
    for name, build in builders.items():
        m = heldout_mlm_metrics(build(), heldout, specials, tokenizer.token_to_id("[MASK]"), spec.max_predictions,
                                seed=config.ner.seed)
        lines.append(f"{name}: held-out MLM loss {m['loss']:.3f}, accuracy {m['accuracy']:.3f}")
    with open(os.path.join(out, "pilot.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def _gains(metrics, mlm_sums, seeds: int, name: str, reference_np: str):
    from dpbert.evaluate.utility import utility_table

    table = {"public": dict(metrics["public"]), "dp": dict(metrics[name]), "non_private": dict(metrics[reference_np])}
    out = {}
    tasks = sorted({k[len("ner_"):-len("_f1_mean")] for k in metrics[name] if k.endswith("_f1_mean")})
    for i, task in enumerate(tasks or [None]):
        rows = {k: {"heldout_mlm_loss": v["heldout_mlm_loss"], "heldout_mlm_accuracy": v["heldout_mlm_accuracy"],
                    "ner_f1_mean": v.get(f"ner_{task}_f1_mean"), "ner_f1_std": v.get(f"ner_{task}_f1_std")}
                for k, v in table.items()}
        sums = {"public": mlm_sums["public"], "dp": mlm_sums[name], "non_private": mlm_sums[reference_np]}
        u = utility_table(rows, seeds, sums)
        if i == 0:
            out["gain_kept_mlm_loss"], out["gain_kept_mlm_loss_std"] = u["gain_kept_mlm_loss"], u["gain_kept_mlm_loss_std"]
        out[f"gain_kept_ner_{task}"] = u["gain_kept_ner_f1"]
        out[f"gain_kept_ner_{task}_std"] = u["gain_kept_ner_f1_std"]
    return out


def _fmt(x, spec=".3f"):
    return "n/a" if x is None else format(x, spec)


def _gain_cell(row: Dict, key: str) -> str:
    """``—`` for a row without a gain (the references), ``n/a (…)`` where the gain is undefined
    (``dpbert.evaluate.utility``: the non-private row does not beat the public one by its noise)."""
    if key not in row:
        return "—"
    if row[key] is None:
        return "n/a (non-private gain not significant)"
    return f"{_fmt(row[key], '.2f')} ± {_fmt(row.get(key + '_std'), '.2f')}"


def _table(rows: List[Dict], tasks: List[str]) -> str:
    head = ["row", "ε/patient", "σ", "held-out MLM loss", "acc"] + [f"{t} F1" for t in tasks] + \
           ["gain kept (MLM loss)"] + [f"gain kept ({t})" for t in tasks] + ["train s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["name"], _fmt(r.get("epsilon"), ".3g"), _fmt(r.get("sigma"), ".3g"),
                 _fmt(r.get("heldout_mlm_loss")), _fmt(r.get("heldout_mlm_accuracy"))]
        cells += [f"{_fmt(r.get(f'ner_{t}_f1_mean'))} ± {_fmt(r.get(f'ner_{t}_f1_std'))}" for t in tasks]
        cells += [_gain_cell(r, key) for key in ["gain_kept_mlm_loss"] + [f"gain_kept_ner_{t}" for t in tasks]]
        cells.append(_fmt(r.get("train_seconds"), ".0f"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plot(rows: List[Dict], sets: List[str], path: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for s in sets:
        pts = sorted((r["epsilon"], r["gain_kept_mlm_loss"]) for r in rows
                     if r.get("set") == s and r.get("dp") and r.get("seed", 0) == 0 and r.get("gain_kept_mlm_loss") is not None)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xscale("log")
    ax.set_xlabel("ε per patient (PLD, whole run: vocab.source public)")
    ax.set_ylabel("gain kept, held-out MLM loss")
    ax.legend(title="training.trainable")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--patients", type=int, default=10000)
    parser.add_argument("--corpus-seed", type=int, default=1234)
    parser.add_argument("--k", type=int, default=1, help="tuples per patient per step")
    parser.add_argument("--tuple-words", type=int, default=24)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch-patients", type=int, default=128)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--sets", default="all,bias+head@0.01",
                        help="trainable sets (names joined with +), each optionally @ its learning rate")
    parser.add_argument("--epsilons", default="1,3,8")
    parser.add_argument("--set-epsilons", default=None,
                        help="per-set ε lists that replace --epsilons for those sets, e.g. 'all=3' or 'all=1/3;lora=3' (a set "
                             "that costs several times the best set's step: fewer rows where the cores are few)")
    parser.add_argument("--seeds", type=int, default=3, help="DP training seeds at ε = 3")
    parser.add_argument("--seed-sets", default=None,
                        help="the sets that get --seeds training seeds at ε = 3 (default: every set)")
    parser.add_argument("--ner-seeds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], help="extra section.field=value overrides")
    parser.add_argument("--pilot", action="store_true",
                        help="choose the best set: DP rows only, held-out MLM loss only (no NER, no non-private rows)")
    parser.add_argument("--only", action="append", default=[],
                        help="with --train-only: train only the rows of this name (repeatable), e.g. "
                             "'DP bias+head@0.01 ε=3 seed 2' — one process per row on the same --out")
    parser.add_argument("--train-only", action="store_true",
                        help="train (and cache) the rows, evaluate nothing: run one process per set in parallel "
                             "on the same --out, then the full command once more to evaluate and tabulate")
    args = parser.parse_args()
    if args.only and not args.train_only:
        parser.error("--only needs --train-only (a table needs every row)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    from dpbert.config import CorpusConfig  # noqa: F401 -- config import first: fail fast on bad --set
    from dpbert.stages import ingest, vocabulary

    config = _config(args)
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    tuples_dir, vocab_dir = os.path.join(args.out, "tuples"), os.path.join(args.out, "vocabulary")
    if not os.path.exists(os.path.join(tuples_dir, "_SUCCESS")):
        ingest.ingest(config.corpus, tuples_dir, config.privacy.tuple_words)
        open(os.path.join(tuples_dir, "_SUCCESS"), "w").close()
    if not os.path.exists(os.path.join(vocab_dir, "vocab.txt")):
        vocabulary.public_vocabulary(vocab_dir, config.vocab, config.privacy)

    sets = args.sets.split(",")
    epsilons = [float(e) for e in args.epsilons.split(",")]
    set_epsilons = {name: [float(e) for e in values.split("/")] for name, _, values in
                    (item.partition("=") for item in (args.set_epsilons or "").split(";") if item)}
    rows: List[Dict] = []
    for s in ([] if args.pilot or args.only else sets):  # non-private rows: all, and each other set
        rows.append(dict(_train(config, _training_config(config, s, non_private=True), tuples_dir, vocab_dir,
                                args.out, f"non-private {s}"), set=s, dp=False))
    for s in sets:
        for eps in set_epsilons.get(s, epsilons):
            sigma = _sigma_for(config, eps, s)
            seeded = args.seed_sets is None or s in args.seed_sets.split(",")
            for seed in range(args.seeds if eps == 3 and seeded else 1):
                name = f"DP {s} ε={eps:g}" + (f" seed {seed}" if seed else "")
                if args.only and name not in args.only:
                    continue
                row = _train(config, _training_config(config, s, sigma=sigma, seed=seed), tuples_dir, vocab_dir,
                             args.out, name)
                rows.append(dict(row, set=s, dp=True, target_epsilon=eps, seed=seed))
    log.info("trained %d rows in %.0f s", len(rows), time.time() - t_start)
    if args.train_only:
        return
    if args.pilot:
        _pilot_report(config, rows, vocab_dir, args.out)
        return
    metrics, mlm_sums, ner_seeds = _evaluate(config, rows, vocab_dir, args.out)
    table_rows = [dict(name="public", epsilon=0.0, sigma=None, **metrics["public"])]
    for row in rows:
        full = dict(row, **metrics[row["name"]])
        if row["name"] != "non-private all":
            full.update(_gains(metrics, mlm_sums, ner_seeds, row["name"], "non-private all"))
        table_rows.append(full)
    tasks = sorted({k[len("ner_"):-len("_f1_mean")] for k in metrics["public"] if k.endswith("_f1_mean")})
    scale = (f"{args.patients} patients (one note each, {config.privacy.tuple_words}-word tuples), k = {args.k}, "
             f"{args.batch_patients} patients/step, {args.steps} steps, {args.layers} MiniLM layers, "
             f"{args.seq_len} tokens, lr {args.learning_rate}, NER probe × {ner_seeds} seeds; "
             f"{time.time() - t_start:.0f} s in all on {os.cpu_count()} cores")
    text = f"Scale: {scale}\n\n" + _table(table_rows, tasks)
    with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump({"scale": scale, "args": vars(args), "rows": table_rows}, f, indent=2, default=str)
    _plot(table_rows, sets, os.path.join(args.out, "gain_vs_epsilon.png"))
    print(text)


if __name__ == "__main__":
    main()
