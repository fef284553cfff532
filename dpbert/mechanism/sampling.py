"""Logical-batch sampling for DP-SGD and packing into fixed-shape micro-rounds.

Poisson sampling (``mode="poisson"``, what the accountant's amplification-by-sampling assumes):
every step, each of the n units is included independently with probability q, GIVEN by the plan
(B / n_planned before any private data is read) and used exactly, whatever the actual n.
Shuffling (``mode="shuffle"``): fixed-size batches of exactly B over a stream of random
permutations; recorded as "shuffle" for the accountant (no amplification).

Contract: a logical batch of b units is packed into ``max(1, ceil(b / (P·m)))`` rounds of the
fixed shape ``[P, m, L]`` with padded rows masked out, so NO unit is ever dropped and an empty
batch still takes a step; with a cap (``poisson_batch_cap``) ``pack_rounds`` raises
``PoissonOverflowError`` rather than drop a unit. Patients are grouped by ``group_rows`` and
checked by ``check_patient_groups``; with several workers each flips the coins of its own units
(``shard_of``) with a fresh key per process; ``prf_key`` is for tests only. Why the shapes are
fixed, the cap's derivation, and the multi-worker sampler: docs/training.md ("Sampling and
fixed-shape rounds").
"""
from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional

import numpy as np

SAMPLING_MODES = ("poisson", "shuffle")


class PoissonOverflowError(RuntimeError):
    """A Poisson batch exceeded an explicitly requested cap (never silently truncated)."""


def micro_batch_size(batch_size: int, replicas: int, accumulation_steps: int) -> int:
    """m = B / (P·T) examples per replica per round."""
    if batch_size % (replicas * accumulation_steps):
        raise ValueError(f"batch_size {batch_size} must be divisible by replicas × accumulation_steps "
                         f"= {replicas * accumulation_steps}")
    return batch_size // (replicas * accumulation_steps)


def poisson_batch_cap(n: int, q: float, failure_probability: float = 1e-12, multiple: int = 1) -> int:
    """Smallest multiple of ``multiple`` with P[Binomial(n, q) > cap] ≤ failure_probability."""
    from scipy import stats

    if not 0 < q <= 1:
        raise ValueError(f"q must be in (0, 1], got {q}")
    mean = n * q
    cap = int(math.ceil(mean))
    step = max(1, int(math.ceil(math.sqrt(max(mean, 1.0)) / 4)))
    while stats.binom.sf(cap, n, q) > failure_probability and cap < n:
        cap += step
    while cap > 0 and stats.binom.sf(cap - 1, n, q) <= failure_probability:
        cap -= 1
    return int(math.ceil(cap / multiple) * multiple)


def poisson_size_tolerance(n: int, q: float, draws: int = 1, z: float = 4.0) -> float:
    """z standard errors of the mean of ``draws`` Binomial(n, q) batch sizes."""
    return z * math.sqrt(n * q * (1 - q) / draws)


_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(x) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (a stable bijective mix; wraps mod 2⁶⁴)."""
    x = np.asarray(x, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def unit_ids64(ids) -> np.ndarray:
    """Integer unit ids (record ids, patient ids) as uint64 (negative int64 ids wrap)."""
    ids = np.asarray(ids)
    return ids.astype(np.uint64) if ids.dtype == np.uint64 else ids.astype(np.int64).view(np.uint64)


def shard_of(ids, workers: int) -> np.ndarray:
    """The worker (0 … W−1) that holds each unit: a stable hash of the unit's own id mod W (the
    same in every process and run; a unit's placement depends on nothing else)."""
    if int(workers) < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return (_mix64(unit_ids64(ids) ^ np.uint64(0x5D9B0C7A3E21F5A1)) % np.uint64(workers)).astype(np.int64)


def prf_uniform(key: int, ids, step: int) -> np.ndarray:
    """A uniform [0, 1) per unit from (key, the unit's own id, step) (TESTS ONLY sampler coins)."""
    with np.errstate(over="ignore"):
        inner = _mix64(np.uint64(int(key) & 0xFFFFFFFFFFFFFFFF) ^ _mix64(np.uint64(int(step) & 0xFFFFFFFFFFFFFFFF)))
        h = _mix64(_mix64(unit_ids64(ids) ^ inner) + np.uint64(0x9E3779B97F4A7C15))
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


