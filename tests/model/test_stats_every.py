"""``training.stats_every``: the loop reads the steps' statistics from the device every N steps in
one transfer (``dpbert.engine.loop``). The same run at N = 1 and N = 4 releases the same
values, checkpoints the same weights at the same step and charges the same steps; the transfers
are the N-step ones; a broken mechanism still stops the run (the checks' looks come late, not
never); a bad N is refused naming the parameter."""
import numpy as np
import pytest

from dpbert.config import ConfigError, ModelConfig, TrainingConfig
from dpbert.mechanism import step as step_lib
from dpbert.privacy.event_check import IntegrityCheckFailed

from . import broken_mechanisms as broken
from .conftest import SPECIALS, repetitive_corpus

VOCAB = 40


def _train(out, stats_every, steps=7, **overrides):
    from dpbert.engine.train import train_mlm

    params = dict(batch_size=16, steps=steps, learning_rate=3e-3, warmup_steps=2, clip_norm=1.0,
                  noise_multiplier=0.3, checkpoint_every=3, noise_seed=1, integrity_check_every=0, seed=2,
                  stats_every=stats_every)
    params.update(overrides)
    model = ModelConfig(preset="tiny", num_layers=1, max_seq_length=16, dropout=0.0)
    return train_mlm(repetitive_corpus(), SPECIALS, VOCAB, model, TrainingConfig(**params), str(out),
                     progress=False, export_saved_model=False)


def _count_reads(monkeypatch):
    reads = []
    real = step_lib.read_stats

    def counting(steps, extra=()):
        reads.append(len(steps))
        return real(steps, extra)

    monkeypatch.setattr(step_lib, "read_stats", counting)
    return reads


def _checkpoint_weights(out, step):
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(out / "checkpoints" / f"ckpt-{step}"))
    names = sorted(n for n in reader.get_variable_to_shape_map() if "model" in n and "OPTIMIZER" not in n)
    return {n: reader.get_tensor(n) for n in names}


def test_every_four_steps_releases_what_every_step_releases(tmp_path, monkeypatch):
    reads = _count_reads(monkeypatch)
    one = _train(tmp_path / "one", 1)
    every_step = list(reads)
    reads.clear()
    four = _train(tmp_path / "four", 4)
    # N = 1: a read per step. N = 4: the reads cover steps 1-3 (checkpoint at 3), 4, 5-6
    # (checkpoint at 6), 7 (the last) — a checkpoint step is read at once, so it saves that step.
    assert every_step == [1] * 7 and reads == [3, 1, 2, 1]
    assert four.steps_taken_total == one.steps_taken_total == 7
    assert four.observed["steps_executed"] == one.observed["steps_executed"] == 7
    np.testing.assert_array_equal(four.losses, one.losses)
    assert four.exact_diagnostic_sums == one.exact_diagnostic_sums
    for key, values in one.released_diagnostics.items():
        np.testing.assert_array_equal(four.released_diagnostics[key], values, err_msg=key)
    for step in (3, 6, 7):
        a, b = _checkpoint_weights(tmp_path / "one", step), _checkpoint_weights(tmp_path / "four", step)
        assert a.keys() == b.keys() and a
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"{name} at step {step}")
    assert four.integrity_checks["noise"]["passed"] and four.integrity_checks["noise"]["ran"]


def test_a_broken_mechanism_still_stops_the_run_when_read_every_five_steps(tmp_path):
    """Positive control: no noise on the LayerNorm γs (a handful of coordinates) — the noise
    check's look at the end of the run, after reads every 5 steps, catches it."""
    with broken.no_noise_on(lambda name: "layer_norm" in name and "gamma" in name), \
            pytest.raises(IntegrityCheckFailed, match="noise"):
        _train(tmp_path / "broken", 5, steps=8)


@pytest.mark.parametrize("bad", [0, -2, True, 1.5])
def test_a_bad_stats_every_is_refused_naming_the_parameter(bad):
    with pytest.raises(ConfigError, match="training.stats_every"):
        TrainingConfig(stats_every=bad).validate("training")
