"""White-box one-run audit of DP-SGD, the math (dpbert.privacy.whitebox_audit): canary algebra, the
LLR scores and the audit's power. The harness on the SHIPPED training loop, its positive controls
and its honest runs are tests/evaluate/test_audit_shipped_loop.py.

Tolerances: exact identities to 1e-12 (float64) or 1e-5 (the float32 canary sums).
"""
import functools
import math

import numpy as np
import pytest

from dpbert.privacy import one_run_audit as audit
from dpbert.privacy import whitebox_audit as wa

DELTA = 1e-5


@pytest.fixture
def bound_computed_once_per_arguments(monkeypatch):
    """``epsilon_lower_bound`` memoised on its arguments for one test. The power tests reach the
    same bounds three ways (the formula, ``max_reachable_lower_bound``, ``audit_best_of`` on a
    perfect scorer); equal results still need equal (r, v, β/K, δ, m), and each is computed once."""
    monkeypatch.setattr(audit, "epsilon_lower_bound", functools.lru_cache(maxsize=None)(audit.epsilon_lower_bound))


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


def test_max_reachable_lower_bound_is_the_bound_with_every_guess_right(bound_computed_once_per_arguments):
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
    # the black-box grid's figures (δ = 1e-5, 95 %, 12-way Bonferroni; docs/audits.md quotes the 2.87)
    assert wa.max_reachable_lower_bound(100, 0.05, DELTA) == pytest.approx(2.87, abs=0.01)
    assert reachable == pytest.approx(5.09, abs=0.01)


@pytest.mark.parametrize("m, bound", [(2000, 5.50), pytest.param(10_000, 5.51, marks=pytest.mark.slow)])
def test_a_perfect_scorer_reaches_the_white_box_grid_bound_on_a_real_half_draw(m, bound,
                                                                                bound_computed_once_per_arguments):
    # The (m/2, m/2) choice needs exactly m/2 canaries in; the white-box grid's (45 %, 45 %) does not.
    # m = 2000: 1007 canaries in; (900, 900) is all right while 900 <= in <= 1100 (4.5 sd of the draw).
    grid = wa.whitebox_k_grid(m)
    assert len(grid) == 12 and (m * 45 // 100, m * 45 // 100) in grid and max(a + b for a, b in grid) == m * 90 // 100
    included = audit.draw_inclusion(m, np.random.default_rng(0))  # one real draw: in != m/2
    assert included.sum() != m // 2
    perfect = audit.audit_best_of(included.astype(float), included, grid, beta=0.05, delta=DELTA)
    assert perfect["accuracy"] == 1.0
    assert perfect["epsilon_lower_bound"] == pytest.approx(wa.max_reachable_lower_bound(m, 0.05, DELTA, grid))
    # the figures docs/audits.md quotes (white-box grid, δ = 1e-5, 95 %)
    assert wa.max_reachable_lower_bound(m, 0.05, DELTA, grid) == pytest.approx(bound, abs=0.01)