class PoissonSampler:
    """Each example independently in the batch with probability ``q``. ``seed=None``: OS entropy.

    ``shard``: the indices (among the n) of the units THIS worker holds (``shard_of``); the sampler
    then flips only their coins (``sample`` returns indices among the n). ``prf_key`` with
    ``prf_ids`` (the n units' own ids): TESTS ONLY, coins from ``prf_uniform`` (docs/training.md)."""

    mode = "poisson"

    def __init__(self, n: int, q: float, seed: Optional[int] = None, *, shard: Optional[np.ndarray] = None,
                 prf_key: Optional[int] = None, prf_ids=None):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not 0 < q <= 1:
            raise ValueError(f"sampling probability q must be in (0, 1], got {q}")
        self.n, self.q = int(n), float(q)
        self.rng = np.random.default_rng(seed)
        self.shard = None if shard is None else np.asarray(shard, dtype=np.int64)
        if self.shard is not None and self.shard.size and (self.shard.min() < 0 or self.shard.max() >= self.n):
            raise ValueError("shard indices out of range")
        self.prf_key = prf_key
        if prf_key is not None:
            if prf_ids is None or len(prf_ids) != self.n:
                raise ValueError("prf_key needs prf_ids, one id per unit")
            self.prf_ids = unit_ids64(prf_ids)

    @property
    def expected_batch_size(self) -> float:
        """q × the units this sampler draws from (its shard's, on a worker)."""
        return (self.n if self.shard is None else self.shard.size) * self.q

    def sample(self, step: int = 0) -> np.ndarray:
        """A fresh Poisson batch (independent of ``step`` and of every earlier draw; with
        ``prf_key``: a function of (key, unit ids, step))."""
        units = np.arange(self.n, dtype=np.int64) if self.shard is None else self.shard
        if self.prf_key is not None:
            return np.sort(units[prf_uniform(self.prf_key, self.prf_ids[units], step) < self.q])
        if self.shard is None:
            size = int(self.rng.binomial(self.n, self.q))
            return np.sort(self.rng.choice(self.n, size=size, replace=False)).astype(np.int64)
        size = int(self.rng.binomial(units.size, self.q))
        return np.sort(units[self.rng.choice(units.size, size=size, replace=False)]).astype(np.int64)


class ShuffleSampler:
    """Fixed-size batches of ``batch_size`` read from one continuous stream of permutations.

    The stream is perm_0 ‖ perm_1 ‖ …, perm_e = a permutation of the n rows drawn from
    (``key``, e); window w takes positions [w·B, (w+1)·B) of it (a batch may straddle two epochs).
    A batch is a function of (key, w) only. The trainer passes w = the write-ahead step log's count
    of steps EXECUTED before this one (``dpbert.engine.loop``), not the optimizer's step: a run
    resumed from a checkpoint at step c after executing e > c steps replays steps c…e−1 on NEW
    windows e, e+1, …, so over the whole chain every example takes part ceil(executed·B/n) times
    at most (+1 when batches straddle), what the accountant charges. (Indexing by the
    checkpoint's step replayed the lost windows: 4 rows took part 3 times where the record said 2,
    ε charged 6.57 vs 8.39 true; restarting the permutation at a resume, before that, used some
    examples twice in one accounted epoch: recorded ε 11.0, true 16.9.)
    The key is secret (OS entropy) and is kept, with the checkpoints, in the trainer's private
    state directory so that a resume can continue the stream.
    """

    mode = "shuffle"

    def __init__(self, n: int, batch_size: int, key: Optional[int] = None):
        if n < 1 or batch_size < 1:
            raise ValueError("n and batch_size must be >= 1")
        self.n, self.batch_size = int(n), int(batch_size)
        self.key = int(key) if key is not None else int(np.random.SeedSequence().entropy % (1 << 63))
        self._cache: Dict[int, np.ndarray] = {}

    @property
    def q(self) -> float:
        return min(1.0, self.batch_size / self.n)

    @property
    def expected_batch_size(self) -> float:
        return float(self.batch_size)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._cache:
            self._cache = {epoch: np.random.default_rng([self.key, epoch]).permutation(self.n)}
        return self._cache[epoch]

    def sample(self, step: int) -> np.ndarray:
        start = int(step) * self.batch_size
        out = []
        while len(out) < self.batch_size:
            epoch, offset = divmod(start + len(out), self.n)
            take = min(self.batch_size - len(out), self.n - offset)
            out.extend(self._permutation(epoch)[offset:offset + take])
        return np.asarray(out, dtype=np.int64)


