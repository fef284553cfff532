"""The DP readout (dpbert.evaluate.readout, dpbert.privacy.gaussian_sum), without training.

(a) the released noise's empirical std over many seeded draws is the claimed z·c (and z for the
count), within the chi-square's 1e-4 / 1 − 1e-4 quantiles; a release whose noise is 15 % larger is
caught by the same check. (b) one unit moves the pre-noise sum by at most c — a unit with a huge
loss included — and a readout without the clip (a broken fixture) is caught moving it by far more;
adding a patient's tuples changes no other unit's rows or masks. (c) the interval, the Bonferroni
box with a DP count, the verdicts, and the ε → noise conversion through dpbert.accounting."""
import math

import numpy as np
import pytest
from scipy.stats import chi2

from dpbert.data.tuples import WordTuple
from dpbert.evaluate import readout
from dpbert.privacy import gaussian_sum

DRAWS = 4000


def std_within_chi_square(samples, claimed_std, tail=1e-4) -> bool:
    """(n − 1)·s²/σ² ~ χ²(n − 1) when the noise is N(0, σ²): False outside its [tail, 1 − tail]
    quantiles."""
    n = len(samples)
    statistic = (n - 1) * np.var(samples, ddof=1) / claimed_std ** 2
    return bool(chi2.ppf(tail, n - 1) <= statistic <= chi2.ppf(1 - tail, n - 1))


def _noise(release, z_sum, z_count, clip, seed=7):
    rng = np.random.default_rng(seed)
    values = np.array([0.3, -2.0, 5.0, -0.1])  # clipped sum at c = 1: 0.3 − 1 + 1 − 0.1 = 0.2
    out = [release(values, clip, z_sum, z_count, rng) for _ in range(DRAWS)]
    return (np.array([o["sum"] for o in out]) - 0.2, np.array([o["count"] for o in out]) - 4, out[0])


def test_a_the_noise_std_is_the_claimed_one():
    sums, counts, first = _noise(gaussian_sum.release, 3.0, 5.0, 1.0)
    assert (first["sum_std"], first["count_std"]) == (3.0, 5.0)
    assert std_within_chi_square(sums, first["sum_std"]) and std_within_chi_square(counts, first["count_std"])
    assert abs(sums.mean()) < 4 * 3.0 / math.sqrt(DRAWS) and abs(counts.mean()) < 4 * 5.0 / math.sqrt(DRAWS)


def test_a_control_a_release_whose_noise_is_larger_than_claimed_is_caught():
    def louder(values, clip, z_sum, z_count, rng):
        out = gaussian_sum.release(values, clip, z_sum * 1.15, z_count, rng)
        return dict(out, sum_std=z_sum * clip)  # claims the std it was asked for

    sums, _, first = _noise(louder, 3.0, 5.0, 1.0)
    assert not std_within_chi_square(sums, first["sum_std"])


# ------------------------------------------------------------------ (b) sensitivity
def _clipped_sum(start, model, weights, unit_index, units, clip):
    return float(gaussian_sum.clip(readout.unit_differences(start, model, weights, unit_index, units), clip).sum())


def _unclipped_sum(start, model, weights, unit_index, units, clip):
    """A broken readout: the same differences, summed without the clip."""
    return float(readout.unit_differences(start, model, weights, unit_index, units).sum())


def sensitivity_holds(sum_of, clip=0.5) -> bool:
    """|sum(D + u) − sum(D)| ≤ c for u a patient whose model loss is huge (and one whose is tiny)."""
    rng = np.random.default_rng(1)
    start, model = rng.uniform(2, 6, (6, 3)), rng.uniform(2, 6, (6, 3))
    weights, index = np.ones((6, 3)), np.array([0, 0, 1, 2, 2, 2])
    base = sum_of(start, model, weights, index, 3, clip)
    for loss in (1e6, 0.0):
        s = np.vstack([start, [[3.0, 3.0, 3.0]]])
        m = np.vstack([model, [[loss, loss, loss]]])
        moved = sum_of(s, m, np.ones((7, 3)), np.append(index, 3), 4, clip) - base
        if abs(moved) > clip * (1 + 1e-12):
            return False
    return True


