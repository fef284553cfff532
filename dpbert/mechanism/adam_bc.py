"""DP-AdamBC (Tang, Shpilevskiy and Lécuyer, AAAI 2024, arXiv:2312.14334): AdamW whose second
moment is corrected for the DP noise it is handed.

The update the optimizer receives is ĝ = (S + z)/B with z ~ N(0, σ²Δ²I) (``dpbert.mechanism
.gaussian``), so E[ĝ²] = E[(S/B)²] + Φ per coordinate, Φ = (σΔ/B)². Adam's v̂ estimates E[ĝ²]; at
DP-SGD's batch sizes Φ dominates it, √v̂ ≈ √Φ is nearly the same constant on every coordinate and
DP-Adam behaves like DP-SGD with momentum. DP-AdamBC removes the bias (t: the optimizer step)::

    m_t = β₁ m_{t−1} + (1 − β₁) ĝ_t          m̂_t = m_t / (1 − β₁ᵗ)
    v_t = β₂ v_{t−1} + (1 − β₂) ĝ_t²         v̂_t = v_t / (1 − β₂ᵗ)
    θ_t = θ_{t−1} − η_t · m̂_t / √max(v̂_t − Φ, γ′)

(no ε: γ′, ``gamma``, is the paper's floor), with AdamW's decoupled weight decay
θ ← θ − η_t·λ·θ applied first (tf_keras's ``AdamW.apply_gradients``, unchanged).

Φ is the variance of the noise the MECHANISM actually adds, over the divisor it actually uses
(``GaussianSumMechanism.update_noise_variance``), handed in by the step that composes the two
(``DPSGDTrainStep``: :meth:`DPAdamBC.set_noise_variance`); never the accounted σ_eff, which
also covers the released diagnostics. An update before Φ is set is refused. The optimizer state
is a function of the released (noisy) updates only, so ``noise_dominance`` (mean v̂ / Φ per
trained piece, ≈ 1: noise-dominated) may be logged. docs/training.md, "Optimizer and clipping
options".
"""
from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf
import tf_keras


class DPAdamBC(tf_keras.optimizers.AdamW):
    """tf_keras AdamW with DP-AdamBC's second-moment correction (module docstring). ``gamma``:
    γ′ > 0; every other keyword is AdamW's (``amsgrad`` is refused)."""

    def __init__(self, *, gamma: float = 1e-8, name: str = "DPAdamBC", **kwargs):
        if kwargs.get("amsgrad"):
            raise ValueError("DPAdamBC has no amsgrad variant")
        if not float(gamma) > 0:
            raise ValueError(f"gamma must be > 0, got {gamma}")
        super().__init__(name=name, **kwargs)
        self.gamma = float(gamma)
        self._noise_variance: Optional[float] = None

    @property
    def noise_variance(self) -> Optional[float]:
        """Φ, as set from the mechanism (None until then)."""
        return self._noise_variance

    def set_noise_variance(self, phi: float):
        """Φ ≥ 0 from ``GaussianSumMechanism.update_noise_variance``; before the first update is traced."""
        phi = float(phi)
        if not phi >= 0:
            raise ValueError(f"the noise variance must be >= 0, got {phi}")
        self._noise_variance = phi

    def _bias_corrections(self, dtype):
        # tf.constant, not tf.cast: a python float cast goes through float32 first (β₂ = 0.999
        # would become 0.99900001, 1 − β₂ᵗ off by 1e-5 relative in a float64 run).
        t = tf.cast(self.iterations + 1, dtype)
        return (1 - tf.pow(tf.constant(self.beta_1, dtype), t)), (1 - tf.pow(tf.constant(self.beta_2, dtype), t))

    def update_step(self, gradient, variable):
        """One DP-AdamBC update of ``variable`` (the weight decay came before, in ``apply_gradients``)."""
        if self._noise_variance is None:
            raise ValueError("DPAdamBC needs Φ from the mechanism (set_noise_variance) before its first update")
        gradient = tf.convert_to_tensor(gradient)
        dtype = variable.dtype
        key = self._index_dict[self._var_key(variable)]
        m, v = self._momentums[key], self._velocities[key]
        m.assign_add((gradient - m) * (1 - self.beta_1))
        v.assign_add((tf.square(gradient) - v) * (1 - self.beta_2))
        first, second = self._bias_corrections(dtype)
        corrected = tf.maximum(v / second - tf.constant(self._noise_variance, dtype), tf.constant(self.gamma, dtype))
        variable.assign_sub(tf.cast(self.learning_rate, dtype) * (m / first) / tf.sqrt(corrected))

    def noise_dominance(self, variables: Sequence[tf.Variable]) -> tf.Tensor:
        """``[len(variables)]``: mean over each variable's coordinates of v̂ / Φ after the steps
        taken (v̂ = v / (1 − β₂ᵗ), t = ``iterations``); NaN before a step or with Φ = 0."""
        if not hasattr(self, "_velocities"):  # not built: no slot, no step taken
            return tf.fill([len(variables)], float("nan"))
        means = tf.stack([tf.reduce_mean(tf.cast(self._velocities[self._index_dict[self._var_key(v)]], tf.float64))
                          for v in variables])
        if not self._noise_variance:
            return tf.fill(tf.shape(means), float("nan"))
        second = 1 - tf.pow(tf.constant(self.beta_2, tf.float64), tf.cast(self.iterations, tf.float64))
        return tf.where(second > 0, means / tf.maximum(second, 1e-300) / self._noise_variance, float("nan"))

    def get_config(self):
        return dict(super().get_config(), gamma=self.gamma)
