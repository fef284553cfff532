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
    released = [D.release(sums, 1.0, 64.0, cfg, rng) for _ in range(4000)]
    # the loss is noisy loss sum ÷ noisy batch size: × the released batch size gives the noisy sum back
    # (the clamp to [0, 12] does not bind at these sums)
    draws = np.array([[r["loss"] * r["batch_size"], r["batch_size"]] for r in released])
    stds = D.noise_stds(1.0, cfg)
    measured = draws.std(axis=0, ddof=1)
    tolerance = 4 / math.sqrt(2 * len(draws))
    assert np.all(np.abs(measured / [stds["loss"], stds["batch_size"]] - 1) < tolerance)
    assert abs(draws[:, 0].mean() - 300.0) < 4 * stds["loss"] / math.sqrt(len(draws))

    def broken_release(sums, *_args, **_kwargs):  # positive control: exact values released
        return {"loss": sums["loss_clipped_sum"] / sums["examples"], "batch_size": sums["examples"]}

    leaked = np.array([[broken_release(sums)[k] * (sums["examples"] if k == "loss" else 1) for k in ("loss", "batch_size")]
                       for _ in range(100)])
    assert not np.all(np.abs(leaked.std(axis=0, ddof=1) / [stds["loss"], stds["batch_size"]] - 1) < tolerance)


def _expected_b_release(sums, sigma, expected_batch, cfg, rng):
    """The previous estimator (positive control): noisy sums ÷ the public EXPECTED batch size."""
    std = D.noise_stds(sigma, cfg)
    return {"accuracy": (sums["accuracy_sum"] + rng.normal(0, std["accuracy"])) / expected_batch,
            "clipped_fraction": (sums["clipped"] + rng.normal(0, std["clipped"])) / expected_batch,
            "loss": (sums["loss_clipped_sum"] + rng.normal(0, std["loss"])) / expected_batch}


def test_released_ratios_of_noisy_sums_stay_in_range_where_the_expected_b_estimator_does_not():
    """A large Poisson batch (80 drawn where 64 are expected), every unit clipped: the fraction is 1.
    Dividing by the expected B gives 1.25 (out of [0, 1]) and, with the noise, negative accuracies;
    the released ratios of noisy sums are clamped to their ranges and centre on the truth."""
    cfg = D.DiagnosticsConfig(noise_ratio=8.0, loss_bound=12.0)
    sums = {"loss_clipped_sum": 80 * 11.5, "accuracy_sum": 80 * 0.02, "clipped": 80.0, "examples": 80.0}
    rng = np.random.default_rng(3)
    old = [_expected_b_release(sums, 0.8, 64.0, cfg, rng) for _ in range(500)]
    new = [D.release(sums, 0.8, 64.0, cfg, rng) for _ in range(500)]
    assert np.median([r["clipped_fraction"] for r in old]) > 1.1            # the control goes out of range
    assert min(r["accuracy"] for r in old) < 0 and max(r["loss"] for r in old) > 12
    for key, (low, high) in (("clipped_fraction", (0, 1)), ("accuracy", (0, 1)), ("loss", (0, 12))):
        values = np.array([r[key] for r in new])
        assert values.min() >= low and values.max() <= high, key
    assert np.median([r["clipped_fraction"] for r in new]) == pytest.approx(1.0, abs=0.05)
    assert all(r["batch_size"] >= 0 for r in new)
    # a noisy batch size at or below 0 cannot divide by ~0: the denominator is at least 1
    tiny = D.ratios({"loss": 5.0, "accuracy": 0.5, "clipped": 3.0, "batch_size": -2.0}, cfg)
    assert tiny == {"loss": 5.0, "accuracy": 0.5, "clipped_fraction": 1.0, "batch_size": 0.0}


def test_the_ratios_are_post_processing_sigma_eff_is_unchanged_and_step_noise_is_stated():
    # σ_eff of gradient + 4 diagnostic sums at r = 8: the released ratios add no query
    cfg = D.DiagnosticsConfig()
    assert D.effective_noise_multiplier(0.8, cfg) == pytest.approx(0.8 / math.sqrt(1 + 4 / 64))
    assert set(D.PARTS) == {"loss", "accuracy", "clipped", "batch_size"}  # the batch size is released already
    # the demo's per-step loss noise std: 8 · 0.8 · 12 / 16 = 4.8 nats
    step = D.step_noise_stds(D.noise_stds(0.8, cfg), 16.0)
    assert step["loss"] == pytest.approx(4.8) and step["clipped_fraction"] == pytest.approx(0.4)
    assert D.step_noise_stds({}, 16.0) == {}
    assert (D.window(60), D.window(1000), D.window(3)) == (6, 100, 3)


def test_planned_ledger_charges_the_diagnostics():
    from dpbert.config import Config
    from dpbert.accounting.accountant import planned_ledger

    config = Config()
    record = planned_ledger(config, 10000)["train_events"][0]
    assert record["noise_multiplier"] == pytest.approx(
        D.effective_noise_multiplier(config.training.noise_multiplier, D.config_of(config.training)))
