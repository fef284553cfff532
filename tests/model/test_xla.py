"""The XLA-compiled DP step (``training.jit_compile``): the static-shape embedding norm against
brute force, the compiled step equal to the uncompiled one (the noise is drawn outside the
compiled functions, from the same key), and the run-time integrity checks under XLA with a
positive control (no noise: the noise check fails)."""
import json
import subprocess
import sys
import types
import uuid
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import registry_function_utils

from dpbert.mechanism import gaussian
from dpbert.mechanism import step as step_lib
from dpbert.network import bert as bert_lib
from dpbert.mechanism import ghost, integrity
from dpbert.engine import masking
from dpbert.engine.build import GHOST
from dpbert.engine.mlm import make_mlm_functions
from tests.model import broken_mechanisms as broken
from tests.model.conftest import SPECIALS, eagerly, repetitive_corpus


#: One worker runs the module under ``make test``'s xdist (``--dist loadgroup``): the reference runs once.
pytestmark = pytest.mark.xdist_group("xla")


def _brute_embedding_sqr_norms(values, ids, rows):
    """Each row's table gradient built token by token (np.add.at), then its squared norm."""
    out = []
    for i in range(ids.shape[0]):
        table = np.zeros((rows, values.shape[1]))
        np.add.at(table, ids[i], values[i * ids.shape[1]:(i + 1) * ids.shape[1]])
        out.append(float(np.sum(table ** 2)))
    return np.array(out)


@pytest.mark.parametrize("k", [1, 2])
def test_static_embedding_norm_matches_brute_force_and_the_unique_form(k):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 5, (4, 6)).astype(np.int32)  # a small vocabulary: many repeated tokens
    values = rng.normal(size=(ids.size, 3)).astype(np.float32)
    grouped = ids.reshape(-1, k * ids.shape[1])
    got = ghost.embedding_sqr_norm_static(tf.constant(values), tf.constant(grouped)).numpy()
    np.testing.assert_allclose(got, _brute_embedding_sqr_norms(values, grouped, 5), rtol=1e-5)
    unique = registry_function_utils.embedding_sqr_norm_fn(tf.constant(values), tf.constant(grouped)).numpy()
    np.testing.assert_allclose(got, unique, rtol=1e-5)


def _stepper(jit: bool, sigma: float = 1.0, dropout: float = 0.0, noise_seed: int = 5, noise_ahead=None):
    spec = bert_lib.BertSpec(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                             max_seq_length=12, max_predictions=3, dropout=dropout, attention_dropout=dropout)
    model = bert_lib.build_bert(spec, seed=1).mlm
    mask_fn, prepare_fn, loss_fn, metrics_fn = make_mlm_functions(spec, SPECIALS.values(), 4, 0.15)
    config = gaussian.DPSGDConfig(clip_norm=0.5, noise_multiplier=sigma, expected_batch_size=6.0, noise_seed=noise_seed,
                                  accumulation_steps=2, loss_bound=12.0, jit_compile=jit, noise_ahead=noise_ahead)
    probe = integrity.make_noise_probe(model.trainable_variables, per_variable=4, seed=1)
    stepper = step_lib.DPSGDTrainStep(model, tf_keras.optimizers.AdamW(1e-2), config, prepare_fn=prepare_fn,
                                      loss_fn=loss_fn, metrics_fn=metrics_fn, noise_probe=probe, clipping=GHOST)
    return stepper, mask_fn


def _rounds(mask_fn, step):
    ids = repetitive_corpus(n=6, length=12, vocab=40, seed=step)
    ids[:, 2] = ids[:, 3]  # a repeated token in every row (embedding rows summed)
    features = mask_fn(ids, masking.example_keys(11, step, np.arange(6)))
    mask = np.array([1, 1, 1, 1, 1, 0], np.float32)  # one padded slot
    return [{"features": {k: v[None, 3 * r:3 * r + 3] for k, v in features.items()},
             "example_mask": mask[None, 3 * r:3 * r + 3]} for r in range(2)]


