"""Which encoders the NER evaluator compares, and how each is rebuilt (no TFX here).

Rows of the paper's Table 2: the DP-pretrained model, the non-private model trained on the same
data, and the same architecture without domain pre-training (the public initialization: the
public checkpoint when ``model.init = minilm``, otherwise a random initialization). Every row
uses the DP vocabulary, so the comparison isolates pre-training.
"""
from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from dpbert.evaluate import ner
from dpbert.evaluate.mlm_loss import heldout_mlm_loss


def encoder_builder(model_dir: Optional[str], spec=None, seed: int = 0) -> Callable[[], object]:
    """A fresh encoder with the weights in ``model_dir`` (None: ``spec`` randomly initialized)."""
    from dpbert.model.bert import build_bert, load_bert

    def build():
        if model_dir is None:
            return build_bert(spec, seed=seed).encoder
        return load_bert(os.path.join(model_dir, "model")).encoder

    return build


def evaluate_rows(rows: Dict[str, Callable[[], object]], mlm_builders: Dict[str, Callable[[], object]],
                  tokenizer, train: Sequence[ner.Sentence], test: Sequence[ner.Sentence],
                  heldout_ids: np.ndarray, special_ids: List[int], mask_id: int, max_predictions: int,
                  epochs: int, learning_rate: float, batch_size: int, max_seq_length: int,
                  seed: int = 0) -> Dict[str, dict]:
    """F1 (micro, per type) after fine-tuning each row's encoder, and each row's held-out MLM loss."""
    results = {}
    for name, build in rows.items():
        scores = ner.finetune_and_score(build, tokenizer, train, test, epochs, max_seq_length=max_seq_length,
                                        batch_size=batch_size, learning_rate=learning_rate, seed=seed)
        mlm = mlm_builders[name]()
        results[name] = {
            "f1": scores["f1"], "precision": scores["precision"], "recall": scores["recall"],
            "per_type": {t: v["f1"] for t, v in scores["per_type"].items()},
            "heldout_mlm_loss": heldout_mlm_loss(mlm, heldout_ids, special_ids, mask_id, max_predictions,
                                                 seed=seed),
        }
    return results
