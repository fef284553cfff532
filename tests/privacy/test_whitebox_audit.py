"""White-box one-run audit of DP-SGD (dpbert.privacy.whitebox_audit; its harness
dpbert.evaluate.whitebox): canary algebra, power, and the three positive controls of issue 15 on
REAL DP-SGD steps of a tiny BERT.

Setting of every run: the embedded synthetic corpus (160 rows of L = 16, WordPiece V = 1024),
a 1-layer H = 16 BERT (probe: the 1024 × 16 word embedding, d' = 16384, orthogonal canaries), B = 16 → q = 0.1,
T = 60 steps (q·T = 6), C = 1, δ = 1e-5, β = 0.05 (95 %), fixed seeds.

Tolerances: a positive control must put the lower bound ABOVE the accountant's ε (what
"detected" means); an honest run must keep it at or below (the theorem: probability ≥ 1 − β for
each seed). Measured noise and participation counts are compared with their Gaussian / binomial
laws at 5 standard deviations, the bias of the real gradients included as a stated bound.
"""
import math

import numpy as np
import pytest

from dpbert.privacy import one_run_audit as audit
from dpbert.evaluate import whitebox as wb
from dpbert.privacy import whitebox_audit as wa

ROWS, BATCH, STEPS, DELTA = 160, 16, 60, 1e-5
SIGMA_MID = 1.5   # accountant: ε = 2.76 at (q = 0.1, T = 60, δ = 1e-5)
SIGMA_LOW = 3.0   # accountant: ε = 1.07


@pytest.fixture(scope="module")
def data():
    ids, vocab = wb.demo_token_rows()
    return ids[:ROWS], wb.demo_spec(vocab, ids.shape[1])


def _audit(data, **kwargs):
    ids, spec = data
    return wb.whitebox_audit(ids, spec, batch_size=BATCH, steps=STEPS, delta=DELTA, **kwargs)


# ------------------------------------------------------------------------------ canary algebra
def test_fwht_is_the_hadamard_matrix_product():
    from scipy.linalg import hadamard

    x = np.random.default_rng(0).normal(size=(3, 64))
    np.testing.assert_allclose(wa.fwht(x), x @ hadamard(64), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="power-of-two"):
        wa.fwht(np.zeros(48))
    assert wa.probe_dims(128000, 16384) == 16384 and wa.probe_dims(300, 16384) == 256


def test_canaries_are_orthogonal_have_norm_c_and_are_regenerated_identically():
    a = wa.canary_vectors(7, 50, 256, 0.25)
    np.testing.assert_array_equal(a, wa.canary_vectors(7, 50, 256, 0.25))
    # orthogonal, norm C: no cross-talk between canaries
    np.testing.assert_allclose(a @ a.T, 0.25 ** 2 * np.eye(50), atol=1e-12)
    # dense (every coordinate ±C/√d'), so a real gradient projects like on a random direction
    np.testing.assert_allclose(np.abs(a), 0.25 / 16, rtol=1e-12)
    assert not np.allclose(a, wa.canary_vectors(8, 50, 256, 0.25))
    with pytest.raises(ValueError, match="canaries"):
        wa.canary_layout(7, 300, 256)


def test_canary_sums_and_projections_match_the_dense_computation():
    m, dims, steps, C = 200, 256, 5, 0.5
    rng = np.random.default_rng(0)
    part = rng.random((steps, m)) < 0.1
    dense = wa.canary_vectors(11, m, dims, C)
    np.testing.assert_allclose(wa.canary_sums(11, part, dims, C), part.astype(np.float64) @ dense,
                               rtol=1e-5, atol=1e-6)
    g = rng.normal(size=(steps, dims)).astype(np.float32)
    np.testing.assert_allclose(wa.canary_projections(11, g, m, C), g @ dense.T / C ** 2, rtol=1e-9, atol=1e-9)


