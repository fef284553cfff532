"""Batch sources: which units take part in a step (the sampler), their keyed MLM masks and the
packing into fixed-shape rounds, behind one interface (:class:`BatchSource`).

``source.rounds(step, window, local_replicas) -> (rounds, sampled_unit_indices)``:

* tuple Poisson (``sampling.PoissonSampler``): each row in with probability q at optimizer step
  ``step``; unit = row.
* tuple shuffle (``sampling.ShuffleSampler``): window ``window`` of the secret permutation stream —
  the step log's count of steps ever executed (``dpbert.engine.chain``), not ``step``, so a
  step replayed after a crash reads a NEW window.
* patient Poisson (``sampling.PatientPoissonSampler``): each patient in with probability q, with
  ≤ k of its rows chosen by a secret PRF; unit = patient. Its groups come from
  ``sampling.group_rows``, which checks them against the rows' own patient keys (one key per
  group, one group per key: ``check_patient_groups``) and refuses a grouping that splits a patient.

Each sampled row is masked by (the secret mask key, ``step``, its own record id) and packed
(``sampling.pack_rounds`` / ``pack_patient_rounds``). ``sampled_unit_indices`` are indices into
the source's units (rows, or patient groups): a probe hook sees which units took part.

The sampler is made by a factory from a :class:`SamplerSpec` (:func:`default_sampler`); tests
inject another one (e.g. PRF coins, the same batches in every worker layout) through
``build_training``'s ``RunHooks(sampler_factory=...)``. Units an audit enrols (canary rows or
patients) take part simply by building the source over the augmented rows.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Tuple

import numpy as np

from dpbert.engine import masking
from dpbert.mechanism import sampling


@dataclasses.dataclass
class SamplerSpec:
    """What a sampler factory needs. ``units``: the EXACT number of units (private); ``shard``: the
    units this worker holds (None: all); ``unit_ids``: each unit's own 64-bit id (record id, or the
    patient's sha256-derived id); ``seed``: the coins' seed (None: OS entropy)."""

    mode: str                      # "poisson" | "shuffle" | "patient"
    units: int
    q: float
    batch_size: int
    unit_ids: np.ndarray
    seed: Optional[list] = None
    shard: Optional[np.ndarray] = None
    groups: Optional[sampling.PatientGroups] = None
    k: int = 1
    choice_key: Optional[int] = None   # patient: the secret key of each patient's ≤ k rows
    shuffle_key: Optional[int] = None  # shuffle: the secret key of the permutation stream


def default_sampler(spec: SamplerSpec):
    """The production samplers: OS-entropy (or test-seeded) coins, sharded by unit."""
    if spec.mode == "patient":
        return sampling.PatientPoissonSampler(spec.groups, spec.q, spec.k, spec.choice_key, seed=spec.seed,
                                              shard=spec.shard)
    if spec.mode == "poisson":
        return sampling.PoissonSampler(spec.units, spec.q, seed=spec.seed, shard=spec.shard)
    return sampling.ShuffleSampler(spec.units, spec.batch_size, key=spec.shuffle_key)


SamplerFactory = Callable[[SamplerSpec], object]


def mlm_rounds(mask_fn, token_ids: np.ndarray, example_ids: np.ndarray, indices: np.ndarray, mask_key: int,
               step: int, micro_batch: int, replicas: int):
    """The rounds of one logical MLM step: the sampled rows masked by (key, step, their own ids),
    then packed (``sampling.pack_rounds``)."""
    indices = np.asarray(indices, dtype=np.int64)
    features = mask_fn(token_ids[indices], masking.example_keys(mask_key, step, example_ids[indices]))
    return sampling.pack_rounds(features, np.arange(indices.size), micro_batch, replicas)


def mlm_patient_rounds(mask_fn, token_ids: np.ndarray, example_ids: np.ndarray, patients, mask_key: int,
                       step: int, k: int, micro_patients: int, replicas: int):
    """The rounds of one user-level MLM step: each sampled patient's ≤ k rows masked by (key,
    step, their own ids), packed k slots per patient (``sampling.pack_patient_rounds``)."""
    rows = np.concatenate([np.asarray(p, dtype=np.int64) for p in patients]) if patients else \
        np.zeros(0, np.int64)
    features = mask_fn(token_ids[rows], masking.example_keys(mask_key, step, example_ids[rows])) if rows.size \
        else mask_fn(token_ids[:1], masking.example_keys(mask_key, step, example_ids[:1]))
    local, start = [], 0
    for p in patients:  # positions of each patient's rows in ``features``
        local.append(np.arange(start, start + len(p)))
        start += len(p)
    return sampling.pack_patient_rounds(features, local, k, micro_patients, replicas)


class BatchSource:
    """Sampler + keyed masking + packing over ``token_ids`` ``[n, L]`` (already padded, int32).

    ``example_ids`` ``[n]``: each row's own record id (keys its masks). ``groups``: the rows of
    each patient (patient unit) or None (tuple unit). ``micro_batch``: m (examples, or patients,
    per replica per round)."""

    def __init__(self, sampler, mask_fn, token_ids: np.ndarray, example_ids: np.ndarray, mask_key: int,
                 micro_batch: int, groups: Optional[sampling.PatientGroups] = None, k: int = 1):
        self.sampler, self.mask_fn = sampler, mask_fn
        self.token_ids, self.example_ids = token_ids, example_ids
        self.mask_key, self.micro_batch, self.groups, self.k = int(mask_key), int(micro_batch), groups, int(k)

    @property
    def patient_unit(self) -> bool:
        return self.groups is not None

    @property
    def units(self) -> int:
        """The EXACT number of units (rows or patients): private, never logged."""
        return len(self.groups) if self.patient_unit else int(self.token_ids.shape[0])

    @property
    def unit_ids(self) -> np.ndarray:
        return self.groups.ids if self.patient_unit else self.example_ids

    def rounds(self, step: int, window: int, local_replicas: int) -> Tuple[List[dict], np.ndarray]:
        """(rounds of optimizer step ``step``, the indices of the units sampled). ``window``: the
        shuffle stream's window (the step log's count before this step)."""
        if self.patient_unit:
            patients = self.sampler.sample(step)
            rows = [sampling.patient_rows(self.groups, int(p), self.k, self.sampler.key, step) for p in patients]
            return (mlm_patient_rounds(self.mask_fn, self.token_ids, self.example_ids, rows, self.mask_key, step,
                                       self.k, self.micro_batch, local_replicas), np.asarray(patients, np.int64))
        indices = self.sampler.sample(window if self.sampler.mode == "shuffle" else step)
        return (mlm_rounds(self.mask_fn, self.token_ids, self.example_ids, indices, self.mask_key, step,
                           self.micro_batch, local_replicas), np.asarray(indices, np.int64))
