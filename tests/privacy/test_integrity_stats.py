"""The p-values of the run-time integrity checks (``dpbert.privacy.integrity_stats``): valid
(P(p ≤ a) ≤ a under the null, by simulation), and small on the broken mechanisms they are for."""
import math
import zlib

import numpy as np
import pytest

from dpbert.privacy import integrity_stats as S


def test_look_levels_sum_to_alpha_over_any_number_of_looks():
    total = sum(S.look_level(1e-6, k, 4) * 4 for k in range(1, 200001))
    assert total <= 1e-6 and total == pytest.approx(1e-6, rel=1e-4)
    with pytest.raises(ValueError):
        S.look_level(1e-6, 0, 1)


@pytest.mark.parametrize("name", ["chi2", "product", "dispersion_low", "dispersion_high", "binomial"])
def test_p_values_are_valid_under_the_null(name):
    """P(p ≤ a) ≤ a (+ 3 binomial sd at the number of draws) at a = 0.01, 0.05, 0.2 over 400
    honest draws (200 for the dispersion bounds: a Chernoff minimisation each, ~5 ms)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    draws = 200 if name.startswith("dispersion") else 400
    if name == "chi2":
        p = [S.chi2_two_sided(float(np.sum(rng.normal(size=20) ** 2)), 20) for _ in range(draws)]
    elif name == "product":
        p = [S.product_sum_two_sided(float(rng.normal(size=50) @ rng.normal(size=50)), 50) for _ in range(draws)]
    elif name == "binomial":
        p = [S.binomial_two_sided(rng.binomial(640, 0.25), 640, 0.25) for _ in range(draws)]
    else:
        fn = S.dispersion_lower if name == "dispersion_low" else S.dispersion_upper
        p = [fn(rng.binomial(64, 0.25, 12), 64, 0.25) for _ in range(draws)]
    p = np.asarray(p)
    for a in (0.01, 0.05, 0.2):
        assert np.mean(p <= a) <= a + 3 * math.sqrt(a * (1 - a) / draws), (name, a, np.mean(p <= a))


def test_p_values_are_small_on_the_broken_mechanisms():
    assert S.chi2_two_sided(0.0, 16) == 0.0  # no noise on a 16-coordinate piece
    assert S.chi2_two_sided(0.25 * 1024, 1024) < 1e-100  # σ/2
    assert S.product_sum_two_sided(256.0, 256) < 1e-20  # the same z at two steps
    assert S.dispersion_lower(np.full(16, 16), 64, 0.25) < 1e-14  # fixed-size batches of nq
    assert S.dispersion_upper(np.tile([4, 28], 10), 64, 0.25) < 1e-9  # two rates mixed
    assert S.binomial_upper(16, 16, 0.25) == pytest.approx(0.25 ** 16)  # a unit in every batch
    assert S.normal_two_sided(0.0) == 1.0 and S.normal_two_sided(10.0) < 1e-20


def test_dispersion_over_a_large_population_uses_a_window():
    rng = np.random.default_rng(0)
    n, q = S.FULL_SUPPORT_MAX + 10, 1e-4
    sizes = rng.binomial(n, q, 30)
    assert S.dispersion_lower(sizes, n, q) > 1e-3 and S.dispersion_upper(sizes, n, q) > 1e-3
    assert S.dispersion_lower(np.full(30, round(n * q)), n, q) < 1e-12
