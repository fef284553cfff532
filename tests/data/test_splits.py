"""dpbert.data.splits: the patient split the trainer holds out and membership inference recomputes."""
import numpy as np
import pytest

from dpbert.data import splits


KEY = bytes(range(32))


def test_split_patients_is_per_patient_keyed_and_order_free():
    patients = [f"patient-{i}" for i in range(1000)]
    per_tuple = [p for p in patients for _ in range(3)]  # one entry per tuple
    split = splits.split_patients(per_tuple, 0.7, KEY)
    # Binomial(1000, 0.7): within 4 standard deviations of 700
    assert abs(len(split.train) - 700) < 4 * (1000 * 0.21) ** 0.5
    assert split.train | split.oot == set(patients) and not split.train & split.oot
    shuffled = list(np.random.default_rng(0).permutation(per_tuple))
    assert splits.split_patients(shuffled, 0.7, KEY) == split
    assert splits.split_patients(patients, 0.7, bytes(32)).train != split.train  # another key
    mask = split.is_train(per_tuple)
    assert all(mask[i] == (per_tuple[i] in split.train) for i in range(0, 3000, 97))
    assert split.key_id == splits.key_fingerprint(KEY) and KEY.hex() not in split.key_id
    with pytest.raises(KeyError):
        split.is_train(["someone else"])
    with pytest.raises(ValueError):
        splits.split_patients(["a", None], 0.7, KEY)
    with pytest.raises(ValueError):
        splits.split_patients(["a"], 0.0, KEY)


@pytest.mark.parametrize("count", [250, 251])
def test_adding_a_patient_never_changes_another_patients_membership(count):
    """Property test over random new ids (the review measured 335/1000 moves with the rank split)."""
    rng = np.random.default_rng(count)
    patients = [f"p{i}" for i in range(count)]
    base = splits.split_patients(patients, 0.7, KEY)
    for _ in range(300):
        new = f"new-{rng.integers(1 << 40)}"
        grown = splits.split_patients(patients + [new], 0.7, KEY)
        assert grown.train - {new} == base.train and grown.oot - {new} == base.oot


def _rank_split(patients, fraction, seed=0):
    """Positive control: the old rank-based split (a data-dependent cut)."""
    import hashlib

    ranked = sorted(set(patients), key=lambda p: hashlib.sha256(f"{seed}/{p}".encode()).digest())
    return set(ranked[:int(fraction * len(ranked) + 0.5)])


def test_positive_control_a_rank_split_moves_other_patients():
    patients = [f"p{i}" for i in range(250)]
    base = _rank_split(patients, 0.7)
    moved = sum(_rank_split(patients + [f"new-{i}"], 0.7) - {f"new-{i}"} != base for i in range(200))
    assert moved > 20


def test_holdout_key_file_is_private_and_round_trips(tmp_path):
    import os
    import stat

    key = splits.write_holdout_key(str(tmp_path))
    assert len(key) == 32 and splits.read_holdout_key(str(tmp_path)) == key
    assert stat.S_IMODE(os.stat(tmp_path / splits.HOLDOUT_KEY_FILE).st_mode) == 0o600
    with pytest.raises(FileNotFoundError, match="holdout key"):
        splits.read_holdout_key(str(tmp_path / "missing"))


def test_patient_and_admission_keys():
    from dpbert.data.tuples import WordTuple

    t = WordTuple(doc_id="d1", index=0, words=("x",), patient_id="p1", admission_id="a1")
    bare = WordTuple(doc_id="d2", index=0, words=("x",))
    assert splits.patient_key(t) == "p1" and splits.patient_key(bare) == "doc:d2"
    assert splits.admission_key(bare) is None
    other = WordTuple(doc_id="d3", index=0, words=("x",), patient_id="p2", admission_id="a1")
    assert splits.admission_key(t) != splits.admission_key(other)  # admission ids need not be unique