def test_b_one_unit_moves_the_released_sum_by_at_most_c():
    assert sensitivity_holds(_clipped_sum)


def test_b_control_a_readout_without_the_clip_is_caught():
    assert not sensitivity_holds(_unclipped_sum)


def _tokenizer(tmp_path):
    from dpbert.vocab import wordpiece

    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "fever", "cough",
                                                   "rash", "heart", "rate", "the", "of"]) + "\n")
    return wordpiece.load_tokenizer(tmp_path)


def _tuples(patients, per_patient=3):
    words = ("fever", "cough", "rash", "heart", "rate", "the", "of")
    return [WordTuple(f"{p}-note", i, tuple(words[(i + j + len(p)) % 7] for j in range(8)), patient_id=p)
            for p in patients for i in range(per_patient)]


def test_b_adding_a_patient_changes_no_other_units_rows_or_masks(tmp_path):
    tokenizer = _tokenizer(tmp_path)
    key = b"k" * 32
    kwargs = dict(fraction=0.5, key=key, patient_unit=True, max_tuples=2)
    before = readout.heldout_units(_tuples([f"p{i}" for i in range(12)]), tokenizer, 12, **kwargs)
    after = readout.heldout_units(_tuples([f"p{i}" for i in range(12)] + ["new"]), tokenizer, 12, **kwargs)
    assert 0 < before.units < 12 and after.units in (before.units, before.units + 1)
    masks = [readout.masked(u, range(5), 4, 2, 0.15) for u in (before, after)]
    rows = {r: i for i, r in enumerate(after.record_ids)}
    for i, record in enumerate(before.record_ids):
        j = rows[record]
        assert np.array_equal(before.token_ids[i], after.token_ids[j])
        assert np.array_equal(masks[0]["input_ids"][i], masks[1]["input_ids"][j])
    # at most max_tuples rows per unit, every unit's rows its own patient's
    assert np.bincount(before.unit_index).max() <= 2


# ------------------------------------------------------------------ (c) interval, verdict, ε → noise
def test_c_the_interval_and_the_verdict():
    declared = readout.estimate({"sum": 10.0, "sum_std": 2.0, "count": None, "count_std": None}, 20)
    assert declared["estimate"] == 0.5 and declared["divisor_source"] == "declared"
    assert declared["low"] == pytest.approx((10 - 1.959964 * 2) / 20, abs=1e-6)
    assert declared["verdict"].startswith("learned")
    unsure = readout.estimate({"sum": 1.0, "sum_std": 2.0, "count": None, "count_std": None}, 20)
    assert unsure["low"] < 0 < unsure["high"] and unsure["verdict"].startswith("cannot tell")
    worse = readout.estimate({"sum": -10.0, "sum_std": 2.0, "count": None, "count_std": None}, 20)
    assert worse["verdict"] == "worse than its start"
    # a DP count: each coordinate at 97.5 %, the range of S/n over the box
    counted = readout.estimate({"sum": 10.0, "sum_std": 2.0, "count": 20.0, "count_std": 3.0}, None)
    q = 2.241403
    assert counted["low"] == pytest.approx((10 - q * 2) / (20 + q * 3), abs=1e-5)
    assert counted["high"] == pytest.approx((10 + q * 2) / (20 - q * 3), abs=1e-5)


def test_c_the_noise_meets_epsilon_through_the_accounting():
    import dp_accounting

    from dpbert.accounting.epsilon import epsilon

    z_sum, z_count = readout.noise_for(1.0, 1e-6, False)
    assert z_count is None and epsilon(dp_accounting.GaussianDpEvent(z_sum), 1e-6, "pld") <= 1.0
    assert epsilon(dp_accounting.GaussianDpEvent(z_sum * 0.99), 1e-6, "pld") > 1.0
    pair = readout.noise_for(1.0, 1e-6, True)
    records = gaussian_sum.records(*pair, unit="patient")
    composed = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(r["noise_multiplier"]) for r in records])
    assert epsilon(composed, 1e-6, "pld") == pytest.approx(epsilon(dp_accounting.GaussianDpEvent(z_sum), 1e-6, "pld"))
    assert {r["stage"] for r in records} == {"readout"} and gaussian_sum.combined(*pair) == pytest.approx(z_sum)
