"""The dχ mechanism: noise distribution, nearest neighbours, special tokens, the privacy bound."""
import math

import numpy as np
import pytest
from scipy import stats

from dpbert.local_privacy.dchi import (DchiMechanism, check_eta, expected_noise_norm, make_rng, noise_norm_std,
                                       sample_noise, special_ids_of)
from tests.local_privacy.conftest import TOY_TOKENS, many_tokens

D, ETA, N = 16, 4.0, 20000


@pytest.fixture(scope="module")
def noise():
    return sample_noise(N, D, ETA, make_rng(7))


def test_noise_norm_is_gamma_d_over_eta(noise):
    norms = np.linalg.norm(noise, axis=1)
    mean, sd = expected_noise_norm(D, ETA), noise_norm_std(D, ETA)
    assert (mean, sd) == (D / ETA, math.sqrt(D) / ETA)
    # The sample mean of n Gamma(d, 1/η) draws has standard deviation (√d/η)/√n: allow 4 of them.
    assert abs(norms.mean() - mean) < 4 * sd / math.sqrt(N)
    # Sample sd: its standard error is ≈ sd·√((κ−1)/(4n)), κ = 3 + 6/d the Gamma kurtosis.
    assert abs(norms.std() - sd) < 4 * sd * math.sqrt((2 + 6 / D) / (4 * N))
    assert stats.kstest(norms, stats.gamma(a=D, scale=1 / ETA).cdf).pvalue > 1e-3


def test_noise_direction_is_uniform(noise):
    u = noise / np.linalg.norm(noise, axis=1, keepdims=True)
    # Each coordinate of a uniform unit vector has mean 0 and variance 1/d.
    assert np.all(np.abs(u.mean(0)) < 4 / math.sqrt(D * N))
    assert np.all(np.abs(u.mean(0)) < 3 / math.sqrt(N))  # the looser bound
    assert np.allclose((u ** 2).mean(0), 1 / D, atol=4 * math.sqrt(2 / (D * D * N)) * 1.5)
    # A projection on a fixed direction: (u·v + 1)/2 ~ Beta((d−1)/2, (d−1)/2).
    v = make_rng(1).standard_normal(D)
    v /= np.linalg.norm(v)
    projection = (u @ v + 1) / 2
    assert stats.kstest(projection, stats.beta((D - 1) / 2, (D - 1) / 2).cdf).pvalue > 1e-3
    # Chi-square on the octant of the first three coordinates (8 equally likely cells).
    cells = (u[:, 0] > 0) * 4 + (u[:, 1] > 0) * 2 + (u[:, 2] > 0)
    assert stats.chisquare(np.bincount(cells, minlength=8)).pvalue > 1e-3


def test_infinite_eta_no_noise():
    assert not sample_noise(5, 3, math.inf, make_rng(0)).any()


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "x", None, True])
def test_check_eta_rejects(bad):
    with pytest.raises(ValueError):
        check_eta(bad)


def test_make_rng():
    assert make_rng(3).random() == make_rng(3).random()
    assert make_rng(None).random() != make_rng(None).random()
    with pytest.raises(ValueError):
        make_rng(-1)


def _mechanism(tokens, dim=16, seed=0, **kwargs):
    table = np.random.default_rng(seed).normal(0, 1 / math.sqrt(dim), (len(tokens), dim)).astype(np.float32)
    return DchiMechanism(table, exclude_ids=special_ids_of(tokens).tolist(), **kwargs)


def test_special_ids_of():
    assert special_ids_of(TOY_TOKENS).tolist() == [0, 1, 2, 3, 4, 5]


def test_nearest_matches_brute_force_and_chunking():
    tokens = many_tokens(300)
    mechanism = _mechanism(tokens)
    small = _mechanism(tokens, chunk_elements=1000)  # 3 query rows per block
    queries = np.random.default_rng(1).normal(0, 0.4, (257, 16)).astype(np.float32)
    distances = np.linalg.norm(queries[:, None, :] - mechanism.table[None, mechanism.candidate_ids, :], axis=-1)
    expected = mechanism.candidate_ids[distances.argmin(1)]
    assert np.array_equal(mechanism.nearest(queries), expected)
    assert np.array_equal(small.nearest(queries), expected)
    ranks = mechanism.ranks(queries, expected)
    assert np.all(ranks == 0)


