"""MLM masking: the ONE implementation, used by training and by every evaluation.

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

Randomness is keyed PER EXAMPLE, never by its position in a batch
------------------------------------------------------------------
Every random number used for example i comes from a counter-based hash of
``(key, step, id_i, position, stream)`` (SplitMix64 finaliser, ``example_keys``), where ``id_i``
is the example's own record id (a tuple id from the corpus, not a row index assigned after
reading) and ``key`` is a secret drawn from OS entropy by the trainer. So example i's mask is a
function of i's own data and of (key, step, id_i) only: adding or removing another example u —
which shifts every later example to another slot of the sorted Poisson batch — changes no other
example's mask, and the clipped sum S(D ∪ {u}) − S(D) is exactly u's clipped gradient, of norm
≤ C (``tests/model/test_neighbours.py`` checks it through the real packing and ghost clipping).
Keyed by the slot instead, every later example's mask moves and the sum moves by several C: that
was a real bug (masks from the public ``training.seed`` and the batch slot).

Evaluations (held-out MLM loss, membership inference) use the same function with a public key and
the row index as id: their masks are not a privacy mechanism, only the same for every model.

The hash is vectorised numpy (uint64 arithmetic wraps mod 2⁶⁴ by definition), so a batch is
masked on the host in microseconds per example, before the compiled step.
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional

import numpy as np

IGNORE_LABEL = -100
MASK_FRACTION = 0.8
RANDOM_FRACTION = 0.1

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
# Streams of random numbers per example (disjoint counters).
_SCORES, _REPLACE, _TOKEN = 0, 1, 2


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays (a bijection with full avalanche)."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def example_keys(key: int, step: int, example_ids) -> np.ndarray:
    """Per-example keys ``[b]`` uint64 from (secret key, step, example id)."""
    ids = np.asarray(example_ids).astype(np.uint64)
    base = _mix(_mix(np.array([int(key) & 0xFFFFFFFFFFFFFFFF], np.uint64)) ^
                np.array([int(step) & 0xFFFFFFFFFFFFFFFF], np.uint64))
    return _mix(base ^ _mix(ids))


def _uniform(keys: np.ndarray, stream: int, width: int) -> np.ndarray:
    """``[b, width]`` uniforms in [0, 1): element (i, j) depends only on keys[i], stream, j."""
    counters = _mix(np.uint64(stream) << np.uint64(32) | np.arange(width, dtype=np.uint64))
    h = _mix(keys[:, None] ^ counters[None, :])
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def non_special_ids(vocab_size: int, special_token_ids: Iterable[int], pad_id: int = 0) -> np.ndarray:
    """The token ids a random replacement may use (every id but padding and specials)."""
    special = set(int(t) for t in special_token_ids) | {int(pad_id)}
    allowed = np.array([t for t in range(int(vocab_size)) if t not in special], dtype=np.int32)
    if allowed.size == 0:
        raise ValueError("the vocabulary has no non-special token")
    return allowed


def mask_tokens(input_ids, keys, *, special_token_ids: Iterable[int], mask_token_id: int,
                vocab_size: Optional[int], max_predictions: int, mask_probability: float = 0.15,
                pad_id: int = 0, mask_fraction: float = MASK_FRACTION,
                random_fraction: float = RANDOM_FRACTION) -> Dict[str, np.ndarray]:
    """Mask ``input_ids`` ``[b, L]``; ``keys`` ``[b]`` uint64 from ``example_keys``.

    ``mask_fraction`` / ``random_fraction``: the 80/10/10 rule (evaluations that replace every
    chosen token by ``[MASK]`` pass 1 and 0; ``vocab_size`` may then be None).

    Returns numpy arrays: ``input_ids`` (masked, int32 ``[b, L]``), ``masked_positions`` /
    ``masked_labels`` (int32 ``[b, M]``), ``masked_weights`` (float32 ``[b, M]``, 1 for a real
    prediction slot, 0 for an unused one; unused slots point at position 0 with label 0), and
    ``labels`` (int32 ``[b, L]``, the original token where masked, ``IGNORE_LABEL`` elsewhere).
    Row i depends only on ``input_ids[i]`` and ``keys[i]``.
    """
    ids = np.asarray(input_ids, dtype=np.int32)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be [b, L], got shape {ids.shape}")
    keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
    if keys.shape[0] != ids.shape[0]:
        raise ValueError(f"{keys.shape[0]} keys for {ids.shape[0]} sequences")
    b, length = ids.shape
    M = int(max_predictions)
    special = np.asarray(sorted(set(int(t) for t in special_token_ids) | {int(pad_id)}), np.int32)
    allowed = non_special_ids(vocab_size, special, pad_id) if random_fraction > 0 else np.zeros(1, np.int32)

    candidate = ~np.isin(ids, special)
    n_candidates = candidate.sum(axis=1)
    k = np.floor(mask_probability * n_candidates + 0.5).astype(np.int64)
    k = np.minimum(np.maximum(k, np.minimum(n_candidates, 1)), M)

    # Uniform choice of k candidates without replacement: the k largest of iid uniform scores.
    scores = np.where(candidate, _uniform(keys, _SCORES, length), -1.0)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :M]
    if order.shape[1] < M:
        order = np.pad(order, [(0, 0), (0, M - order.shape[1])])
    valid = np.arange(M)[None, :] < k[:, None]
    positions = np.where(valid, order, 0).astype(np.int32)
    labels = np.where(valid, np.take_along_axis(ids, positions, axis=1), 0).astype(np.int32)

    # 80 / 10 / 10 replacement.
    u = _uniform(keys, _REPLACE, M)
    random_tokens = allowed[np.minimum((_uniform(keys, _TOKEN, M) * allowed.size).astype(np.int64),
                                       allowed.size - 1)]
    replacement = np.where(u < mask_fraction, int(mask_token_id),
                           np.where(u < mask_fraction + random_fraction, random_tokens, labels))
    rows, slots = np.nonzero(valid)
    masked = ids.copy()
    masked[rows, positions[rows, slots]] = replacement[rows, slots]
    dense = np.full((b, length), IGNORE_LABEL, np.int32)
    dense[rows, positions[rows, slots]] = labels[rows, slots]
    return {
        "input_ids": masked,
        "masked_positions": positions,
        "masked_labels": labels,
        "masked_weights": valid.astype(np.float32),
        "labels": dense,
    }


def mask_with_seed(input_ids, seed: int, draw: int = 0, **kwargs) -> Dict[str, np.ndarray]:
    """Evaluation masks: a public ``seed``/``draw`` and the row index as id (same for every model)."""
    ids = np.asarray(input_ids)
    return mask_tokens(ids, example_keys(seed, draw, np.arange(ids.shape[0])), **kwargs)
