"""Held-out masked-LM loss: the same masked positions for every model, so losses compare.

Every non-special token is masked (replaced by [MASK]) independently with probability
``mask_probability`` from a seeded generator; the loss is the mean cross-entropy of the true
tokens at the masked positions over all examples. Used to compare the DP model with the
non-private baseline and with a model without domain pre-training on public held-out text.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def masked_batch(token_ids: np.ndarray, special_ids: Sequence[int], mask_id: int, max_predictions: int,
                 mask_probability: float, seed: int):
    """(masked ids [n, L], positions [n, M], labels [n, M], weights [n, M]) — deterministic."""
    rng = np.random.default_rng(seed)
    ids = np.asarray(token_ids, dtype=np.int32).copy()
    n, _ = ids.shape
    positions = np.zeros((n, max_predictions), np.int32)
    labels = np.zeros((n, max_predictions), np.int32)
    weights = np.zeros((n, max_predictions), np.float32)
    special = np.isin(ids, np.asarray(list(special_ids), np.int32))
    for i in range(n):
        candidates = np.nonzero(~special[i])[0]
        chosen = candidates[rng.random(candidates.size) < mask_probability][:max_predictions]
        if chosen.size == 0 and candidates.size:
            chosen = candidates[:1]
        k = chosen.size
        positions[i, :k], labels[i, :k], weights[i, :k] = chosen, ids[i, chosen], 1.0
        ids[i, chosen] = mask_id
    return ids, positions, labels, weights


def heldout_mlm_loss(mlm_model, token_ids: np.ndarray, special_ids: Sequence[int], mask_id: int,
                     max_predictions: int, mask_probability: float = 0.15, seed: int = 0,
                     batch_size: int = 64) -> float:
    """Mean cross-entropy (nats) at the masked positions; ``mlm_model`` as ``BertModels.mlm``."""
    import tensorflow as tf

    ids, positions, labels, weights = masked_batch(token_ids, special_ids, mask_id, max_predictions,
                                                   mask_probability, seed)
    total, count = 0.0, 0.0
    for start in range(0, ids.shape[0], batch_size):
        sl = slice(start, start + batch_size)
        logits = mlm_model({"input_ids": ids[sl], "masked_positions": positions[sl]}, training=False)
        loss = tf.keras.losses.sparse_categorical_crossentropy(labels[sl], logits, from_logits=True)
        total += float(tf.reduce_sum(loss * weights[sl]))
        count += float(weights[sl].sum())
    if count == 0:
        raise ValueError("no maskable token in the held-out examples")
    return total / count
