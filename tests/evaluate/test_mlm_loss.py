import math

import numpy as np

from dpbert.evaluate.mlm_loss import heldout_mlm_loss, masked_batch


def test_masking_is_deterministic_and_skips_special_tokens():
    ids = np.array([[2, 10, 11, 12, 13, 3, 0, 0]] * 50, np.int32)
    a = masked_batch(ids, [0, 1, 2, 3, 4], 4, 3, 0.5, seed=7)
    b = masked_batch(ids, [0, 1, 2, 3, 4], 4, 3, 0.5, seed=7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    masked, positions, labels, weights = a
    for row, pos, lab, w in zip(masked, positions, labels, weights):
        real = pos[w > 0]
        assert len(real) >= 1 and set(real) <= {1, 2, 3, 4}
        assert all(row[p] == 4 for p in real) and all(ids[0][p] == l for p, l in zip(real, lab[w > 0]))
    # round(0.5 · 4) = 2 of the 4 maskable tokens per row (cap 3)
    assert np.all(weights.sum(axis=1) == 2)


class _UniformMLM:
    """An MLM giving equal logits to every token: the loss is ln V exactly."""

    def __init__(self, vocab):
        self.vocab = vocab

    def __call__(self, inputs, training=False):
        n, m = inputs["masked_positions"].shape
        return np.zeros((n, m, self.vocab), np.float32)


def test_uniform_model_loss_is_log_vocab():
    ids = np.array([[2, 10, 11, 12, 3, 0]] * 20, np.int32)
    loss = heldout_mlm_loss(_UniformMLM(50), ids, [0, 1, 2, 3, 4], 4, max_predictions=2, seed=1)
    assert math.isclose(loss, math.log(50), rel_tol=1e-6)