def pack_rounds(data, indices: np.ndarray, micro_batch: int, replicas: int,
                max_rounds: Optional[int] = None) -> List[Dict[str, object]]:
    """Pack ``data[indices]`` into R ≥ 1 rounds ``{"features": [P, m, ...], "example_mask": [P, m]}``.

    ``data``: an array ``[n, ...]`` or a mapping of such arrays (e.g. masked MLM features), packed
    alike. Padding rows are zeros (pad id 0) with mask 0. ``max_rounds``: raise
    ``PoissonOverflowError`` if the batch needs more rounds (never truncate).
    """
    per_round = micro_batch * replicas
    b = int(len(indices))
    rounds = max(1, int(math.ceil(b / per_round)))
    if max_rounds is not None and rounds > max_rounds:
        raise PoissonOverflowError(
            f"batch of {b} examples needs {rounds} rounds > cap {max_rounds}; refusing to drop examples")
    index = np.asarray(indices, dtype=np.int64)

    def pack(array):
        array = np.asarray(array)
        out = np.zeros((rounds * per_round,) + array.shape[1:], dtype=array.dtype)
        out[:b] = array[index]
        return out.reshape((rounds, replicas, micro_batch) + array.shape[1:])

    features = {k: pack(v) for k, v in data.items()} if isinstance(data, Mapping) else pack(data)
    mask = np.zeros((rounds * per_round,), dtype=np.float32)
    mask[:b] = 1.0
    mask = mask.reshape(rounds, replicas, micro_batch)

    def round_features(r):
        return {k: v[r] for k, v in features.items()} if isinstance(features, dict) else features[r]

    return [{"features": round_features(r), "example_mask": mask[r]} for r in range(rounds)]


# --------------------------------------------------------------------------- user-level (patients)
class PatientGroupingError(RuntimeError):
    """The patient groups are not one sampling unit per patient (a patient split over several
    groups has sensitivity above C): training is refused before any step."""


def group_rows(patient_keys) -> "PatientGroups":
    """Group row indices by patient key (``dpbert.data.splits.patient_key`` of each row), then
    :func:`check_patient_groups` against those keys: a grouping that splits a patient is refused."""
    groups = PatientGroups.from_keys(patient_keys)
    check_patient_groups(groups, patient_keys)
    return groups


def check_patient_groups(groups: "PatientGroups", patient_keys):
    """Raise :class:`PatientGroupingError` unless every group's rows share one patient key, no
    patient key is in two groups, no row is in two groups and every row is in a group (each
    patient is ONE sampling unit: the clipped unit is its summed gradient, sensitivity C). Checked
    from the rows' own keys, independently of how the groups were built. The messages name no
    key, no row and no count (they are logged)."""
    keys = [str(k) for k in patient_keys]
    owner: Dict[str, int] = {}
    seen = np.zeros(len(keys), np.int64)
    for g, rows in enumerate(groups.members):
        rows = np.asarray(rows, np.int64)
        if rows.size == 0 or rows.min() < 0 or rows.max() >= len(keys):
            raise PatientGroupingError("a patient group is empty or names a row that does not exist")
        np.add.at(seen, rows, 1)
        group_keys = {keys[int(r)] for r in rows}
        if len(group_keys) != 1:
            raise PatientGroupingError("a patient group holds the rows of 2 or more patient keys")
        if owner.setdefault(group_keys.pop(), g) != g:
            raise PatientGroupingError("a patient key is in 2 groups: one patient would be 2 sampling units "
                                       "(sensitivity 2C, not the C the privacy record charges)")
    if np.any(seen > 1):
        raise PatientGroupingError("a row is in 2 patient groups")
    if np.any(seen == 0):
        raise PatientGroupingError("a row is in no patient group")
    if len(np.unique(np.asarray(groups.ids, np.uint64))) != len(groups.members):
        raise PatientGroupingError("two patient groups share one patient id")


