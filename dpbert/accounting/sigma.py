"""The accounted σ: the noise multiplier every DP-SGD step is charged at, in one place.

A step releases the noisy clipped gradient sum (σ) and, with ``training.dp_diagnostics``, noisy
sums of its loss, accuracy, clipped count and batch size (each at r·σ, ``dpbert.privacy.diagnostics``):
the step's Gaussian releases compose to one Gaussian of σ_eff = (σ⁻² + Σ_parts (rσ)⁻²)^(−1/2).
The planner, the trainer, the step limit and the budget all charge ``accounted_sigma``.
"""
from __future__ import annotations

from dpbert.privacy import diagnostics as _diagnostics


def accounted_sigma(gradient_sigma: float, training_config=None, *, diagnostics=None) -> float:
    """σ_eff of a step whose gradient is noised at ``gradient_sigma``, with the diagnostics of
    ``training_config`` (or a ``DiagnosticsConfig`` ``diagnostics``; released only when enabled)."""
    config = diagnostics if diagnostics is not None else _diagnostics.config_of(training_config)
    return _diagnostics.effective_noise_multiplier(float(gradient_sigma), config)


def configured_sigma(training_config) -> float:
    """The accounted σ of a training configuration (0 for the non-private baseline)."""
    if training_config.non_private:
        return 0.0
    return accounted_sigma(training_config.noise_multiplier, training_config)
