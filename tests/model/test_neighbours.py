"""Neighbouring datasets through the real step: masking → packing → ghost clipping → clipped sum.

The accountant assumes that adding or removing one example u moves the clipped sum S by at most
C. That holds only if no other example's input changes when u is added — in particular its MLM
mask, which used to be keyed by the batch slot. Here S(D ∪ {u}) − S(D) is measured for u at the
front, in the middle and at the end of the sorted batch (several packed rounds), and a positive
control keys the masks by the row index (the old bug) to show the check can fail.
"""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from dpbert.mechanism import gaussian
from dpbert.mechanism import step as step_lib
from dpbert.network import bert as bert_lib
from dpbert.engine.build import GHOST
from dpbert.engine.train import make_mlm_functions, mlm_rounds

CLIP = 0.01  # every per-example gradient is clipped: each contributes a vector of norm exactly C
SPECIALS = [0, 1, 2, 3, 4]
#: One worker runs the module under ``make test``'s xdist (``--dist loadgroup``): the step is traced once.
pytestmark = pytest.mark.xdist_group("neighbours")


@pytest.fixture(scope="module")
def stepper_and_fns():
    spec = bert_lib.BertSpec(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                             max_seq_length=16, max_predictions=3, dropout=0.0, attention_dropout=0.0)
    models = bert_lib.build_bert(spec, seed=0)
    mask_fn, prepare_fn, loss_fn, metrics_fn = make_mlm_functions(spec, SPECIALS, 4, 0.15)
    config = gaussian.DPSGDConfig(clip_norm=CLIP, noise_multiplier=1.0, expected_batch_size=8.0, noise_seed=0)
    stepper = step_lib.DPSGDTrainStep(models.mlm, tf_keras.optimizers.SGD(0.0), config, prepare_fn=prepare_fn,
                                      loss_fn=loss_fn, metrics_fn=metrics_fn, clipping=GHOST)
    return stepper, mask_fn


def _clipped_sum(stepper, rounds) -> np.ndarray:
    """S = Σ clipped per-example gradients, read from the step's accumulators (before noise)."""
    for r, round_batch in enumerate(rounds):
        stepper._accumulate_fn(stepper.distribute(round_batch), tf.constant(r, tf.int64))  # pylint: disable=protected-access
    total = np.concatenate([acc.read_value().numpy().ravel() for acc in stepper.accumulators])
    for acc in stepper.accumulators:
        acc.assign(tf.zeros_like(acc))
    return total


def _rows(n, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 40, (n, 16)).astype(np.int32)
    ids[:, 0] = 2
    ids[:, 12:] = 0
    return ids


def _neighbour_distances(stepper, mask_fn, ids_of, micro_batch=4):
    data = _rows(13, seed=1)
    record_ids = np.arange(500, 513)
    u = _rows(1, seed=2)[0]
    base = _clipped_sum(stepper, mlm_rounds(mask_fn, data, ids_of(record_ids), np.arange(13), 1234, 5,
                                            micro_batch, 1))
    distances = []
    for position in (0, 6, 13):
        data2 = np.insert(data, position, u, axis=0)
        ids2 = np.insert(record_ids, position, 77)
        rounds = mlm_rounds(mask_fn, data2, ids_of(ids2), np.arange(14), 1234, 5, micro_batch, 1)
        distances.append(float(np.linalg.norm(_clipped_sum(stepper, rounds) - base)))
    return distances


def test_adding_an_example_anywhere_moves_the_clipped_sum_by_at_most_c(stepper_and_fns):
    stepper, mask_fn = stepper_and_fns
    distances = _neighbour_distances(stepper, mask_fn, ids_of=lambda record_ids: record_ids)
    assert max(distances) <= CLIP * (1 + 1e-5), distances
    assert min(distances) >= CLIP * (1 - 1e-3), distances  # u's own clipped gradient: norm exactly C


def test_positive_control_slot_keyed_masks_move_the_sum_by_several_c(stepper_and_fns):
    """Masks keyed by the row's position (the old bug): inserting u re-masks every later row."""
    stepper, mask_fn = stepper_and_fns
    distances = _neighbour_distances(stepper, mask_fn, ids_of=lambda record_ids: np.arange(len(record_ids)))
    assert distances[0] > 2 * CLIP and distances[1] > 2 * CLIP, distances
