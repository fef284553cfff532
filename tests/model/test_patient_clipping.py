"""User-level (patient) clipping: per-GROUP ghost norms and clipped sums vs brute force.

A group is one patient's ≤ k tuples: k consecutive rows of the micro-batch (separate model
inputs), padded slots masked out. The clipped unit is the group's SUMMED gradient; brute force
computes it directly with ``tf.GradientTape`` on the group's own rows.
"""
import numpy as np
import pytest
import tensorflow as tf

from dpbert.mechanism import clipping, gaussian
from dpbert.network import bert as bert_lib
from dpbert.mechanism import ghost
from dpbert.engine.masking import mask_with_seed


def _batch(spec, rows, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, spec.vocab_size, (rows, spec.max_seq_length)).astype(np.int32)
    ids[:, 0] = 2
    ids[:, 9:] = 0
    ids[0, 2] = ids[0, 3] = ids[1, 4] = ids[1, 5]  # the same token within and across a group's sequences
    batch = mask_with_seed(ids, 3, 4, special_token_ids=[1, 2, 3, 4], mask_token_id=4,
                           vocab_size=spec.vocab_size, max_predictions=spec.max_predictions)
    inputs = {"input_ids": batch["input_ids"], "masked_positions": batch["masked_positions"]}
    loss_fn = lambda out: clipping.per_example_mlm_loss(batch["masked_labels"], out, batch["masked_weights"])  # noqa
    return batch, inputs, loss_fn


def _brute_force_groups(model, batch, inputs, mask, k):
    """(group norms ‖Σ_j G_j‖, each group's summed gradient: numpy, one array per variable)."""
    per_group, norms = [], []
    for g in range(len(mask) // k):
        rows = slice(g * k, (g + 1) * k)
        m = tf.constant(mask[rows], tf.float32)
        with tf.GradientTape() as tape:
            out = model({name: v[rows] for name, v in inputs.items()}, training=True)
            loss = tf.reduce_sum(m * clipping.per_example_mlm_loss(batch["masked_labels"][rows], out,
                                                                batch["masked_weights"][rows]))
        grads = [tf.convert_to_tensor(x).numpy() for x in tape.gradient(loss, model.trainable_variables)]
        per_group.append(grads)
        norms.append(float(np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in grads))))
    return np.array(norms), per_group


def _clipped_groups(per_group, norms, clip):
    """(Σ_g clipped group sums, per-group clipped contribution norms)."""
    weights = np.array([min(1.0, clip / norm) if norm > 0 else 0.0 for norm in norms])
    total = [sum(w * grads[i] for w, grads in zip(weights, per_group)) for i in range(len(per_group[0]))]
    return total, weights * norms


@pytest.fixture(scope="module")
def models():
    """``get(geometry)``: the 2-layer model of that geometry, built once for both group sizes."""
    made = {}

    def get(geometry):
        if geometry not in made:
            length, hidden, inter = geometry
            spec = bert_lib.BertSpec(vocab_size=50, hidden_size=hidden, num_layers=2, num_heads=2,
                                     intermediate_size=inter, max_seq_length=length, max_predictions=4,
                                     dropout=0.0, attention_dropout=0.0)
            made[geometry] = spec, bert_lib.build_bert(spec, seed=1).mlm
        return made[geometry]

    return get


# k = 1 (a group of one row: per-example clipping, tests/model/test_dpsgd.py's brute force on the same
# geometries): the slow tier
@pytest.mark.parametrize("k", [pytest.param(1, marks=pytest.mark.slow), 4])
@pytest.mark.parametrize("geometry", [(12, 16, 32), (40, 8, 16)])  # ghost and instantiation branches
def test_group_clipping_matches_brute_force(models, k, geometry):
    spec, model = models(geometry)
    groups = 4
    batch, inputs, loss_fn = _batch(spec, groups * k)
    if k == 1:
        mask = np.array([1, 1, 1, 0], np.float32)
    else:  # full patient, patients with 1 and 3 of k tuples (slots padded), an all-padding group
        mask = np.array([1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0], np.float32)
    ref_norms, per_group = _brute_force_groups(model, batch, inputs, mask, k)
    present = ref_norms > 0
    clip = float(np.median(ref_norms[present]))  # some groups clipped, some not
    grads, losses, norms, _ = ghost.clipped_gradient_sum(model, inputs, loss_fn, mask, clip, group_size=k)
    expected, contributions = _clipped_groups(per_group, ref_norms, clip)
    assert norms.shape == (groups,)
    np.testing.assert_allclose(norms.numpy(), ref_norms, rtol=1e-4, atol=1e-7)
    assert norms.numpy()[-1] == 0  # the all-padding group
    np.testing.assert_array_equal(losses.numpy()[mask == 0], 0.0)
    assert np.all(contributions <= clip * (1 + 1e-5))  # each patient's clipped contribution ≤ C
    scale = max(float(np.max(np.abs(e))) for e in expected)
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), want, atol=2e-6 * scale)
    if k > 1:  # the group norm is NOT the per-example norms combined any simpler way
        per_example = ghost.clipped_gradient_sum(model, inputs, loss_fn, mask, 1e9)[2].numpy()
        assert not np.allclose(np.sqrt(np.add.reduceat(per_example ** 2, np.arange(0, len(mask), k))),
                               ref_norms, rtol=1e-3)


def test_group_of_one_full_patient_clipped_to_c_under_dropout():
    """One forward pass with dropout: the clipped group contribution has norm ≤ C exactly."""
    spec = bert_lib.BertSpec(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                             max_seq_length=12, max_predictions=4, dropout=0.3, attention_dropout=0.3)
    model = bert_lib.build_bert(spec, seed=2).mlm
    batch, inputs, loss_fn = _batch(spec, 4)
    mask = np.ones(4, np.float32)
    grads, _, norms, _ = ghost.clipped_gradient_sum(model, inputs, loss_fn, mask, 1e9, group_size=4)
    np.testing.assert_allclose(float(tf.linalg.global_norm([tf.convert_to_tensor(g) for g in grads])),
                               float(norms[0]), rtol=1e-5)
    clip = float(norms[0]) / 3
    grads, _, _, _ = ghost.clipped_gradient_sum(model, inputs, loss_fn, mask, clip, group_size=4)
    assert float(tf.linalg.global_norm([tf.convert_to_tensor(g) for g in grads])) <= clip * (1 + 1e-5)


def test_group_size_must_divide_the_batch_and_needs_ghost():
    spec = bert_lib.BertSpec(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                             max_seq_length=12, max_predictions=4, dropout=0.0, attention_dropout=0.0)
    model = bert_lib.build_bert(spec, seed=0).mlm
    batch, inputs, loss_fn = _batch(spec, 6)
    with pytest.raises(ValueError, match="groups of 4"):
        ghost.clipped_gradient_sum(model, inputs, loss_fn, np.ones(6, np.float32), 1.0, group_size=4)
    with pytest.raises(ValueError, match="ghost"):
        gaussian.DPSGDConfig(group_size=4, clipping="tfp_two_pass")
