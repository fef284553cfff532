"""Privacy-adaptive pre-training: the three objectives' (inputs, labels), and a frozen-embedding loop."""
import math

import numpy as np
import pytest

from dpbert.local_privacy.pretrain import OBJECTIVES, Encoder, Objective, build_objective_batch

PAD, CLS, SEP, MASK = 0, 2, 3, 4
KEEP = [PAD, CLS, SEP]


def _corpus(n=16, length=12, seed=0, vocab=33):
    rng = np.random.default_rng(seed)
    ids = np.full((n, length), PAD, np.int32)
    for i in range(n):
        k = rng.integers(4, length - 1)
        ids[i, 0], ids[i, 1:k + 1], ids[i, k + 1] = CLS, rng.integers(6, vocab, k), SEP
    return ids


def _check_common(batch, ids):
    B, M, K = batch.labels.shape
    used = batch.weights.sum(-1) > 0
    assert np.allclose(batch.weights.sum(-1)[used], 1.0) and np.all(batch.weights[~used] == 0)
    rows = np.arange(B)[:, None]
    masked_original = ids[rows, batch.masked_positions]
    assert not np.isin(masked_original[used], KEEP).any()  # framing tokens are never selected
    # Framing tokens are copied to the input unchanged.
    framing = np.isin(ids, KEEP)
    assert np.array_equal(batch.input_ids[framing], ids[framing])
    return used, rows


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_infinite_eta_all_objectives_are_plain_mlm(separated_embeddings, objective):
    ids = _corpus()
    mechanism = separated_embeddings.mechanism()
    batch = build_objective_batch(Objective(objective, MASK, KEEP, num_samples=4), ids, mechanism, math.inf, 0,
                                  max_predictions=3)
    used, rows = _check_common(batch, ids)
    assert np.all(batch.input_ids[rows, batch.masked_positions][used] == MASK)
    unmasked = np.ones_like(ids, bool)
    unmasked[rows, batch.masked_positions] = False
    assert np.array_equal(batch.input_ids[unmasked], ids[unmasked])
    # Every label is the original token.
    assert np.all(batch.labels[used] == ids[rows, batch.masked_positions][used][:, None])
    assert batch.labels.shape[-1] == (4 if objective == "prob" else 1)


def test_small_eta_labels_differ_by_objective(separated_embeddings):
    ids = _corpus(n=64)
    mechanism = separated_embeddings.mechanism()
    eta = 1.0  # most tokens change (one-hot table, d = 34)
    kwargs = dict(max_predictions=3)
    vanilla = build_objective_batch(Objective("vanilla", MASK, KEEP), ids, mechanism, eta, 1, **kwargs)
    denoising = build_objective_batch(Objective("denoising", MASK, KEEP), ids, mechanism, eta, 1, **kwargs)
    prob = build_objective_batch(Objective("prob", MASK, KEEP, num_samples=8), ids, mechanism, eta, 1, **kwargs)
    for batch in (vanilla, denoising, prob):
        _check_common(batch, ids)
    used, rows = _check_common(vanilla, ids)
    original_at_mask = ids[rows, vanilla.masked_positions]
    # The same rng draw order gives the same privatized sequence and positions for vanilla and denoising.
    assert np.array_equal(vanilla.masked_positions, denoising.masked_positions)
    assert np.all(denoising.labels[..., 0][used] == original_at_mask[used])
    assert np.mean(vanilla.labels[..., 0][used] != original_at_mask[used]) > 0.5
    unmasked = np.ones_like(ids, bool)
    unmasked[rows, vanilla.masked_positions] = False
    content = unmasked & ~np.isin(ids, KEEP)
    assert np.mean(vanilla.input_ids[content] != ids[content]) > 0.5  # inputs are privatized
    # prob: K draws per masked slot, never a special token, frequency weights 1/K each.
    used_p, _ = _check_common(prob, ids)
    assert np.allclose(prob.weights[used_p], 1 / 8)
    assert not np.isin(prob.labels[used_p], [0, 1, 2, 3, 4, 5]).any()
    distinct = [len(set(row)) for row in prob.labels[used_p]]
    assert np.mean(distinct) > 2
    # Denoising without masking leaves the privatized token visible.
    visible = build_objective_batch(Objective("denoising", MASK, KEEP, mask_inputs=False), ids, mechanism, eta, 1,
                                    **kwargs)
    assert not np.any(visible.input_ids == MASK)


def test_bad_objective(separated_embeddings):
    with pytest.raises(ValueError):
        build_objective_batch(Objective("nope", MASK, KEEP), _corpus(), separated_embeddings.mechanism(), 1.0, 0)


def test_pretrain_keeps_the_embedding_frozen_and_learns(toy_embeddings):
    from dpbert.local_privacy.pretrain import mlm_accuracy, pretrain

    mechanism = toy_embeddings.mechanism()
    ids = np.tile(_corpus(n=8, seed=3), (4, 1))
    result = pretrain(ids, mechanism, Objective("prob", MASK, KEEP, num_samples=3), 50.0,
                      encoder=Encoder(dropout=0.0), steps=40, batch_size=16, learning_rate=3e-3, seed=0)
    table = result.models.mlm.get_layer("word_embeddings").get_weights()[0]
    assert np.array_equal(table, mechanism.table)
    assert "word_embeddings" not in {v.name.split("/")[0] for v in result.models.mlm.trainable_variables}
    assert np.mean(result.losses[-5:]) < np.mean(result.losses[:5]) - 0.5
    assert result.to_dict()["steps"] == 40
    accuracy = mlm_accuracy(result.models, ids, mechanism, "denoising", 50.0, mask_id=MASK, keep_ids=KEEP)
    assert 0 <= accuracy["accuracy"] <= 1 and accuracy["predictions"] > 0
