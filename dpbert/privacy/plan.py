"""One training plan: n, q, steps, expected batch, sampling, replicas, accumulation.

Built ONCE from the training configuration and a PUBLIC n (``training.dataset_size``, or the n the
budget guard was given) before any private data is read. The budget guard, ``dpbert budget``,
the planned ledger, the trainer stage and ``train_mlm`` all read the same ``TrainingPlan``; the
trainer's DP event is built from the plan plus what actually ran (steps executed, the σ actually
applied). Nothing else computes n, q or the number of steps.

* q = min(1, B / n) — Poisson sampling rate (shuffle: fixes n/B for the participation count);
* steps = ``training.steps``, else ceil(epochs · n / B), where a product that is an integer up to
  float rounding (1.1 · 50 / 5 = 11.000000000000002) counts as that integer — so the guard and
  the trainer agree (rounded apart, they would plan 11 steps and execute 12);
* expected batch = q · n under Poisson sampling, B under shuffling;
* micro-batch m = B / (P · T) examples per replica per accumulation round.

The unit (``privacy.unit``): ``tuple`` — n, B, q count tuples; ``patient`` (user-level DP-SGD) —
n is the PUBLIC number of patients (``training.dataset_patients``, held-out ones included, times
1 − holdout), B = ``training.batch_size`` the expected number of PATIENTS per step, q = B / n the
patient sampling rate, m patients per replica per round, each bringing ≤ k =
``privacy.max_tuples_per_patient`` tuples (``max_contributions``): ``micro_batch_rows`` = m·k.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from dpbert.privacy import _checks

SAMPLING_MODES = ("poisson", "shuffle")
UNITS = ("tuple", "patient")


def steps_for(examples: int, batch_size: int, epochs: float) -> int:
    """ceil(epochs · n / B) (14063 for 60 epochs of 60000 examples, B = 256)."""
    examples = _checks.integer("examples", examples, 1)
    batch_size = _checks.integer("batch_size", batch_size, 1)
    epochs = _checks.positive("epochs", epochs)
    x = epochs * examples / batch_size
    exact = _checks.nearest_integer(x)
    return max(1, exact if exact is not None else math.ceil(x))


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    """What a DP-SGD run will do, fixed before any private data is read."""

    dataset_size: int          # n: the public (planned) number of examples
    batch_size: int            # B: logical batch (expected size under Poisson sampling)
    sampling: str              # poisson | shuffle
    sampling_probability: float  # q = min(1, B / n)
    steps: int                 # optimizer steps the run will take
    replicas: int              # P
    accumulation_steps: int    # T
    unit: str = "tuple"        # tuple | patient (n, B, q count patients)
    max_contributions: int = 1  # k: tuples per patient per step (patient unit), 1 per tuple

    @property
    def expected_batch_size(self) -> float:
        """The normaliser of the noisy sum: q·n (Poisson) or B (shuffle)."""
        if self.sampling == "poisson":
            return self.sampling_probability * self.dataset_size
        return float(self.batch_size)

    @property
    def micro_batch(self) -> int:
        """m = B / (P·T) examples per replica per round."""
        return self.batch_size // (self.replicas * self.accumulation_steps)

    @property
    def micro_batch_rows(self) -> int:
        """Rows (sequences) per replica per round: m·k for the patient unit, m per tuple."""
        return self.micro_batch * (self.max_contributions if self.unit == "patient" else 1)

    @property
    def epochs(self) -> float:
        return self.steps * self.batch_size / self.dataset_size

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(expected_batch_size=self.expected_batch_size, micro_batch=self.micro_batch,
                   micro_batch_rows=self.micro_batch_rows)
        return out


def plan_training(training_config, dataset_size: int, holdout_fraction: float = 0.0, unit: str = "tuple",
                  max_contributions: int = 1) -> TrainingPlan:
    """The plan of ``training_config`` (``dpbert.config.TrainingConfig``) over a public n (tuples,
    or patients with ``unit="patient"``, each contributing ≤ ``max_contributions`` = k tuples).

    ``holdout_fraction`` f: patients held out of training (``dpbert.data.splits``, each
    independently); the plan's n is the public n·(1 − f), rounded — the expected number of
    trained-on units, so q·n is the expected batch. A DP count of the trained-on rows is passed
    with f = 0 (it already counts members only).
    """
    n = _checks.integer("dataset_size", dataset_size, 1)
    _checks.choice("unit", unit, UNITS)
    k = _checks.integer("max_contributions", max_contributions, 1) if unit == "patient" else 1
    if unit == "patient" and training_config.sampling != "poisson":
        raise ValueError("privacy.unit = patient (user-level DP-SGD) needs training.sampling = poisson "
                         f"(patients Poisson-sampled), got {training_config.sampling!r}")
    if not 0.0 <= float(holdout_fraction) < 1.0:
        raise ValueError(f"holdout_fraction must be in [0, 1), got {holdout_fraction!r}")
    n = max(1, int(math.floor(n * (1.0 - float(holdout_fraction)) + 0.5)))
    tc = training_config
    B = _checks.integer("training.batch_size", tc.batch_size, 1)
    _checks.choice("training.sampling", tc.sampling, SAMPLING_MODES)
    P = _checks.integer("training.replicas", tc.replicas, 1)
    T = _checks.integer("training.accumulation_steps", tc.accumulation_steps, 1)
    if B % (P * T):
        raise ValueError(f"training.batch_size {B} must be divisible by replicas × accumulation_steps "
                         f"= {P * T}")
    if tc.steps is not None:
        steps = _checks.integer("training.steps", tc.steps, 1)
    else:
        steps = steps_for(n, B, tc.epochs)
    return TrainingPlan(dataset_size=n, batch_size=B, sampling=tc.sampling,
                        sampling_probability=min(1.0, B / n), steps=steps, replicas=P,
                        accumulation_steps=T, unit=unit, max_contributions=k)


def plan_for_config(config, dataset_size: int) -> TrainingPlan:
    """The plan of a whole ``dpbert.config.Config`` over a public n of its unit (tuples, or
    patients for ``privacy.unit: patient``), with the membership holdout."""
    unit = config.privacy.unit
    return plan_training(config.training, dataset_size, config.membership.holdout_patient_fraction, unit=unit,
                         max_contributions=config.privacy.max_tuples_per_patient)
