import math

import numpy as np

from dpbert.model.masking import IGNORE_LABEL, mask_tokens

SPECIAL = [1, 2, 3, 4]
MASK = 4
V = 60


def _batch(n=400, length=40, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, V, (n, length)).astype(np.int32)
    ids[:, 0] = 2
    lengths = rng.integers(3, length, n)
    for i, l in enumerate(lengths):
        ids[i, l] = 3
        ids[i, l + 1:] = 0
    return ids


def _mask(ids, seed=(1, 2), max_predictions=8):
    out = mask_tokens(ids, seed, special_token_ids=SPECIAL, mask_token_id=MASK, vocab_size=V,
                      max_predictions=max_predictions)
    return {k: v.numpy() for k, v in out.items()}


def test_never_masks_specials_or_padding_and_labels():
    ids = _batch()
    out = _mask(ids)
    special = np.isin(ids, SPECIAL + [0])
    labelled = out["labels"] != IGNORE_LABEL
    assert not np.any(labelled & special)
    np.testing.assert_array_equal(out["input_ids"][special], ids[special])  # specials untouched
    np.testing.assert_array_equal(out["labels"][labelled], ids[labelled])  # label = original token
    assert np.all(out["input_ids"][~labelled] == ids[~labelled])  # only chosen positions change
    # Slot form agrees with the dense form.
    for i in range(len(ids)):
        slots = out["masked_weights"][i] > 0
        assert sorted(out["masked_positions"][i][slots]) == sorted(np.flatnonzero(labelled[i]))
    # k = min(M, max(1, round(0.15 · n_candidates))) per sequence.
    n_cand = (~special).sum(1)
    expected = np.minimum(8, np.maximum(np.minimum(n_cand, 1), np.floor(0.15 * n_cand + 0.5)))
    np.testing.assert_array_equal(labelled.sum(1), expected)


def test_80_10_10_split_within_binomial_tolerance():
    ids = _batch(n=2000)
    out = _mask(ids, seed=(5, 6))
    labelled = out["labels"] != IGNORE_LABEL
    n = labelled.sum()
    new = out["input_ids"][labelled]
    orig = ids[labelled]
    frac_mask = np.mean(new == MASK)
    frac_same = np.mean(new == orig)
    frac_random = 1 - frac_mask - frac_same
    for observed, p in [(frac_mask, 0.8), (frac_same, 0.1 + 0.1 / (V - 5)), (frac_random, 0.1 - 0.1 / (V - 5))]:
        assert abs(observed - p) <= 4 * math.sqrt(p * (1 - p) / n), (observed, p)
    assert not np.any(np.isin(new[(new != MASK) & (new != orig)], SPECIAL + [0]))  # random ≠ special


def test_deterministic_per_seed_and_different_across_seeds():
    ids = _batch(n=50)
    a, b, c = _mask(ids, (1, 1)), _mask(ids, (1, 1)), _mask(ids, (1, 2))
    np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
    assert not np.array_equal(a["labels"], c["labels"])


def test_sequence_without_candidates():
    ids = np.array([[2, 3, 0, 0, 0, 0]], np.int32)
    out = _mask(ids, max_predictions=2)
    assert out["masked_weights"].sum() == 0 and np.all(out["labels"] == IGNORE_LABEL)
