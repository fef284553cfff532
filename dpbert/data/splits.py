"""Patients and their split: who is trained on, who is held out.

The trainers hold patients out of pre-training (``membership.holdout_patient_fraction`` = f) and the
membership-inference evaluator recomputes the same split: both use :func:`split_patients` over
:func:`patient_key`, here in the data layer so that training does not import an evaluator.

The decision is made PER PATIENT, from secret randomness (a keyed PRF), never by rank:

    member(p)  ⇔  HMAC-SHA256(key, p) / 2²⁵⁶ < 1 − f

``key`` is 32 bytes from OS entropy, drawn by the ingestion WITHOUT looking at the data and kept
only in the private WordTuples artifact (``holdout_key.json``, mode 0600; the model artifacts carry
a fingerprint, so the DP and the non-private trainers can be checked to share it).

Why the neighbouring relation stays "one unit": patient p's membership is a function of (key, p)
alone. For neighbouring corpora D and D′ = D + u (u one tuple, of a new or an existing patient),
Filter_key(D′) is Filter_key(D) or Filter_key(D) + u — no other tuple enters or leaves — and the
key is independent of the data, so training on Filter_key(D) inherits the trainer's (ε, δ) for
one unit (the same argument for a patient unit: adding patient u adds u's tuples or nothing). The
old split ranked every patient by a public-seed hash and kept the first round((1 − f)·P): adding
one patient moved the cut and another patient's k tuples entered or left training (335 of 1,000
new ids at P = 250), so neighbouring training sets differed by 1 + k tuples.

The fraction trained on is Binomial, not exactly 1 − f; planning uses a public n·(1 − f)
(``dpbert.privacy.plan``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import secrets
from typing import Hashable, Optional, Sequence

import numpy as np

from dpbert import storage

HOLDOUT_KEY_FILE = "holdout_key.json"


def patient_key(word_tuple) -> str:
    """The unit the split is made on: the tuple's patient id, or ``doc:<doc_id>`` without one."""
    pid = getattr(word_tuple, "patient_id", None)
    return str(pid) if pid else f"doc:{word_tuple.doc_id}"


def admission_key(word_tuple) -> Optional[str]:
    """(patient, admission) as one key (admission ids need not be unique across patients)."""
    aid = getattr(word_tuple, "admission_id", None)
    return f"{patient_key(word_tuple)}\x1f{aid}" if aid else None


def new_holdout_key() -> bytes:
    """32 bytes from the OS CSPRNG (drawn before any data is read)."""
    return secrets.token_bytes(32)


def write_holdout_key(directory: str, key: Optional[bytes] = None) -> bytes:
    """Store the key in a private artifact directory (mode 0600); returns it."""
    key = new_holdout_key() if key is None else key
    storage.write_text(storage.join(directory, HOLDOUT_KEY_FILE), json.dumps({"key": key.hex()}), private=True)
    return key


def read_holdout_key(directory: str) -> bytes:
    try:
        return bytes.fromhex(storage.read_json(storage.join(directory, HOLDOUT_KEY_FILE))["key"])
    except FileNotFoundError:
        raise FileNotFoundError(f"no holdout key in {directory} (written by the ingestion); re-run the "
                                f"pipeline from ingestion") from None


def key_fingerprint(key: bytes) -> str:
    """A public 16-hex-digit fingerprint of the key (which split a model used; reveals nothing)."""
    return hashlib.sha256(b"dpbert.holdout-fingerprint/" + key).hexdigest()[:16]


def is_member(patient: Hashable, key: bytes, train_fraction: float) -> bool:
    """HMAC-SHA256(key, patient) / 2²⁵⁶ < train_fraction: patient p's decision uses p and the key only."""
    digest = hmac.new(key, str(patient).encode("utf-8"), hashlib.sha256).digest()
    return int.from_bytes(digest, "big") < int(float(train_fraction) * (1 << 256))


@dataclasses.dataclass(frozen=True)
class PatientSplit:
    """Training patients (used for pre-training) and out-of-training (OOT) patients."""

    train: frozenset
    oot: frozenset
    train_fraction: float
    key_id: str

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


def split_patients(patient_ids: Sequence[Hashable], train_fraction: float, key: bytes) -> PatientSplit:
    """Each distinct patient is a training patient iff :func:`is_member` (independently of the
    others). Order and repetitions of ``patient_ids`` do not matter. ``None`` ids are refused:
    use :func:`patient_key`."""
    if not 0.0 < float(train_fraction) <= 1.0:
        raise ValueError(f"train_fraction must be in (0, 1], got {train_fraction!r}")
    if not isinstance(key, bytes) or len(key) < 16:
        raise ValueError("key must be at least 16 secret bytes (splits.new_holdout_key)")
    patients = set()
    for p in patient_ids:
        if p is None:
            raise ValueError("patient ids must not be None (use splits.patient_key)")
        patients.add(p)
    if not patients:
        raise ValueError("no patient to split")
    train = frozenset(p for p in patients if is_member(p, key, train_fraction))
    return PatientSplit(train=train, oot=frozenset(patients - train), train_fraction=float(train_fraction),
                        key_id=key_fingerprint(key))


__all__ = ["HOLDOUT_KEY_FILE", "PatientSplit", "admission_key", "is_member", "key_fingerprint",
           "new_holdout_key", "patient_key", "read_holdout_key", "split_patients", "write_holdout_key"]