class PatientGroups:
    """The rows of each patient and a 64-bit id per patient derived from the patient's own key
    (sha256), never from its position among the other patients."""

    def __init__(self, members: List[np.ndarray], ids: np.ndarray):
        if not members:
            raise ValueError("no patient")
        self.members, self.ids = members, np.asarray(ids, dtype=np.uint64)

    @classmethod
    def from_keys(cls, patient_keys) -> "PatientGroups":
        import hashlib

        index: Dict[str, List[int]] = {}
        for row, key in enumerate(patient_keys):
            if key is None or key == "":
                raise ValueError(f"row {row} has no patient id")
            index.setdefault(str(key), []).append(row)
        ids = [int.from_bytes(hashlib.sha256(k.encode("utf-8")).digest()[:8], "little") for k in index]
        return cls([np.asarray(rows, dtype=np.int64) for rows in index.values()], np.asarray(ids, np.uint64))

    def __len__(self) -> int:
        return len(self.members)


def patient_rows(groups: PatientGroups, patient: int, k: int, key: int, step: int) -> np.ndarray:
    """The ≤ k rows patient ``patient`` contributes at ``step``: all of them if it has ≤ k,
    else k drawn uniformly without replacement by a PRF of (secret key, the patient's own id,
    step) — a function of that patient's data and the secret only (the others' rows, their
    number and the patient's index do not enter)."""
    rows = groups.members[patient]
    if rows.size <= k:
        return rows
    rng = np.random.default_rng([int(key) & ((1 << 64) - 1), int(groups.ids[patient]), int(step)])
    return np.sort(rows[rng.choice(rows.size, size=k, replace=False)])


class PatientPoissonSampler(PoissonSampler):
    """User-level sampling: each PATIENT independently in the step's batch with probability q
    (= B_patients / n_patients planned); each sampled patient brings ``patient_rows`` (≤ k)."""

    def __init__(self, groups: PatientGroups, q: float, k: int, key: int, seed: Optional[int] = None, *,
                 shard: Optional[np.ndarray] = None, prf_key: Optional[int] = None):
        super().__init__(len(groups), q, seed=seed, shard=shard, prf_key=prf_key,
                         prf_ids=groups.ids if prf_key is not None else None)
        if int(k) < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.groups, self.k, self.key = groups, int(k), int(key)

    def sample_patients(self, step: int = 0) -> List[np.ndarray]:
        """The rows of each sampled patient (one array of ≤ k row indices per patient)."""
        return [patient_rows(self.groups, int(p), self.k, self.key, step) for p in self.sample(step)]


def pack_patient_rounds(data, patients: List[np.ndarray], k: int, micro_patients: int, replicas: int,
                        max_rounds: Optional[int] = None) -> List[Dict[str, object]]:
    """Pack the sampled patients into R ≥ 1 rounds ``{"features": [P, m·k, ...], "example_mask":
    [P, m·k]}``: m patients per replica per round, patient j of a replica in slots j·k … j·k + k − 1
    (its ≤ k rows first, the rest padding with mask 0). ``data``: array ``[n, ...]`` or mapping,
    indexed by row. The layout ``dpbert.mechanism.ghost`` clips per group of k slots."""
    per_round = micro_patients * replicas
    b = len(patients)
    rounds = max(1, int(math.ceil(b / per_round)))
    if max_rounds is not None and rounds > max_rounds:
        raise PoissonOverflowError(
            f"batch of {b} patients needs {rounds} rounds > cap {max_rounds}; refusing to drop patients")
    slots = rounds * per_round * k
    source = np.full(slots, -1, dtype=np.int64)
    for j, rows in enumerate(patients):
        if len(rows) > k:
            raise ValueError(f"patient {j} brings {len(rows)} rows > k = {k}")
        source[j * k:j * k + len(rows)] = rows
    present = source >= 0
    shape = (rounds, replicas, micro_patients * k)

    def pack(array):
        array = np.asarray(array)
        out = np.zeros((slots,) + array.shape[1:], dtype=array.dtype)
        out[present] = array[source[present]]
        return out.reshape(shape + array.shape[1:])

    features = {name: pack(v) for name, v in data.items()} if isinstance(data, Mapping) else pack(data)
    mask = present.astype(np.float32).reshape(shape)

    def round_features(r):
        return {name: v[r] for name, v in features.items()} if isinstance(features, dict) else features[r]

    return [{"features": round_features(r), "example_mask": mask[r]} for r in range(rounds)]