def test_infinite_and_huge_eta_are_the_identity():
    tokens = many_tokens(300)
    mechanism = _mechanism(tokens)
    ids = mechanism.candidate_ids
    assert np.array_equal(mechanism.privatize_ids(ids, math.inf, make_rng(0)), ids)
    # The general path (noise + nearest neighbour) with negligible noise.
    assert np.array_equal(mechanism.privatize_ids(ids, 1e9, make_rng(0)), ids)


def test_small_eta_changes_nearly_every_token():
    tokens = many_tokens(500)
    mechanism = _mechanism(tokens)
    ids = np.tile(mechanism.candidate_ids, 4)
    out = mechanism.privatize_ids(ids, 0.5, make_rng(2))  # E‖z‖ = 32 ≫ the table's radius ≈ 1
    assert np.mean(out != ids) > 0.95


def test_special_tokens_are_never_output():
    tokens = many_tokens(50)
    mechanism = _mechanism(tokens)
    specials = special_ids_of(tokens)
    # Adversarial table: every special token sits exactly where the inputs are.
    mechanism.table[specials] = 0.0
    mechanism = DchiMechanism(mechanism.table, exclude_ids=specials.tolist())
    inputs = np.concatenate([specials, mechanism.candidate_ids])
    rng = make_rng(3)
    for eta in (math.inf, 1e6, 100.0, 10.0, 1.0, 0.1):
        out = mechanism.privatize_ids(np.tile(inputs, 20), eta, rng)
        assert not np.isin(out, specials).any(), eta
    # keep_ids are copied (framing tokens of a model input), everything else privatized.
    framed = np.array([[2, 10, 11, 3, 0, 0]])
    out = mechanism.privatize_ids(framed, 1.0, rng, keep_ids=[0, 2, 3])
    assert out[0, 0] == 2 and out[0, 3] == 3 and (out[0, 4:] == 0).all()
    out = mechanism.privatize_ids(framed, 1.0, rng, keep_ids=np.array([0, 2, 3]))
    assert out[0, 0] == 2 and out[0, 3] == 3 and (out[0, 4:] == 0).all()


def test_output_probabilities_match_laplace_and_respect_the_bound():
    """d = 1: the noise is Laplace(1/η), so P[M(x) = y] is known in closed form."""
    table = np.array([[0.0], [1.0], [3.0]], np.float32)
    mechanism = DchiMechanism(table)
    eta, n = 1.0, 200_000
    rng = make_rng(11)

    def exact(x):
        cdf = lambda t: np.where(t < 0, 0.5 * np.exp(eta * t), 1 - 0.5 * np.exp(-eta * t))  # noqa: E731
        edges = [-np.inf, 0.5 - x, 2.0 - x, np.inf]  # the Voronoi cells of 0, 1, 3, shifted by x
        return np.diff([cdf(e) if np.isfinite(e) else (0.0 if e < 0 else 1.0) for e in edges])

    probabilities = {}
    for x in range(3):
        out = mechanism.privatize_ids(np.full(n, x), eta, rng)
        empirical = np.bincount(out, minlength=3) / n
        expected = exact(float(table[x, 0]))
        assert np.allclose(empirical, expected, atol=4 * np.sqrt(expected * (1 - expected) / n) + 1e-4)
        probabilities[x] = expected
    for x in range(3):
        for y in range(3):
            bound = mechanism.privacy_loss_bound(x, y, eta)
            assert np.all(np.log(probabilities[x] / probabilities[y]) <= bound + 1e-9)


def test_noisy_embeddings_shape_and_bad_ids():
    mechanism = _mechanism(many_tokens(10))
    assert mechanism.noisy_embeddings(np.zeros((2, 3), int), 1.0, make_rng(0)).shape == (2, 3, 16)
    with pytest.raises(ValueError):
        mechanism.privatize_ids([999], 1.0, make_rng(0))
    with pytest.raises(TypeError):
        mechanism.privatize_ids([0.5], 1.0, make_rng(0))
    with pytest.raises(ValueError):
        DchiMechanism(np.zeros((3, 2)), exclude_ids=[0, 1, 2])
