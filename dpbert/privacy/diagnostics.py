"""Training diagnostics released with differential privacy (loss, accuracy, clipped fraction, batch size).

A DP-SGD step computes, besides the clipped gradient sum, per-step sums over the SAME Poisson
sample: the MLM loss, the MLM accuracy, the number of clipped examples and the batch size. Released
exactly, they leak: one canary or outlier shifts the batch-mean loss by (ℓ_u − ℓ̄)/|B_t|, and the
exact batch sizes reveal n. Here each released sum gets its own Gaussian noise scaled to its own
sensitivity (adding or removing one example changes it by at most):

    part              per-example value                      sensitivity Δ_j
    gradient          clipped gradient g_i (‖g_i‖ ≤ C)        C          noise σ·C (the DP-SGD step)
    loss              min(max(ℓ_i, 0), L)                     L          noise r·σ·L
    accuracy          correct_i / predictions_i ∈ [0, 1]      1          noise r·σ
    clipped           1[‖∇ℓ_i‖ > C]                           1          noise r·σ
    batch size        1                                       1          noise r·σ

(r = ``noise_ratio``.) Derivation of the accounting: divide part j by its noise scale σ_j·Δ_j; the
released vector is then (shift) + N(0, I) where adding one example shifts it by a vector of
squared norm ≤ Σ_j (Δ_j / (σ_j Δ_j))² = Σ_j σ_j⁻². That is ONE Gaussian mechanism with noise
multiplier σ_eff = (Σ_j σ_j⁻²)^(−1/2) on a unit-sensitivity query, sampled by the same Poisson
coin flips, so a step is PoissonSampled(q, Gaussian(σ_eff)) and the trainer's DP event carries
σ_eff instead of σ. With four diagnostic parts at r·σ each: σ_eff = σ / √(1 + 4/r²) (r = 8:
0.970·σ). The noise of the diagnostics is drawn on the host from OS entropy (never seeded from a
public value outside tests) once per logical step.

The exact values never leave the trainer's private state directory; what the model artifact,
TensorBoard and the dashboard show are the released (noisy) estimates, normalised by the public
expected batch size q·n (``release``).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional

import numpy as np

#: The released parts besides the gradient (their noise multiplier is ratio · σ).
PARTS = ("loss", "accuracy", "clipped", "batch_size")


@dataclasses.dataclass(frozen=True)
class DiagnosticsConfig:
    enabled: bool = True
    #: noise multiplier of each diagnostic part, in units of the gradient's σ.
    noise_ratio: float = 8.0
    #: per-example MLM loss clipped to [0, loss_bound] nats before summing (its sensitivity).
    loss_bound: float = 12.0

    def __post_init__(self):
        if not self.noise_ratio > 0:
            raise ValueError(f"training.diagnostics_noise_ratio must be > 0, got {self.noise_ratio}")
        if not self.loss_bound > 0:
            raise ValueError(f"training.diagnostics_loss_bound must be > 0, got {self.loss_bound}")


def config_of(training_config) -> DiagnosticsConfig:
    """The diagnostics settings of a ``TrainingConfig`` (defaults where it has none)."""
    return DiagnosticsConfig(
        enabled=bool(getattr(training_config, "dp_diagnostics", True)),
        noise_ratio=float(getattr(training_config, "diagnostics_noise_ratio", 8.0)),
        loss_bound=float(getattr(training_config, "diagnostics_loss_bound", 12.0)))


def effective_noise_multiplier(gradient_sigma: float, config: DiagnosticsConfig) -> float:
    """σ_eff = (σ⁻² + Σ_parts (rσ)⁻²)^(−1/2); σ itself when the diagnostics are off."""
    if not config.enabled:
        return float(gradient_sigma)
    inverse_sq = gradient_sigma ** -2 + len(PARTS) * (config.noise_ratio * gradient_sigma) ** -2
    return 1.0 / math.sqrt(inverse_sq)


def noise_stds(gradient_sigma: float, config: DiagnosticsConfig) -> Dict[str, float]:
    """Std of the Gaussian noise added to each released SUM."""
    scale = config.noise_ratio * gradient_sigma
    return {"loss": scale * config.loss_bound, "accuracy": scale, "clipped": scale, "batch_size": scale}


def release(sums: Dict[str, float], gradient_sigma: float, expected_batch: float, config: DiagnosticsConfig,
            rng: Optional[np.random.Generator] = None) -> Dict[str, float]:
    """The released (noisy) diagnostics of one step from its exact per-step ``sums``
    (``loss_clipped_sum``, ``accuracy_sum``, ``clipped``, ``examples``).

    Returns ``loss``, ``accuracy``, ``clipped_fraction`` (noisy sums / public expected batch) and
    ``batch_size`` (noisy count).
    """
    rng = rng if rng is not None else np.random.default_rng()
    std = noise_stds(gradient_sigma, config)
    noisy = {
        "loss": sums["loss_clipped_sum"] + rng.normal(0.0, std["loss"]),
        "accuracy": sums["accuracy_sum"] + rng.normal(0.0, std["accuracy"]),
        "clipped": sums["clipped"] + rng.normal(0.0, std["clipped"]),
        "batch_size": sums["examples"] + rng.normal(0.0, std["batch_size"]),
    }
    return {"loss": noisy["loss"] / expected_batch, "accuracy": noisy["accuracy"] / expected_batch,
            "clipped_fraction": noisy["clipped"] / expected_batch, "batch_size": noisy["batch_size"]}
