"""Run in its own process by test_dpsgd: 2 logical CPUs → MirroredStrategy with P = 2.

Prints one JSON line: a short P = 2, T = 2 training run. (The two-replica noise check runs once,
through the CLI: tests/model/test_noise_check_cli.py.)
"""
import json
import sys

import dpbert  # noqa: F401  (TF_USE_LEGACY_KERAS, tensorflow_privacy import guard)
from dpbert.engine.train import configure_logical_cpus

configure_logical_cpus(2)  # before TensorFlow initialises its devices

from dpbert.config import ModelConfig, TrainingConfig  # noqa: E402
from dpbert.engine.train import train_mlm  # noqa: E402

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from conftest import SPECIALS, repetitive_corpus  # noqa: E402

result = train_mlm(repetitive_corpus(), SPECIALS, 40, ModelConfig(preset="tiny", num_layers=1, max_seq_length=16),
                   TrainingConfig(batch_size=8, steps=6, replicas=2, accumulation_steps=2, strategy="mirrored",
                                  noise_multiplier=0.5, clip_norm=1.0, checkpoint_every=3, warmup_steps=1),
                   sys.argv[1], progress=False, export_saved_model=False)
print(json.dumps({"train": result.to_dict()}))
