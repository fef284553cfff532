"""``TrainResult``: what a training run did, as the trainer stage and the tests read it."""
from __future__ import annotations

import dataclasses
import math
from typing import List, Optional

@dataclasses.dataclass
class TrainResult:
    steps_taken_total: int
    steps_this_run: int
    model_step: int
    resumed_from_step: int
    steps_planned: int
    losses: List[float]
    final_mlm_loss: float
    final_mlm_accuracy: float
    clipped_fraction: float
    sampling_mode: str
    sampling_rate: float
    expected_batch_size: float
    logical_batch: int
    replicas: int
    accumulation: int
    micro_batch: int
    noise_multiplier: float
    #: σ the accountant must charge per step: the gradient's σ combined with the DP diagnostics
    #: (``dpbert.privacy.diagnostics``); equals ``gradient_noise_multiplier`` without diagnostics.
    effective_noise_multiplier: float
    #: σ of the gradient noise actually applied (σ, or σ√(P·T) in the paper's noise mode).
    gradient_noise_multiplier: float
    #: The RELEASED per-step diagnostics (noisy for a DP run; exact for the private baseline):
    #: lists ``loss``, ``accuracy``, ``clipped_fraction``, ``batch_size`` for this run's steps.
    released_diagnostics: dict
    #: Std of the noise on each released diagnostic sum (empty without DP diagnostics).
    diagnostics_noise_std: dict
    #: PRIVATE: the exact per-step sums the released diagnostics were computed from.
    exact_diagnostic_sums: list
    noise_mode: str
    clip_norm: float
    non_private: bool
    epsilon: Optional[float]
    delta: Optional[float]
    dataset_size: int
    planned_dataset_size: int
    clipping_path: str
    strategy: str
    seconds: float
    model_dir: str
    checkpoint_dir: str
    saved_model_dir: Optional[str]
    tensorboard_dir: str
    ledger_path: str
    #: The values the DP event must agree with, read from the running sampler, step and ledger
    #: (``integrity.observe``; ``dpbert.privacy.event_check``). PRIVATE (shuffle: the exact n).
    observed: dict = dataclasses.field(default_factory=dict)
    #: PRIVATE: the run-time integrity checks (``dpbert.mechanism.integrity``): which ran, statistic,
    #: tolerance, passed — with exact counts.
    integrity_checks: dict = dataclasses.field(default_factory=dict)
    #: What DP-SGD trained (``training.trainable``): the sets and the trained parameter count.
    trainable: dict = dataclasses.field(default_factory=dict)
    #: Worker processes of the run (``training.strategy: multi_worker``) and this one's rank (0: chief).
    workers: int = 1
    worker_rank: int = 0
    #: sha256 of the released (merged) MLM weights: every worker of a run must hold the same.
    parameter_digest: str = ""

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        if data["epsilon"] is not None and math.isinf(data["epsilon"]):
            data["epsilon"] = "inf"
        return data
