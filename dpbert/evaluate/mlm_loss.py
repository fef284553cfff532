"""Held-out masked-LM loss: the same masked positions for every model, so losses compare.

The positions are chosen by the training masking (``dpbert.engine.masking``, one implementation)
from a public seed, each replaced by [MASK]; the loss is the mean cross-entropy of the true
tokens at the masked positions over all examples. It compares the DP model with the
non-private baseline and with a model without domain pre-training on public held-out text; the
accuracy is the top-1 prediction's at the same positions.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def masked_batch(token_ids: np.ndarray, special_ids: Sequence[int], mask_id: int, max_predictions: int,
                 mask_probability: float, seed: int):
    """(masked ids [n, L], positions [n, M], labels [n, M], weights [n, M]) — deterministic.

    The training masking (``dpbert.engine.masking``: k = round(p·candidates) positions per row,
    at most M) with a public seed, every chosen token replaced by [MASK].
    """
    from dpbert.engine.masking import mask_with_seed

    m = mask_with_seed(token_ids, seed, 0, special_token_ids=special_ids, mask_token_id=mask_id,
                       vocab_size=None, max_predictions=max_predictions, mask_probability=mask_probability,
                       mask_fraction=1.0, random_fraction=0.0)
    return m["input_ids"], m["masked_positions"], m["masked_labels"], m["masked_weights"]


def heldout_mlm_metrics(mlm_model, token_ids: np.ndarray, special_ids: Sequence[int], mask_id: int,
                        max_predictions: int, mask_probability: float = 0.15, seed: int = 0,
                        batch_size: int = 64) -> dict:
    """``{"loss", "accuracy", "row_loss_sum", "row_correct", "row_count"}``: the mean cross-entropy
    (nats) and the top-1 accuracy at the masked positions over all examples, and the per-row sums
    (numpy arrays; for a paired bootstrap over rows). ``mlm_model`` as ``BertModels.mlm``; one
    forward pass per batch."""
    import tensorflow as tf

    ids, positions, labels, weights = masked_batch(token_ids, special_ids, mask_id, max_predictions,
                                                   mask_probability, seed)
    row_loss, row_correct = [], []
    for start in range(0, ids.shape[0], batch_size):
        sl = slice(start, start + batch_size)
        logits = mlm_model({"input_ids": ids[sl], "masked_positions": positions[sl]}, training=False)
        logits = np.asarray(logits)
        loss = np.asarray(tf.keras.losses.sparse_categorical_crossentropy(labels[sl], logits, from_logits=True))
        hit = (np.argmax(logits, axis=-1) == labels[sl]).astype(np.float64)
        row_loss.append((loss * weights[sl]).sum(axis=1))
        row_correct.append((hit * weights[sl]).sum(axis=1))
    row_loss_sum = np.concatenate(row_loss) if row_loss else np.zeros(0)
    row_correct_sum = np.concatenate(row_correct) if row_correct else np.zeros(0)
    row_count = np.asarray(weights, np.float64).sum(axis=1)
    count = float(row_count.sum())
    if count == 0:
        raise ValueError("no maskable token in the held-out examples")
    return {"loss": float(row_loss_sum.sum()) / count, "accuracy": float(row_correct_sum.sum()) / count,
            "row_loss_sum": row_loss_sum, "row_correct": row_correct_sum, "row_count": row_count}


def heldout_mlm_loss(mlm_model, token_ids: np.ndarray, special_ids: Sequence[int], mask_id: int,
                     max_predictions: int, mask_probability: float = 0.15, seed: int = 0,
                     batch_size: int = 64) -> float:
    """Mean cross-entropy (nats) at the masked positions; ``mlm_model`` as ``BertModels.mlm``."""
    return heldout_mlm_metrics(mlm_model, token_ids, special_ids, mask_id, max_predictions, mask_probability,
                               seed, batch_size)["loss"]
