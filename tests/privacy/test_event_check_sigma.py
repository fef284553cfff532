"""The event check compares σ_eff at rel 1e-9, then the event's structure exactly: σ_eff is
computed two ways (the recorded one and the running step's), equal only to the last bits."""
from dpbert.privacy import diagnostics, events
from dpbert.privacy.event_check import check_event


def _observed(sigma, multipliers):
    return dict(sampling="poisson", sampling_probability=32 / 250, sampling_unit="patient", sampler_k=2,
                group_size=2, steps_executed=50, base_noise_multiplier=sigma, gradient_noise_multiplier=sigma,
                noise_mode="once", replicas=1, accumulation_steps=1, diagnostic_noise_multipliers=multipliers,
                expected_batch_size=32.0)


def test_sigma_eff_equal_up_to_rounding_passes_and_a_real_difference_fails():
    sigma = 1.8039  # the σ `dpbert budget --target-epsilon 3` gave for 250 patients: differs in the last bit
    config = diagnostics.DiagnosticsConfig()
    stds = diagnostics.noise_stds(sigma, config)
    multipliers = {p: s / (12.0 if p == "loss" else 1.0) for p, s in stds.items()}
    recorded = diagnostics.effective_noise_multiplier(sigma, config)
    record = events.dpsgd_event(recorded, 32, 250, 50, "poisson", 2, unit="patient")
    assert check_event(record, _observed(sigma, multipliers)) == []
    off = events.dpsgd_event(recorded * (1 + 1e-6), 32, 250, 50, "poisson", 2, unit="patient")
    assert any("noise_multiplier" in m for m in check_event(off, _observed(sigma, multipliers)))
