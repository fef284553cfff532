"""One worker process of tests/model/test_multi_worker.py (started by ``noise_check.launch_workers``,
``TF_CONFIG`` set): ``MultiWorkerMirroredStrategy`` first, then, by ``argv``:

* ``<out dir> [<name> ...]``: the tiny training runs of ``runs()`` (per tuple and per patient; the
  named ones only, if any) into ``<out dir>/<name>``;
* ``noise <placement> ...``: ``noise_check`` (the shipped loop, 2 workers) under each named broken
  placement of ``broken_mechanisms.PLACEMENTS`` — the positive controls reach the worker processes
  through this test-only script, never through a flag of ``dpbert``.

Prints one JSON line."""
import json
import sys
from pathlib import Path

import dpbert  # noqa: F401  (TF_USE_LEGACY_KERAS, tensorflow_privacy import guard)
from dpbert.engine.train import make_strategy

strategy = make_strategy("multi_worker", 2)  # before TensorFlow runs any op

import tensorflow as tf  # noqa: E402

# As tests/model/conftest.py: no grappler rewrites of functions that run a few times.
tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})

sys.path.insert(0, str(Path(__file__).parent))

if sys.argv[1] == "noise":
    import broken_mechanisms  # noqa: E402

    from dpbert.diagnostics.noise_check import noise_check  # noqa: E402

    out = {}
    for name in sys.argv[2:]:
        with broken_mechanisms.PLACEMENTS[name]():  # the step is built and traced inside the block
            out[name] = noise_check(2, 1, noise_multiplier=1.0, clip=0.01, batch_size=8, steps=30, seed=5,
                                    strategy=strategy)
    print(json.dumps(out))
    sys.exit(0)

from prf_sampling import train_with  # noqa: E402  (the builder takes the test-only PRF sampler)
from test_multi_worker import runs  # noqa: E402

out = {}
for name, kwargs in runs(replicas=2).items():
    if sys.argv[2:] and name not in sys.argv[2:]:
        continue
    out[name] = train_with(output_dir=str(Path(sys.argv[1]) / name), strategy=strategy, **kwargs).to_dict()
print(json.dumps(out))