def _snapshot(stepper):
    return types.SimpleNamespace(weights=[v.numpy() for v in stepper.model.trainable_variables],
                                 norms=np.concatenate(stepper.last_unit_norms),
                                 probes={name: getattr(stepper, name).numpy()
                                         for name in ("noise_probe_clean", "noise_probe_update")})


@pytest.fixture(scope="module")
def uncompiled():
    """The reference both tests below compare with, run once and eagerly (not compiled, not
    traced): the step of the default configuration (this small model draws its noise inline), the
    statistics of its first two steps and a snapshot after step 2 and after step 3."""
    with eagerly():
        stepper, mask_fn = _stepper(False)
        stats = [stepper.run_step(_rounds(mask_fn, step)) for step in range(2)]
        after_two = _snapshot(stepper)
        stepper.run_step(_rounds(mask_fn, 2))
        return types.SimpleNamespace(stepper=stepper, stats=stats, after_two=after_two,
                                     after_three=_snapshot(stepper))


def test_xla_step_equals_the_uncompiled_step(uncompiled):
    """Two steps (the second uses the noise drawn ahead): the same parameters, statistics, per-unit
    norms and noise-probe vectors at rtol 1e-5."""
    xla, mask_fn = _stepper(True)
    xla_stats = [xla.run_step(_rounds(mask_fn, step)) for step in range(2)]
    eager = uncompiled.after_two
    assert xla.executor._noise_buffers is not None and int(xla.executor._noise_buffer_step.numpy()) in (1, 2)  # pylint: disable=protected-access
    for a, b in zip(uncompiled.stats, xla_stats):
        assert a.keys() == b.keys()
        np.testing.assert_allclose([b[k] for k in a], [a[k] for k in a], rtol=1e-5)
    for a, b in zip(eager.weights, (v.numpy() for v in xla.model.trainable_variables)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.concatenate(xla.last_unit_norms), eager.norms, rtol=1e-5)
    for name, value in eager.probes.items():
        np.testing.assert_allclose(getattr(xla, name).numpy(), value, rtol=1e-5, atol=1e-7)
    assert int(xla.dp_step.numpy()) == 2


def test_the_uncompiled_step_with_its_noise_drawn_ahead_releases_the_same_updates(uncompiled, eager_steps):
    """Eager, one replica: the next step's z drawn ahead on a thread (``noise_ahead``) is the z the
    inline draw makes — the same parameters and noise-probe vectors after three steps; by default a
    model this small draws inline (below ``NOISE_AHEAD_MIN_COORDINATES``). Both run eagerly: the
    draw's values are compared, not its trace."""
    drawn_ahead, mask_fn = _stepper(False, noise_ahead=True)
    for step in range(3):
        drawn_ahead.run_step(_rounds(mask_fn, step))
    drawn_ahead.executor._ahead.result()  # pylint: disable=protected-access  (the draw for step 4, on its thread)
    assert uncompiled.stepper.config.noise_ahead is None  # the default configuration
    assert uncompiled.stepper.executor._noise_buffers is None  # pylint: disable=protected-access
    assert int(drawn_ahead.executor._noise_buffer_step.numpy()) == 3  # pylint: disable=protected-access
    inline = uncompiled.after_three
    for a, b in zip(inline.weights, drawn_ahead.model.trainable_variables):
        np.testing.assert_allclose(b.numpy(), a, rtol=1e-6, atol=1e-8)
    for name, value in inline.probes.items():
        np.testing.assert_allclose(getattr(drawn_ahead, name).numpy(), value, rtol=1e-6)


@pytest.mark.slow  # make test-slow: XLA beyond the step's equivalence (docs/development.md)
def test_xla_dropout_masks_come_from_the_steps_own_keyed_generators(tmp_path):
    """XLA's own stateful RNG ignores seeds and starts from the same state in every process (masks
    a public function of the slot). The compiled step's Dropout layers draw from generators keyed
    by the step's seed (OS entropy in a run): the same test seed gives the same masks although
    XLA's own RNG state moved on in between; the generators are not in the checkpoint."""
    norms = []
    for _ in range(2):
        stepper, mask_fn = _stepper(True, dropout=0.3, noise_seed=5)
        stepper.run_step(_rounds(mask_fn, 0))
        norms.append(np.concatenate(stepper.last_unit_norms).ravel())
        tf.function(lambda: tf.nn.dropout(tf.ones([64]), 0.5), jit_compile=True)()  # XLA's own stream moves on
    np.testing.assert_array_equal(norms[0], norms[1])
    path = tf.train.Checkpoint(model=stepper.model).write(str(tmp_path / "ckpt"))
    assert not [name for name, _ in tf.train.list_variables(path) if "generator" in name.lower()]


