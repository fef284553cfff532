"""Patients and their split: who is trained on, who is held out.

The trainers hold patients out of pre-training (``membership.holdout_patient_fraction``) and the
membership-inference evaluator recomputes the same split from the seed recorded on the model: both
use :func:`split_patients` over :func:`patient_key`, here in the data layer so that training does
not import an evaluator.

:func:`split_patients` ranks the distinct patient keys by SHA-256(seed, key) and takes the first
``round(train_fraction · P)`` as training patients: deterministic from the seed, independent of
the order in which tuples are read and of duplicates. :func:`patient_key` is the key both use (the
patient id, or ``doc:<doc_id>`` for a tuple without one).
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Hashable, Optional, Sequence

import numpy as np

DEFAULT_TRAIN_FRACTION = 0.7


def patient_key(word_tuple) -> str:
    """The unit the split is made on: the tuple's patient id, or ``doc:<doc_id>`` without one."""
    pid = getattr(word_tuple, "patient_id", None)
    return str(pid) if pid else f"doc:{word_tuple.doc_id}"


def admission_key(word_tuple) -> Optional[str]:
    """(patient, admission) as one key (admission ids need not be unique across patients)."""
    aid = getattr(word_tuple, "admission_id", None)
    return f"{patient_key(word_tuple)}\x1f{aid}" if aid else None


@dataclasses.dataclass(frozen=True)
class PatientSplit:
    """Training patients (used for pre-training) and out-of-training (OOT) patients."""

    train: frozenset
    oot: frozenset
    train_fraction: float
    seed: int

    def is_train(self, patient_ids: Sequence[Hashable]) -> np.ndarray:
        """Boolean ``[n]``: True where the sample's patient is a training patient. A patient in
        neither set (not seen when the split was made) raises ``KeyError``."""
        out = np.empty(len(patient_ids), dtype=bool)
        for i, p in enumerate(patient_ids):
            if p in self.train:
                out[i] = True
            elif p in self.oot:
                out[i] = False
            else:
                raise KeyError("a patient is in neither side of the split")
        return out


def _rank_key(seed: int, patient: Hashable) -> bytes:
    return hashlib.sha256(f"dpbert.membership/{int(seed)}/{patient}".encode("utf-8")).digest()


def split_patients(patient_ids: Sequence[Hashable], train_fraction: float = DEFAULT_TRAIN_FRACTION,
                   seed: int = 0) -> PatientSplit:
    """Split the distinct patients: ``round(train_fraction · P)`` training patients, the rest OOT.

    Deterministic from ``seed`` and the SET of patients (order and repetitions of
    ``patient_ids`` — one entry per tuple is fine — do not matter). ``None`` ids are refused: use
    :func:`patient_key`.
    """
    if not 0.0 < float(train_fraction) <= 1.0:
        raise ValueError(f"train_fraction must be in (0, 1], got {train_fraction!r}")
    patients = set()
    for p in patient_ids:
        if p is None:
            raise ValueError("patient ids must not be None (use splits.patient_key)")
        patients.add(p)
    if not patients:
        raise ValueError("no patient to split")
    ranked = sorted(patients, key=lambda p: (_rank_key(seed, p), str(p)))
    n_train = int(math.floor(float(train_fraction) * len(ranked) + 0.5))
    return PatientSplit(train=frozenset(ranked[:n_train]), oot=frozenset(ranked[n_train:]),
                        train_fraction=float(train_fraction), seed=int(seed))


__all__ = ["DEFAULT_TRAIN_FRACTION", "PatientSplit", "admission_key", "patient_key", "split_patients"]
