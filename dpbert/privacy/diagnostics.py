"""Training diagnostics released with differential privacy (loss, accuracy, clipped fraction, batch size).

A DP-SGD step computes, besides the clipped gradient sum, per-step sums over the SAME Poisson
sample: the MLM loss, the MLM accuracy, the number of clipped examples and the batch size. Released
exactly, they leak (one canary shifts the batch-mean loss; the exact batch sizes reveal n). Here
each released sum gets its own Gaussian noise scaled to its own sensitivity, r·σ times it
(r = ``noise_ratio``).

Contract: the gradient and the diagnostics together are ONE Gaussian mechanism of noise
multiplier σ_eff = (Σ_j σ_j⁻²)^(−1/2) (four parts at r·σ: σ / √(1 + 4/r²)), sampled by the same
Poisson coin flips, so the trainer's DP event carries σ_eff instead of σ. The diagnostics' noise
is drawn from OS entropy (never seeded from a public value outside tests) once per logical step.
The exact values never leave the private state directory; what is shown (``release``) are ratios
of noisy sums clamped to their range (post-processing), with their per-step noise stds
(``step_noise_stds``) and windowed means (``window``), labelled "DP estimate". The table of parts
and sensitivities, the derivation and the estimator: docs/privacy.md ("The DP diagnostics").
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional

import numpy as np

from dpbert.config import DiagnosticsSettings

#: The released parts besides the gradient (their noise multiplier is ratio · σ).
PARTS = ("loss", "accuracy", "clipped", "batch_size")


@dataclasses.dataclass(frozen=True)
class DiagnosticsConfig:
    """The diagnostics settings; their defaults are ``training``'s ``DiagnosticsSettings`` (one definition)."""

    enabled: bool = DiagnosticsSettings.dp_diagnostics
    #: noise multiplier of each diagnostic part, in units of the gradient's σ.
    noise_ratio: float = DiagnosticsSettings.diagnostics_noise_ratio
    #: per-example MLM loss clipped to [0, loss_bound] nats before summing (its sensitivity).
    loss_bound: float = DiagnosticsSettings.diagnostics_loss_bound

    def __post_init__(self):
        if not self.noise_ratio > 0:
            raise ValueError(f"training.diagnostics_noise_ratio must be > 0, got {self.noise_ratio}")
        if not self.loss_bound > 0:
            raise ValueError(f"training.diagnostics_loss_bound must be > 0, got {self.loss_bound}")


def config_of(training_config: DiagnosticsSettings) -> DiagnosticsConfig:
    """The diagnostics settings of a ``TrainingConfig`` (any ``DiagnosticsSettings``)."""
    return DiagnosticsConfig(enabled=bool(training_config.dp_diagnostics),
                             noise_ratio=float(training_config.diagnostics_noise_ratio),
                             loss_bound=float(training_config.diagnostics_loss_bound))


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


#: The range of each released ratio (``loss``: [0, loss_bound]), the clamp of ``release``.
RATIO_RANGES = {"accuracy": (0.0, 1.0), "clipped_fraction": (0.0, 1.0)}


def exact_parts(sums: Dict[str, float]) -> Dict[str, float]:
    """The exact per-step sums of the released parts (keys of ``noise_stds``) from a step's stats
    (``loss_clipped_sum``, ``accuracy_sum``, ``clipped``, ``examples``). PRIVATE."""
    return {"loss": float(sums["loss_clipped_sum"]), "accuracy": float(sums["accuracy_sum"]),
            "clipped": float(sums["clipped"]), "batch_size": float(sums["examples"])}


def noisy_sums(exact: Dict[str, float], gradient_sigma: float, config: DiagnosticsConfig,
               rng: Optional[np.random.Generator] = None) -> Dict[str, float]:
    """The released noisy sums: each exact part (``exact_parts``) plus its own Gaussian draw of
    std ``noise_stds(...)[part]``. What the run-time release check (``dpbert.mechanism.integrity``,
    ``RunChecks.released``) compares with the exact sums."""
    rng = rng if rng is not None else np.random.default_rng()
    std = noise_stds(gradient_sigma, config)
    return {part: float(exact[part]) + float(rng.normal(0.0, std[part])) for part in ("loss", "accuracy",
                                                                                       "clipped", "batch_size")}


def release(sums: Dict[str, float], gradient_sigma: float, expected_batch: float, config: DiagnosticsConfig,
            rng: Optional[np.random.Generator] = None) -> Dict[str, float]:
    """The released (noisy) diagnostics of one step from its exact per-step ``sums``
    (``loss_clipped_sum``, ``accuracy_sum``, ``clipped``, ``examples``):
    ``ratios(noisy_sums(exact_parts(sums), ...))``.

    Returns ``loss``, ``accuracy``, ``clipped_fraction`` — each noisy sum ÷ the noisy batch size
    (at least 1), clamped to its range (docs/privacy.md) — and ``batch_size`` (the noisy count,
    at least 0). ``expected_batch`` (the public q·n) is not used by the estimate; it is kept in
    the signature for the callers (and ``step_noise_stds``). A training loop that runs the
    release check calls the three steps itself and reports ``exact_parts`` and ``noisy_sums``
    to ``RunChecks.released`` with ``noise_stds``.
    """
    del expected_batch  # the denominator is the released noisy batch size (docs/privacy.md)
    return ratios(noisy_sums(exact_parts(sums), gradient_sigma, config, rng), config)


def ratios(noisy: Dict[str, float], config: DiagnosticsConfig) -> Dict[str, float]:
    """Post-processing of the four noisy sums (``loss``, ``accuracy``, ``clipped``,
    ``batch_size``): ratios to the noisy batch size (at least 1), clamped to their ranges."""
    denominator = max(float(noisy["batch_size"]), 1.0)

    def clamp(value, low, high):
        return float(min(max(value, low), high))

    return {"loss": clamp(noisy["loss"] / denominator, 0.0, config.loss_bound),
            "accuracy": clamp(noisy["accuracy"] / denominator, *RATIO_RANGES["accuracy"]),
            "clipped_fraction": clamp(noisy["clipped"] / denominator, *RATIO_RANGES["clipped_fraction"]),
            "batch_size": max(float(noisy["batch_size"]), 0.0)}


def step_noise_stds(sum_noise_stds: Dict[str, float], expected_batch: float) -> Dict[str, float]:
    """The noise std of one released per-step value: the noise std of its sum ÷ the public expected
    batch size (first order; the batch size's own noise adds a smaller term). Keys ``loss``,
    ``accuracy``, ``clipped_fraction``, ``batch_size``; empty without DP diagnostics."""
    if not sum_noise_stds or not expected_batch or expected_batch <= 0:
        return {}
    b = float(expected_batch)
    return {"loss": sum_noise_stds["loss"] / b, "accuracy": sum_noise_stds["accuracy"] / b,
            "clipped_fraction": sum_noise_stds["clipped"] / b, "batch_size": sum_noise_stds["batch_size"]}


def window(steps: int, fraction: float = 0.1, minimum: int = 5) -> int:
    """How many of the last (or first) per-step values a windowed mean averages: ``fraction`` of
    the steps, at least ``minimum`` (all of them when fewer)."""
    steps = max(int(steps), 0)
    return min(steps, max(int(minimum), int(math.ceil(fraction * steps))))
