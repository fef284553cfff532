"""One worker process of tests/model/test_multi_worker.py (started by ``noise_check.launch_workers``,
``TF_CONFIG`` set): ``MultiWorkerMirroredStrategy`` first, then the two tiny training runs of
``runs()`` (per tuple and per patient) into ``argv[1]/<name>``. Prints one JSON line."""
import json
import sys
from pathlib import Path

import dpbert  # noqa: F401  (TF_USE_LEGACY_KERAS, tensorflow_privacy import guard)
from dpbert.model.train import make_strategy

strategy = make_strategy("multi_worker", 2)  # before TensorFlow runs any op

from dpbert.model.train import train_mlm  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_multi_worker import runs  # noqa: E402

out = {}
for name, kwargs in runs(replicas=2).items():
    out[name] = train_mlm(output_dir=str(Path(sys.argv[1]) / name), strategy=strategy, **kwargs).to_dict()
print(json.dumps(out))
