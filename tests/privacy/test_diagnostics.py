"""DP training diagnostics: σ_eff composition, noise scale per part, and a positive control."""
import math

import numpy as np
import pytest

from dpbert.privacy import diagnostics as D


def test_effective_noise_multiplier_composes_every_released_part():
    cfg = D.DiagnosticsConfig(noise_ratio=5.0)
    # 1/σ_eff² = 1/σ² + 4/(5σ)²
    assert D.effective_noise_multiplier(2.0, cfg) == pytest.approx(2.0 / math.sqrt(1 + 4 / 25))
    assert D.effective_noise_multiplier(2.0, D.DiagnosticsConfig(enabled=False)) == 2.0


def test_joint_sensitivity_matches_sigma_eff():
    """Dividing each part by its noise scale, one example's shift has norm² = Σ σ_j⁻² = σ_eff⁻²."""
    sigma, cfg = 1.3, D.DiagnosticsConfig(noise_ratio=8.0, loss_bound=12.0)
    stds = D.noise_stds(sigma, cfg)
    sensitivities = {"loss": cfg.loss_bound, "accuracy": 1.0, "clipped": 1.0, "batch_size": 1.0}
    shift_sq = (1.0 / sigma) ** 2 + sum((sensitivities[p] / stds[p]) ** 2 for p in D.PARTS)  # gradient: C/(σC)
    assert shift_sq == pytest.approx(D.effective_noise_multiplier(sigma, cfg) ** -2)


def test_released_values_have_the_stated_noise_and_a_zero_noise_control_is_caught():
    cfg = D.DiagnosticsConfig()
    sums = {"loss_clipped_sum": 300.0, "accuracy_sum": 20.0, "clipped": 50.0, "examples": 64.0}
    rng = np.random.default_rng(0)
    draws = np.array([[D.release(sums, 1.0, 64.0, cfg, rng)[k] for k in ("loss", "batch_size")]
                      for _ in range(4000)])
    stds = D.noise_stds(1.0, cfg)
    measured = draws.std(axis=0, ddof=1) * np.array([64.0, 1.0])
    tolerance = 4 / math.sqrt(2 * len(draws))
    assert np.all(np.abs(measured / [stds["loss"], stds["batch_size"]] - 1) < tolerance)

    def broken_release(sums, *_args, **_kwargs):  # positive control: exact values released
        return {"loss": sums["loss_clipped_sum"] / 64.0, "batch_size": sums["examples"]}

    leaked = np.array([[broken_release(sums)[k] for k in ("loss", "batch_size")] for _ in range(100)])
    assert not np.all(np.abs(leaked.std(axis=0, ddof=1) * [64.0, 1.0] / [stds["loss"], stds["batch_size"]] - 1)
                      < tolerance)


def test_planned_ledger_charges_the_diagnostics():
    from dpbert.config import Config
    from dpbert.privacy.accountant import planned_ledger

    config = Config()
    record = planned_ledger(config, 10000)["train_events"][0]
    assert record["noise_multiplier"] == pytest.approx(
        D.effective_noise_multiplier(config.training.noise_multiplier, D.config_of(config.training)))
