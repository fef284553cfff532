"""Run in its own process by test_xla: 2 logical CPUs → MirroredStrategy with P = 2, the
compiled step against the uncompiled one (all-reduces and the optimizer outside XLA).

Prints one JSON line: after two steps, the largest difference of each parameter, of the noise
probe's update and of its clean sum, relative to the largest magnitude of the uncompiled one.
"""
import json
import sys

import dpbert  # noqa: F401  (TF_USE_LEGACY_KERAS, tensorflow_privacy import guard)
from dpbert.engine.train import configure_logical_cpus

configure_logical_cpus(2)  # before TensorFlow initialises its devices

import numpy as np  # noqa: E402
import tf_keras  # noqa: E402

from dpbert.mechanism import gaussian  # noqa: E402
from dpbert.mechanism import step as step_lib  # noqa: E402
from dpbert.network import bert as bert_lib  # noqa: E402
from dpbert.engine import masking  # noqa: E402
from dpbert.mechanism import integrity  # noqa: E402
from dpbert.engine.build import GHOST  # noqa: E402
from dpbert.engine.devices import mirrored_strategy  # noqa: E402
from dpbert.engine.mlm import make_mlm_functions  # noqa: E402

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from conftest import SPECIALS, repetitive_corpus  # noqa: E402

strategy = mirrored_strategy(2)
spec = bert_lib.BertSpec(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                         max_seq_length=12, max_predictions=3, dropout=0.0, attention_dropout=0.0)
mask_fn, prepare_fn, loss_fn, metrics_fn = make_mlm_functions(spec, SPECIALS.values(), 4, 0.15)


def run(jit: bool):
    with strategy.scope():
        model = bert_lib.build_bert(spec, seed=1).mlm
        optimizer = tf_keras.optimizers.AdamW(1e-2)
    config = gaussian.DPSGDConfig(clip_norm=0.5, noise_multiplier=1.0, expected_batch_size=8.0, noise_seed=5,
                                  replicas=2, accumulation_steps=2, jit_compile=jit)
    stepper = step_lib.DPSGDTrainStep(model, optimizer, config, prepare_fn=prepare_fn, loss_fn=loss_fn,
                                      metrics_fn=metrics_fn, strategy=strategy,
                                      noise_probe=integrity.make_noise_probe(model.trainable_variables, 4, seed=1),
                                      clipping=GHOST)
    for step in range(2):
        ids = repetitive_corpus(n=8, length=12, vocab=40, seed=step)
        features = mask_fn(ids, masking.example_keys(11, step, np.arange(8)))
        stepper.run_step([{"features": {k: v[4 * r:4 * r + 4].reshape(2, 2, *v.shape[1:]) for k, v in features.items()},
                           "example_mask": np.ones((2, 2), np.float32)} for r in range(2)])
    return ([v.numpy() for v in model.trainable_variables], stepper.noise_probe_clean.numpy(),
            stepper.noise_probe_update.numpy())


def rel(a, b):
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(a))), 1e-12))


(w0, c0, u0), (w1, c1, u1) = run(False), run(True)
print(json.dumps({"weights": max(rel(a, b) for a, b in zip(w0, w1)), "update": rel(u0, u1),
                  "clean": rel(c0, c1)}))
