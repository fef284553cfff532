import math

import numpy as np

from dpbert.engine.masking import IGNORE_LABEL, example_keys, mask_tokens, mask_with_seed

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
    return mask_with_seed(ids, *seed, special_token_ids=SPECIAL, mask_token_id=MASK, vocab_size=V,
                          max_predictions=max_predictions)


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


def _keyed(ids, example_ids, key=99, step=3):
    return mask_tokens(ids, example_keys(key, step, example_ids), special_token_ids=SPECIAL,
                       mask_token_id=MASK, vocab_size=V, max_predictions=8)


def test_mask_of_an_example_depends_on_its_id_not_its_row():
    """Neighbouring batches: inserting u anywhere (and reordering) leaves every other row's mask."""
    ids = _batch(n=30)
    example_ids = np.arange(1000, 1030)
    base = _keyed(ids, example_ids)
    u = _batch(n=1, seed=9)
    for position in (0, 13, 30):
        ids2 = np.insert(ids, position, u[0], axis=0)
        ids_of2 = np.insert(example_ids, position, 7)
        other = np.arange(31) != position
        out = _keyed(ids2, ids_of2)
        for key in base:
            np.testing.assert_array_equal(out[key][other], base[key], err_msg=f"{key} at {position}")
    perm = np.random.default_rng(0).permutation(30)
    shuffled = _keyed(ids[perm], example_ids[perm])
    np.testing.assert_array_equal(shuffled["input_ids"], base["input_ids"][perm])


def test_positive_control_slot_keyed_masks_move_when_a_row_is_inserted():
    """The check above can fail: keyed by the row index (the old bug), an insertion moves masks."""
    ids = _batch(n=30)
    base = _keyed(ids, np.arange(30))
    ids2 = np.insert(ids, 0, _batch(n=1, seed=9)[0], axis=0)
    out = _keyed(ids2, np.arange(31))  # row index as id: every later row gets another key
    assert not np.array_equal(out["labels"][1:], base["labels"])


def test_key_and_step_change_the_masks():
    ids = _batch(n=50)
    a = _keyed(ids, np.arange(50), key=1, step=0)
    assert not np.array_equal(a["labels"], _keyed(ids, np.arange(50), key=2, step=0)["labels"])
    assert not np.array_equal(a["labels"], _keyed(ids, np.arange(50), key=1, step=1)["labels"])
