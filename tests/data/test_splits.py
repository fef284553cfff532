"""dpbert.data.splits: the patient split the trainer holds out and membership inference recomputes."""
import numpy as np
import pytest

from dpbert.data import splits


def test_split_patients_is_deterministic_70_30_and_order_free():
    patients = [f"patient-{i}" for i in range(1000)]
    per_tuple = [p for p in patients for _ in range(3)]  # one entry per tuple
    split = splits.split_patients(per_tuple, seed=11)
    assert (len(split.train), len(split.oot)) == (700, 300)
    assert split.train | split.oot == set(patients) and not split.train & split.oot
    shuffled = list(np.random.default_rng(0).permutation(per_tuple))
    assert splits.split_patients(shuffled, 0.7, seed=11) == split
    assert splits.split_patients(patients, 0.7, seed=12).train != split.train
    # round(0.7 · 7) = 5 training patients
    assert len(splits.split_patients(patients[:7], 0.7, seed=0).train) == 5
    mask = split.is_train(per_tuple)
    assert mask.sum() == 2100 and all(mask[i] == (per_tuple[i] in split.train) for i in range(0, 3000, 97))
    with pytest.raises(KeyError):
        split.is_train(["someone else"])
    with pytest.raises(ValueError):
        splits.split_patients(["a", None])
    with pytest.raises(ValueError):
        splits.split_patients(["a"], train_fraction=0.0)


def test_patient_and_admission_keys():
    from dpbert.data.tuples import WordTuple

    t = WordTuple(doc_id="d1", index=0, words=("x",), patient_id="p1", admission_id="a1")
    bare = WordTuple(doc_id="d2", index=0, words=("x",))
    assert splits.patient_key(t) == "p1" and splits.patient_key(bare) == "doc:d2"
    assert splits.admission_key(bare) is None
    other = WordTuple(doc_id="d3", index=0, words=("x",), patient_id="p2", admission_id="a1")
    assert splits.admission_key(t) != splits.admission_key(other)  # admission ids need not be unique

