"""On-the-fly MLM masking with TensorFlow ops (runs inside the train step, fresh every step).

For each sequence, as in the original BERT data generator:

* candidates are the positions whose token is neither padding nor a special token
  (``[CLS]``, ``[SEP]``, ``[MASK]``, ``[UNK]``... as given by the caller);
* ``k = min(M, max(1, round(p · n_candidates)))`` of them are chosen uniformly without
  replacement (``k = 0`` when there is no candidate), ``p = mask_probability`` (0.15) and
  ``M = max_predictions`` (the model's number of prediction slots, ceil(p·L));
* each chosen token is replaced by ``[MASK]`` with probability 0.8, by a uniformly random
  non-special token with probability 0.1, and left unchanged with probability 0.1;
* labels: the original token at chosen positions; every other position is ignored. Two
  views are returned: slot form (``masked_positions``, ``masked_labels``, ``masked_weights``, what
  the MLM model consumes) and dense form ``labels`` ``[b, L]`` with ``IGNORE_LABEL`` elsewhere.

Randomness is stateless (``tf.random.stateless_*``) from a ``[2]`` int seed, so a step is
reproducible given its seed; the trainer derives the seed from the step and replica. The masking
randomness is not a privacy mechanism.
"""
from __future__ import annotations

from typing import Dict, Iterable

import numpy as np
import tensorflow as tf

IGNORE_LABEL = -100
MASK_FRACTION = 0.8
RANDOM_FRACTION = 0.1


def non_special_ids(vocab_size: int, special_token_ids: Iterable[int], pad_id: int = 0) -> np.ndarray:
    """The token ids a random replacement may use (every id but padding and specials)."""
    special = set(int(t) for t in special_token_ids) | {int(pad_id)}
    allowed = np.array([t for t in range(int(vocab_size)) if t not in special], dtype=np.int32)
    if allowed.size == 0:
        raise ValueError("the vocabulary has no non-special token")
    return allowed


def mask_tokens(input_ids: tf.Tensor, seed, *, special_token_ids: Iterable[int], mask_token_id: int,
                vocab_size: int, max_predictions: int, mask_probability: float = 0.15,
                pad_id: int = 0) -> Dict[str, tf.Tensor]:
    """Mask a batch ``input_ids`` ``[b, L]`` int32. ``seed``: shape-[2] int tensor/list.

    Returns ``input_ids`` (masked), ``masked_positions`` / ``masked_labels`` (int32 ``[b, M]``),
    ``masked_weights`` (float32 ``[b, M]``, 1 for a real prediction slot, 0 for an unused one;
    unused slots point at position 0 with label 0), and ``labels`` (int32 ``[b, L]``, the
    original token where masked, ``IGNORE_LABEL`` elsewhere).
    """
    input_ids = tf.convert_to_tensor(input_ids, tf.int32)
    special = sorted(set(int(t) for t in special_token_ids) | {int(pad_id)})
    allowed = tf.constant(non_special_ids(vocab_size, special, pad_id), tf.int32)
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    seeds = tf.random.experimental.stateless_split(seed, 4)
    shape = tf.shape(input_ids)
    batch, length = shape[0], shape[1]
    M = int(max_predictions)

    is_special = tf.reduce_any(
        tf.equal(input_ids[:, :, tf.newaxis], tf.constant(special, tf.int32)[tf.newaxis, tf.newaxis, :]),
        axis=-1)
    candidate = tf.logical_not(is_special)
    n_candidates = tf.reduce_sum(tf.cast(candidate, tf.int32), axis=1)
    k = tf.cast(tf.floor(mask_probability * tf.cast(n_candidates, tf.float32) + 0.5), tf.int32)
    k = tf.minimum(tf.maximum(k, tf.minimum(n_candidates, 1)), M)

    # Uniform choice of k candidates without replacement: the k largest of iid uniform scores.
    scores = tf.random.stateless_uniform(shape, seeds[0], minval=0.0, maxval=1.0)
    scores = tf.where(candidate, scores, -1.0)
    if M > 0:
        top_positions = tf.math.top_k(scores, k=tf.minimum(M, length)).indices
        pad_slots = M - tf.shape(top_positions)[1]
        top_positions = tf.pad(top_positions, [[0, 0], [0, pad_slots]])
    valid = tf.range(M)[tf.newaxis, :] < k[:, tf.newaxis]
    positions = tf.where(valid, top_positions, 0)
    labels = tf.where(valid, tf.gather(input_ids, positions, batch_dims=1), 0)

    # 80 / 10 / 10 replacement.
    u = tf.random.stateless_uniform([batch, M], seeds[1])
    random_tokens = tf.gather(allowed, tf.random.stateless_uniform(
        [batch, M], seeds[2], minval=0, maxval=tf.shape(allowed)[0], dtype=tf.int32))
    replacement = tf.where(u < MASK_FRACTION, tf.fill([batch, M], int(mask_token_id)),
                           tf.where(u < MASK_FRACTION + RANDOM_FRACTION, random_tokens, labels))

    rows = tf.broadcast_to(tf.range(batch)[:, tf.newaxis], [batch, M])
    scatter_index = tf.stack([rows, positions], axis=-1)
    valid_index = tf.boolean_mask(scatter_index, valid)
    masked_ids = tf.tensor_scatter_nd_update(input_ids, valid_index, tf.boolean_mask(replacement, valid))
    dense_labels = tf.tensor_scatter_nd_update(
        tf.fill(shape, IGNORE_LABEL), valid_index, tf.boolean_mask(labels, valid))
    return {
        "input_ids": masked_ids,
        "masked_positions": positions,
        "masked_labels": labels,
        "masked_weights": tf.cast(valid, tf.float32),
        "labels": dense_labels,
    }