def test_llr_scores_match_the_formula_and_are_stable():
    y = np.array([[0.0, 1.0, 400.0, -400.0]])
    q, sigma = 0.1, 1.0
    naive = np.log(1 - q + q * np.exp((y[:, :2] - 0.5) / sigma ** 2)).sum(0)
    s = wa.llr_scores(y, q, sigma)
    np.testing.assert_allclose(s[:2], naive, rtol=1e-12)
    assert np.all(np.isfinite(s))
    assert s[2] == pytest.approx(math.log(q) + 399.5, rel=1e-12)   # no overflow
    assert s[3] == pytest.approx(math.log1p(-q), rel=1e-9)        # no underflow to -inf
    assert np.isfinite(wa.llr_scores(np.zeros((3, 2)), 1.0, 2.0)).all()  # q = 1


def test_max_reachable_lower_bound_is_the_bound_with_every_guess_right():
    m = 1000
    grid = audit.default_k_grid(m)
    reachable = wa.max_reachable_lower_bound(m, 0.05, DELTA)
    direct = max(audit.epsilon_lower_bound(a + b, a + b, 0.05 / len(grid), DELTA, m) for a, b in grid)
    assert reachable == pytest.approx(direct, abs=1e-12)
    # = what audit_best_of reports for a perfect scorer when every guess CAN be right (the
    # (m/2, m/2) choice needs exactly m/2 canaries in; a real draw misses it by ≈ √m/2)
    included = np.zeros(m, bool)
    included[np.random.default_rng(0).permutation(m)[: m // 2]] = True
    perfect = audit.audit_best_of(included.astype(float), included, grid, beta=0.05, delta=DELTA)
    assert perfect["accuracy"] == 1.0
    assert reachable == pytest.approx(perfect["epsilon_lower_bound"], abs=1e-12)
    # the figures the issue quotes (δ = 1e-5, 95 %, 12-way Bonferroni)
    assert wa.max_reachable_lower_bound(100, 0.05, DELTA) == pytest.approx(2.87, abs=0.01)
    assert reachable == pytest.approx(5.09, abs=0.01)


def test_a_perfect_scorer_reaches_the_white_box_grid_bound_on_a_real_half_draw():
    # The (m/2, m/2) choice needs exactly m/2 canaries in; the white-box grid's (45 %, 45 %) does not.
    m = 10_000
    grid = wa.whitebox_k_grid(m)
    assert len(grid) == 12 and (4500, 4500) in grid and max(a + b for a, b in grid) == 9000
    for seed in range(3):
        included = audit.draw_inclusion(m, np.random.default_rng(seed))
        perfect = audit.audit_best_of(included.astype(float), included, grid, beta=0.05, delta=DELTA)
        assert perfect["accuracy"] == 1.0
        assert perfect["epsilon_lower_bound"] == pytest.approx(wa.max_reachable_lower_bound(m, 0.05, DELTA, grid))
    assert wa.max_reachable_lower_bound(m, 0.05, DELTA, grid) == pytest.approx(5.51, abs=0.01)


# ------------------------------------------------------------------------------ positive controls
def test_positive_control_a_noise_off_exceeds_the_claimed_epsilon(data):
    res = _audit(data, noise_multiplier=SIGMA_MID, canaries=2000, noise_scale=0.0, seed=11,
                 return_arrays=True)
    assert res["noise_multiplier_applied"] == wb.NOISE_OFF and res["sigma_claimed"] == SIGMA_MID
    assert res["q"] == pytest.approx(0.1) and res["steps"] == STEPS
    # what the probe saw is the real clipped sums plus the canaries, no noise: ‖g_t‖ ≤ b_t·C
    residual = res["observed"].astype(np.float64) - res["canary_sums"]
    assert np.sum(residual ** 2) <= np.sum(res["batch_sizes"].astype(float) ** 2) * 1.0 ** 2
    assert res["epsilon_upper_bound"] == pytest.approx(2.757, abs=0.01)
    assert res["epsilon_lower_bound"] > res["epsilon_upper_bound"], res
    assert not res["consistent"]
    with pytest.raises(audit.AuditInconsistencyError):
        audit.assert_audit_consistent(res["epsilon_lower_bound"], res["epsilon_upper_bound"])
    assert res["epsilon_lower_bound"] <= res["max_reachable_lower_bound"] + 1e-9


def test_positive_control_b_noise_too_small_by_sqrt_pt_is_detected_with_1e4_canaries(data):
    # A √(P·T) normalisation bug at P·T = 9: the applied noise is σ/3 while the ledger claims σ.
    res = _audit(data, noise_multiplier=SIGMA_LOW, canaries=10_000, noise_scale=1.0 / 3.0, seed=12)
    assert res["noise_multiplier_applied"] == pytest.approx(1.0) and res["canaries"] == 10_000
    assert res["epsilon_upper_bound"] == pytest.approx(1.065, abs=0.01)
    assert res["epsilon_lower_bound"] > res["epsilon_upper_bound"], res
    assert res["max_reachable_lower_bound"] == pytest.approx(5.51, abs=0.01)  # white-box grid, m = 10⁴


@pytest.mark.parametrize("seed,accumulation", [(0, 1), (1, 1), (2, 2)])
def test_positive_control_c_the_honest_run_stays_below_the_claimed_epsilon(data, seed, accumulation):
    res = _audit(data, noise_multiplier=SIGMA_MID, canaries=2000, seed=seed, accumulation_steps=accumulation,
                 return_arrays=True)
    assert res["noise_multiplier_applied"] == SIGMA_MID and res["consistent"]
    assert 0.0 <= res["epsilon_lower_bound"] <= res["epsilon_upper_bound"], res
    # The probe sees the noise of the claimed σ: mean square of g̃_t − canary sums over T·d'
    # values = σ²C² (χ² law: relative sd √(2/(T·d'))) + the real clipped sums' share
    # (≤ Σ b_t² C² / (T·d'), a stated bias bound), at 5 sd.
    residual = res["observed"].astype(np.float64) - res["canary_sums"]
    count = residual.size
    bias = np.sum(res["batch_sizes"].astype(float) ** 2) / count / SIGMA_MID ** 2
    ratio = np.mean(residual ** 2) / SIGMA_MID ** 2
    sd = math.sqrt(2.0 / count)
    cross = 10 * math.sqrt(bias / count)  # 5 sd of 2Σ⟨g_t, z_t⟩ / (T·d'·σ²C²)
    assert 1.0 - 5 * sd - cross <= ratio <= 1.0 + 5 * sd + bias + cross, (ratio, sd, bias)
    # Included canaries take part in Binomial(T, q) steps: mean q·T (binomial law, 5 sd).
    n_in = res["canaries_included"]
    assert abs(res["canary_participations"] - 0.1 * STEPS) <= 5 * math.sqrt(STEPS * 0.1 * 0.9 / n_in)
    assert 900 <= n_in <= 1100  # Binomial(2000, ½): ± 4.5 sd


def test_report_scores_the_same_run_before_the_noise_as_its_positive_control(data):
    with pytest.raises(ValueError, match="noise_scale"):
        wb.whitebox_audit_report(noise_scale=0.5)
    ids, spec = data
    res = wb.whitebox_audit_report(token_ids=ids, spec=spec, batch_size=BATCH, steps=STEPS, delta=DELTA,
                                   noise_multiplier=SIGMA_MID, canaries=2000, seed=3)
    # one run: the honest bound holds, the noise-off reading of the same run refutes the claim
    assert res["noise_multiplier_applied"] == SIGMA_MID
    assert 0.0 <= res["epsilon_lower_bound"] <= res["epsilon_upper_bound"] == pytest.approx(2.757, abs=0.01)
    assert res["positive_control_lower_bound"] > res["epsilon_upper_bound"], res
    assert res["positive_control_exceeds_upper_bound"]
    assert res["positive_control_lower_bound"] <= res["max_reachable_lower_bound"] + 1e-9
    assert "positive_control" in res["seconds"]

