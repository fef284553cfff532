"""Run in its own process by test_patient_dpsgd: 2 logical CPUs → MirroredStrategy with P = 2.

Prints one JSON line: the patient-mode (k = 4) noise checks for T = 1 and T = 4 and a short
user-level P = 2, T = 2 training run.
"""
import json
import sys

import dpbert  # noqa: F401  (TF_USE_LEGACY_KERAS, tensorflow_privacy import guard)
from dpbert.engine.train import configure_logical_cpus

configure_logical_cpus(2)  # before TensorFlow initialises its devices

from dpbert.config import ModelConfig, TrainingConfig  # noqa: E402
from dpbert.diagnostics.noise_check import noise_check  # noqa: E402
from dpbert.engine.train import train_mlm  # noqa: E402
from dpbert.privacy.plan import plan_training  # noqa: E402

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from conftest import SPECIALS, repetitive_corpus  # noqa: E402

noise = [noise_check(2, t, noise_multiplier=1.3, clip=0.01, batch_size=8, steps=25, group_size=4) for t in (1, 4)]
ids = repetitive_corpus(n=60)
keys = [f"P{i % 20}" for i in range(60)]  # 20 patients of 3 tuples
tc = TrainingConfig(batch_size=8, steps=4, replicas=2, accumulation_steps=2, strategy="mirrored",
                    noise_multiplier=0.5, clip_norm=1.0, checkpoint_every=2, warmup_steps=1)
plan = plan_training(tc, 20, unit="patient", max_contributions=2)
result = train_mlm(ids, SPECIALS, 40, ModelConfig(preset="tiny", num_layers=1, max_seq_length=16), tc, sys.argv[1], plan=plan,
                   progress=False, export_saved_model=False, patient_keys=keys)
print(json.dumps({"noise": noise, "train": result.to_dict()}))
