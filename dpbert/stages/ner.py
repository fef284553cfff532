"""NerEvaluator's stage: the run's utility table — held-out MLM loss and accuracy and
NER entity F1 (mean ± std over ``ner.seeds`` fine-tuning seeds, Hoory et al.'s Table 2) for the
rows ``random``, ``public`` (the public start, when ``model.init: minilm``), ``dp`` and
``non_private`` (with the baseline), and the gain kept (``dpbert.evaluate.utility``).

Contract: every input of the table is public — freshly generated held-out notes (a seed no
training run uses), public NER data (the bundled BC5CDR subset, the user's ``ner.train_path`` /
``ner.test_path``, or the in-domain synthetic task on fresh synthetic patients), a dev split
carved from each task's TRAINING sentences, and a ``public`` row rebuilt exactly as the DP trainer
builds its start (``dpbert.engine.public_warmup.public_start_weights``); with ``model.init:
random`` there is no ``public`` row and the gains are measured from ``random``. The data, the
rows and measured F1 and cost per recipe: docs/benchmarks.md ("The utility table's NER
evaluation").
"""
from __future__ import annotations

import json
import logging
import time
from typing import Optional

from dpbert import schema, storage
from dpbert.config import ModelConfig, NerConfig, TrainingConfig
from dpbert.stages.result import StageResult

log = logging.getLogger("dpbert.ner")

HELDOUT_SEED = 987654321
HELDOUT_PATIENTS = 10
REPORT_FILE = "ner_report.json"
#: The report property holding the utility table (``dpbert.report``'s ``utility`` section).
UTILITY = "utility"


#: What the primary NER column is called in the utility table (``utility.ner_task``).
USER_DATA = "user data"


def task_name(cfg: NerConfig, task: Optional[str] = None) -> str:
    """``synthetic``, ``bc5cdr`` or, for the user's IOB files (``ner.train_path``), ``user data``."""
    task = cfg.task if task is None else task
    return USER_DATA if task == "bc5cdr" and cfg.train_path else task


def load_ner_data(cfg: NerConfig, task: Optional[str] = None):
    """(train, dev, test, source) of ``task`` (default: the primary ``ner.task``): the user's IOB
    files or the bundled BC5CDR subset (``bc5cdr``), or the in-domain synthetic task's sentences
    (``synthetic``: fresh patients, ``dpbert.data.synthetic.ner_sentences``); the dev split carved
    from the training sentences (after ``max_train_sentences``)."""
    from dpbert.evaluate import ner

    task = cfg.task if task is None else task
    if task == "synthetic":
        from dpbert.data.synthetic import NER_SEED, ner_sentences

        train = [ner.Sentence(w, t) for w, t in ner_sentences("train", cfg.synthetic_train_sentences)]
        test = [ner.Sentence(w, t) for w, t in ner_sentences("test", cfg.synthetic_test_sentences)]
        source = f"synthetic in-domain notes (fresh patients, public seed {NER_SEED}; held-out lexicon entries in test)"
    elif cfg.train_path:
        train, test = ner.read_conll(cfg.train_path), ner.read_conll(cfg.test_path)
        source = USER_DATA
    else:
        train, test = ner.bundled_bc5cdr("train"), ner.bundled_bc5cdr("test")
        source = "bundled BC5CDR subset (CC BY 4.0)"
    if cfg.max_train_sentences:
        train = train[: cfg.max_train_sentences]
    train, dev = ner.split_dev(train, cfg.dev_fraction, cfg.seed)
    return train, dev, test, source