@pytest.mark.slow  # make test-slow: XLA beyond the step's equivalence (docs/development.md)
def test_xla_non_private_baseline_equals_the_uncompiled_one():
    weights = []
    for jit in (False, True):
        spec = bert_lib.BertSpec(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                                 max_seq_length=12, max_predictions=3, dropout=0.0, attention_dropout=0.0)
        model = bert_lib.build_bert(spec, seed=1).mlm
        mask_fn, prepare_fn, loss_fn, _ = make_mlm_functions(spec, SPECIALS.values(), 4, 0.15)
        stepper = step_lib.DPSGDTrainStep(model, tf_keras.optimizers.SGD(0.5),
                                          gaussian.DPSGDConfig(non_private=True, jit_compile=jit),
                                          prepare_fn=prepare_fn, loss_fn=loss_fn, clipping=GHOST)
        stepper.run_step(_rounds(mask_fn, 0))
        weights.append([v.numpy() for v in model.trainable_variables])
    for a, b in zip(*weights):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_two_replicas_xla_step_equals_the_uncompiled_step_in_subprocess():
    """P = 2 (MirroredStrategy over 2 logical CPUs, its own process): the all-reduces, the probes'
    writes and the optimizer outside the compiled functions, one compiled function per replica."""
    worker = Path(__file__).with_name("xla_replicas_worker.py")
    out = subprocess.run([sys.executable, str(worker)], capture_output=True, text=True, timeout=300,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr[-3000:]
    diffs = json.loads(out.stdout.strip().splitlines()[-1])
    assert max(diffs.values()) < 1e-5, diffs


def _train(**overrides):
    from dpbert.config import ModelConfig, TrainingConfig
    from dpbert.engine.train import train_mlm

    tc = TrainingConfig(**dict(dict(batch_size=8, steps=3, warmup_steps=1, clip_norm=1.0, noise_multiplier=0.8,
                                    accumulation_steps=2, noise_seed=3, integrity_check_every=1, jit_compile=True),
                               **overrides))
    model = ModelConfig(preset="tiny", hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                        max_seq_length=12, dropout=0.0)
    return train_mlm(repetitive_corpus(n=32, length=12), SPECIALS, 40, model, tc,
                     f"ram://xla-tests/{uuid.uuid4().hex}", progress=False, export_saved_model=False)


@pytest.mark.slow  # make test-slow: XLA beyond the step's equivalence (docs/development.md)
def test_the_shipped_loop_compiles_and_its_integrity_checks_pass_under_xla():
    checks = _train().integrity_checks
    assert checks["clipping"]["ran"] and checks["clipping"]["passed"], checks["clipping"]
    assert checks["clipping"]["compared_with_step_norm"]  # the compiled step's own norms, read lazily
    assert checks["noise"]["ran"] and checks["noise"]["passed"], checks["noise"]
    assert all(c["passed"] is not False for c in checks.values()), checks


@pytest.mark.slow  # make test-slow: XLA beyond the step's equivalence (docs/development.md)
def test_control_no_noise_under_xla_fails_the_noise_check():
    """The draw zeroed on every piece (in the buffers drawn ahead too): B·update − S is 0."""
    with broken.no_noise_on(lambda name: True):
        stepper, mask_fn = _stepper(True)
        check = integrity.NoiseCheck(1.0, 0.5, 6.0, [(name, c.size) for name, (_, c) in
                                                     zip(broken.piece_names(stepper), stepper.noise_probe.groups())])
        for step in range(2):
            stepper.run_step(_rounds(mask_fn, step))
            check.add(stepper.noise_probe_clean.numpy(), stepper.noise_probe_update.numpy())
    result = check.result()
    assert result["ran"] and not result["passed"], result
