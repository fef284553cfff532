import math

import numpy as np
import pytest
from scipy import stats

from dpbert.mechanism import sampling


def test_poisson_mean_batch_size_within_binomial_tolerance():
    n, q, draws = 5000, 0.01, 400
    sampler = sampling.PoissonSampler(n, q, seed=1)
    sizes = np.array([len(sampler.sample()) for _ in range(draws)])
    assert abs(sizes.mean() - n * q) <= sampling.poisson_size_tolerance(n, q, draws)
    # Var of Binomial(n, q) = nq(1-q); the sample variance's relative s.e. is ≈ sqrt(2/(draws-1)).
    assert abs(sizes.var(ddof=1) / (n * q * (1 - q)) - 1) <= 4 * math.sqrt(2 / (draws - 1))


def test_poisson_uses_the_given_q_whatever_n():
    # q planned for n_planned = 1000 (B = 10), but the data has n = 3000: E[batch] = q·n = 30.
    sampler = sampling.PoissonSampler(3000, 10 / 1000, seed=2)
    sizes = np.array([len(sampler.sample()) for _ in range(300)])
    assert abs(sizes.mean() - 30) <= sampling.poisson_size_tolerance(3000, 0.01, 300)


def test_poisson_inclusion_is_uniform_and_without_duplicates():
    n, q, draws = 50, 0.2, 2000
    sampler = sampling.PoissonSampler(n, q, seed=3)
    counts = np.zeros(n)
    for _ in range(draws):
        batch = sampler.sample()
        assert len(np.unique(batch)) == len(batch)
        counts[batch] += 1
    # Each example's inclusion count ~ Binomial(draws, q): chi-square goodness of fit.
    chi2 = np.sum((counts - draws * q) ** 2 / (draws * q * (1 - q)))
    assert stats.chi2.sf(chi2, n) > 1e-4


def test_entropy_seeded_samplers_differ():
    a, b = sampling.PoissonSampler(10000, 0.01), sampling.PoissonSampler(10000, 0.01)
    assert not np.array_equal(a.sample(), b.sample())


def test_shuffle_fixed_size_epochs():
    sampler = sampling.ShuffleSampler(10, 4, key=0)
    batches = [sampler.sample(step) for step in range(5)]
    assert all(len(b) == 4 for b in batches)
    assert sorted(np.concatenate(batches)[:10]) == list(range(10))  # first epoch covers everything
    assert sampler.mode == "shuffle" and sampler.q == 0.4


def _max_participations(batches):
    return int(np.bincount(np.concatenate(batches)).max())


@pytest.mark.parametrize("n, batch, steps, stop", [(1000, 100, 10, 5), (20, 6, 9, 4), (7, 3, 11, 2)])
def test_shuffle_resume_mid_epoch_never_exceeds_charged_participations(n, batch, steps, stop):
    """Preempted at step ``stop`` and resumed in a new process (new sampler, same stored key): the
    stream continues, so no example is used more often than the accountant's participations."""
    from dpbert.privacy.events import shuffle_participations

    charged, straddling = shuffle_participations(steps, batch / n)
    first = sampling.ShuffleSampler(n, batch, key=42)
    resumed = sampling.ShuffleSampler(n, batch, key=42)
    batches = [first.sample(s) for s in range(stop)] + [resumed.sample(s) for s in range(stop, steps)]
    uninterrupted = sampling.ShuffleSampler(n, batch, key=42)
    np.testing.assert_array_equal(np.concatenate(batches),
                                  np.concatenate([uninterrupted.sample(s) for s in range(steps)]))
    assert _max_participations(batches) <= charged * (2 if straddling else 1)


def test_positive_control_restarting_the_permutation_at_resume_over_uses_examples():
    """The old behaviour (a fresh permutation stream after a resume) fails the same check."""
    from dpbert.privacy.events import shuffle_participations

    n, batch, steps, stop = 1000, 100, 10, 5
    charged, _ = shuffle_participations(steps, batch / n)
    before = sampling.ShuffleSampler(n, batch, key=1)
    after = sampling.ShuffleSampler(n, batch, key=2)  # restarted: step numbering from 0 again
    batches = [before.sample(s) for s in range(stop)] + [after.sample(s) for s in range(steps - stop)]
    assert _max_participations(batches) > charged


def test_pack_rounds_pads_and_never_drops():
    data = np.arange(1, 23 * 3 + 1, dtype=np.int32).reshape(23, 3)
    idx = np.array([0, 5, 7, 9, 10, 22, 3])
    rounds = sampling.pack_rounds(data, idx, micro_batch=2, replicas=2)
    assert len(rounds) == 2  # ceil(7 / (2·2))
    feats = np.concatenate([r["features"].reshape(-1, 3) for r in rounds])
    mask = np.concatenate([r["example_mask"].ravel() for r in rounds])
    assert mask.sum() == 7
    np.testing.assert_array_equal(feats[mask == 1], data[idx])
    assert np.all(feats[mask == 0] == 0)  # padded rows are pad id 0
    assert rounds[0]["features"].shape == (2, 2, 3) and rounds[0]["example_mask"].shape == (2, 2)
    empty = sampling.pack_rounds(data, np.array([], np.int64), 2, 2)
    assert len(empty) == 1 and empty[0]["example_mask"].sum() == 0  # an empty batch still steps
    with pytest.raises(sampling.PoissonOverflowError):
        sampling.pack_rounds(data, np.arange(9), 2, 2, max_rounds=2)


def test_poisson_batch_cap_tail():
    n, q, p_fail = 100000, 64 / 100000, 1e-9
    cap = sampling.poisson_batch_cap(n, q, p_fail, multiple=8)
    assert cap % 8 == 0
    assert stats.binom.sf(cap, n, q) <= p_fail < stats.binom.sf(cap - 8, n, q)
    k = (cap - 64) / math.sqrt(64)
    assert 5 < k < 9  # B + k√B with k ≈ sqrt(2 ln(1/p_fail)) + correction


def test_micro_batch_size():
    assert sampling.micro_batch_size(64, 2, 4) == 8
    with pytest.raises(ValueError):
        sampling.micro_batch_size(10, 2, 4)