def ner_evaluation(model_dir: str, report_dir: str, config: NerConfig, tuple_words: int,
                   baseline_model_dir: Optional[str] = None, model_config: Optional[ModelConfig] = None,
                   training_config: Optional[TrainingConfig] = None) -> StageResult:
    """Build the utility table of the DP model in ``model_dir`` (and the baseline's); write
    ``ner_report.json``. ``model_config`` / ``training_config`` (seed, mask_probability): how the
    trainer built its public start (None or ``model.init: random``: no ``public`` row)."""
    from dpbert.data.synthetic import generate_notes
    from dpbert.data.tuples import corpus_tuples
    from dpbert.evaluate.ner import NERSettings
    from dpbert.evaluate.ner_models import HeldoutMLM, encoder_builder, evaluate_rows, mlm_builder
    from dpbert.evaluate.utility import utility_table
    from dpbert.network.bert import load_bert
    from dpbert.vocab.wordpiece import SPECIAL_TOKENS, load_tokenizer, tokenize_tuples

    cfg = config
    t0 = time.time()
    train, dev, test, source = load_ner_data(cfg)
    tokenizer_dir = storage.join(model_dir, schema.TOKENIZER_DIR)
    tokenizer = load_tokenizer(tokenizer_dir)
    spec = load_bert(storage.join(model_dir, schema.MODEL_DIR)).spec
    specials = [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]
    heldout = tokenize_tuples(tokenizer, (t.words for t in corpus_tuples(
        generate_notes(patients=HELDOUT_PATIENTS, seed=HELDOUT_SEED), tuple_words)), spec.max_seq_length)

    # Same architecture and vocabulary, random initialization.
    rows = {"random": encoder_builder(None, spec, seed=cfg.seed)}
    mlm = {"random": mlm_builder(None, spec, seed=cfg.seed)}
    public_record = None
    if model_config is not None and model_config.init == "minilm":
        from dpbert.engine.public_warmup import public_start_weights

        tc = training_config or TrainingConfig()
        weights, public_record, _ = public_start_weights(model_config, tc, tokenizer, tokenizer_dir)
        rows["public"] = encoder_builder(None, spec, seed=tc.seed, weights=weights)
        mlm["public"] = mlm_builder(None, spec, seed=tc.seed, weights=weights)
    rows["dp"], mlm["dp"] = encoder_builder(model_dir), mlm_builder(model_dir)
    if baseline_model_dir is not None:
        rows["non_private"], mlm["non_private"] = encoder_builder(baseline_model_dir), mlm_builder(baseline_model_dir)
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    extra = {task: load_ner_data(cfg, task)[:3] for task in cfg.tasks()[1:]}
    log.info("ner: %s %s × %d seeds on %d sentences (dev %d), testing on %d (%s)%s",
             "probing" if cfg.mode == "probe" else "fine-tuning", list(rows), len(seeds), len(train), len(dev),
             len(test), source, "".join(f"; {task}: {len(a)} + {len(b)} dev, test {len(c)}"
                                        for task, (a, b, c) in extra.items()))
    results, mlm_rows = evaluate_rows(
        rows, mlm, tokenizer, (train, dev, test),
        HeldoutMLM(heldout, specials, tokenizer.token_to_id("[MASK]"), spec.max_predictions, seed=cfg.seed),
        NERSettings(cfg.epochs, max_seq_length=spec.max_seq_length, batch_size=cfg.batch_size,
                    learning_rate=cfg.learning_rate, patience=cfg.patience, train_encoder=cfg.mode == "finetune"),
        seeds, extra_tasks=extra)
    columns = {}
    for name, r in results.items():
        columns[name] = {"heldout_mlm_loss": r["heldout_mlm_loss"], "heldout_mlm_accuracy": r["heldout_mlm_accuracy"],
                         "ner_f1_mean": r["f1_mean"], "ner_f1_std": r["f1_std"]}
        synthetic = (r.get("tasks") or {}).get("synthetic")
        if synthetic is not None:
            columns[name].update(ner_synthetic_f1_mean=synthetic["f1_mean"], ner_synthetic_f1_std=synthetic["f1_std"])
    utility = utility_table(columns, len(seeds), mlm_rows, bootstrap_seed=cfg.seed, ner_task=task_name(cfg),
                            ner_mode=cfg.mode)
    seconds = round(time.time() - t0, 1)
    storage.storage_for(report_dir).makedirs(report_dir)
    storage.write_text(storage.join(report_dir, REPORT_FILE), schema.dumps(
        {"data": source, "seeds": seeds, "rows": results, UTILITY: utility,
         "public_start": public_record, "seconds": seconds}, indent=2))
    table = [{"model": name, **{k: v for k, v in r.items() if k not in ("per_type", "f1_seeds", "best_epochs",
                                                                         "dev_f1", "f1", "tasks")},
              **{f"f1_{t}": f for t, f in r["per_type"].items()},
              **{f"{task}_f1_mean": v["f1_mean"] for task, v in (r.get("tasks") or {}).items()}}
             for name, r in results.items()]
    log.info("ner: utility %s; gain kept: MLM loss %s, NER F1 %s, synthetic NER F1 %s (%.0f s)",
             {k: (round(v["f1_mean"], 4), round(v["heldout_mlm_loss"], 3)) for k, v in results.items()},
             *(utility[g] if utility[g] is not None else f"n/a ({utility[g + '_reason']})"
               for g in ("gain_kept_mlm_loss", "gain_kept_ner_f1", "gain_kept_ner_synthetic_f1")), seconds)
    return StageResult(properties={
        "f1": results["dp"]["f1_mean"], "f1_std": results["dp"]["f1_std"], "per_type": results["dp"]["per_type"],
        "table": table, UTILITY: utility, "data": source, "train_sentences": len(train),
        "dev_sentences": len(dev), "test_sentences": len(test), "epochs": cfg.epochs, "seeds": len(seeds),
        "mode": cfg.mode, "task": task_name(cfg),
        "heldout_mlm_loss_dp": results["dp"]["heldout_mlm_loss"],
        "heldout_mlm_accuracy_dp": results["dp"]["heldout_mlm_accuracy"],
        "seconds": seconds,
        # With the non-private baseline's row, the report holds a model trained on private data
        # without noise: operator-only (the released view keeps the public / DP rows only).
        schema.PRIVATE: int(any(name not in ("dp", "public", "random") for name in results)),
    })
