"""NerEvaluator's stage: entity-extraction F1 after fine-tuning (Hoory et al.'s Table 2) and
held-out MLM loss, for the DP model, the non-private model and the model without domain
pre-training.

The held-out text is freshly generated synthetic notes (a seed no training run uses): public by
construction, in the training domain.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Optional

from dpbert import schema
from dpbert.config import NerConfig
from dpbert.stages.result import StageResult

log = logging.getLogger("dpbert.ner")

HELDOUT_SEED = 987654321
HELDOUT_PATIENTS = 10
REPORT_FILE = "ner_report.json"


def ner_evaluation(model_dir: str, report_dir: str, config: NerConfig, tuple_words: int,
                   baseline_model_dir: Optional[str] = None) -> StageResult:
    """Fine-tune and test each model (``dp``, ``non_dp`` with a baseline, ``no_pretraining``) on
    the NER data (``ner.train_path`` or the bundled BC5CDR subset); write ``ner_report.json``."""
    from dpbert.data.synthetic import generate_notes
    from dpbert.data.tuples import corpus_tuples
    from dpbert.evaluate import ner
    from dpbert.evaluate.ner_models import encoder_builder, evaluate_rows
    from dpbert.model.bert import build_bert, load_bert
    from dpbert.vocab.wordpiece import SPECIAL_TOKENS, load_tokenizer, tokenize_tuples

    cfg = config
    if cfg.train_path:
        train, test = ner.read_conll(cfg.train_path), ner.read_conll(cfg.test_path)
        source = "user data"
    else:
        train, test = ner.bundled_bc5cdr("train"), ner.bundled_bc5cdr("test")
        source = "bundled BC5CDR subset (CC BY 4.0)"
    if cfg.max_train_sentences:
        train = train[: cfg.max_train_sentences]
    tokenizer = load_tokenizer(os.path.join(model_dir, schema.TOKENIZER_DIR))
    spec = load_bert(os.path.join(model_dir, schema.MODEL_DIR)).spec
    specials = [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]
    heldout = tokenize_tuples(tokenizer, (t.words for t in corpus_tuples(
        generate_notes(patients=HELDOUT_PATIENTS, seed=HELDOUT_SEED), tuple_words)), spec.max_seq_length)

    rows = {"dp": encoder_builder(model_dir)}
    mlm = {"dp": lambda: load_bert(os.path.join(model_dir, schema.MODEL_DIR)).mlm}
    if baseline_model_dir is not None:
        rows["non_dp"] = encoder_builder(baseline_model_dir)
        mlm["non_dp"] = lambda: load_bert(os.path.join(baseline_model_dir, schema.MODEL_DIR)).mlm
    # Same architecture and vocabulary, no domain pre-training.
    rows["no_pretraining"] = encoder_builder(None, spec, seed=cfg.seed)
    mlm["no_pretraining"] = lambda: build_bert(spec, seed=cfg.seed).mlm
    log.info("ner: fine-tuning %s on %d sentences, testing on %d (%s)", list(rows), len(train), len(test), source)
    results = evaluate_rows(rows, mlm, tokenizer, train, test, heldout, specials, tokenizer.token_to_id("[MASK]"),
                            spec.max_predictions, cfg.epochs, cfg.learning_rate, cfg.batch_size,
                            spec.max_seq_length, cfg.seed)
    os.makedirs(report_dir, exist_ok=True)
    with open(os.path.join(report_dir, REPORT_FILE), "w", encoding="utf-8") as f:
        json.dump({"data": source, "rows": results}, f, indent=2)
    table = [{"model": name, **{k: v for k, v in r.items() if k != "per_type"}, **{
        f"f1_{t}": f for t, f in r["per_type"].items()}} for name, r in results.items()]
    log.info("ner: %s", {k: (round(v["f1"], 4), round(v["heldout_mlm_loss"], 3)) for k, v in results.items()})
    return StageResult(properties={
        "f1": results["dp"]["f1"], "per_type": results["dp"]["per_type"], "table": table,
        "data": source, "train_sentences": len(train), "test_sentences": len(test), "epochs": cfg.epochs,
        "heldout_mlm_loss_dp": results["dp"]["heldout_mlm_loss"],
        "heldout_mlm_loss_no_pretraining": results["no_pretraining"]["heldout_mlm_loss"],
        "dp_beats_no_pretraining_mlm": int(results["dp"]["heldout_mlm_loss"]
                                           < results["no_pretraining"]["heldout_mlm_loss"]),
        # With the non-private baseline's row, the report holds a model trained on private data
        # without noise: operator-only.
        schema.PRIVATE: int(any(name not in ("dp", "no_pretraining") for name in results)),
    })
