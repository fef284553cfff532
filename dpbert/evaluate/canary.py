"""Secret-sharer canaries and exposure (Carlini et al. 2019; as used by Hoory et al. 2021, Fig. 2).

A canary ``C_{k,p}`` is a sequence of ``k`` random word pieces following a pattern of hints
``H`` and one secret ``S`` (patterns ``HS``, ``HSH``, ``HSHH``, ``HHSHH``), inserted into the
training examples ``p`` times or into each example with probability ``p``; every piece is drawn
uniformly from the candidate set R (:func:`candidate_ids`) with the operating system's CSPRNG.
Exposure = ``log2 |R| - log2 rank`` of the masked secret among R, queried the way training saw
the canary (in held-out carrier text, or standalone for a canary trained as its own example), and
extrapolated beyond the rank's resolution by a skew-normal fit.

Contract: a :class:`CanarySet` is a PRIVATE artifact (it holds the secrets): ``save`` writes it
with mode 0600, and neither ``repr``/``str`` nor any error message of this module shows a token of
a canary. :func:`insert_canaries` never overwrites ``[CLS]``, ``[SEP]`` or padding;
:func:`evaluate_exposure` summarises exposure per group against the number of occurrences. The
candidate set, insertion and the exposure's definitions: docs/audits.md ("Canaries and exposure
in detail").
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from scipy import integrate, special, stats

from dpbert.vocab.wordpiece import CLS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_IDS, UNK_ID  # noqa: F401

PATTERNS = ("HS", "HSH", "HSHH", "HHSHH")
FORMAT = "dpbert.canary_set"
FORMAT_VERSION = 1

ScoreFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


class CanaryError(ValueError):
    """Invalid canary input. Messages never contain canary tokens."""


# --------------------------------------------------------------------------------------------
# Randomness
# --------------------------------------------------------------------------------------------

def secure_rng() -> np.random.Generator:
    """A numpy Generator seeded with 128 bits from the OS CSPRNG (for positions, inclusion)."""
    return np.random.default_rng(secrets.randbits(128))


def _draw_indices(size: int, high: int, rng: Optional[np.random.Generator]) -> List[int]:
    """``size`` iid uniform integers in ``[0, high)``: ``secrets.SystemRandom`` unless an explicit
    ``rng`` is given (tests only: a seeded generator makes the secrets predictable)."""
    if rng is None:
        system = secrets.SystemRandom()
        return [system.randrange(high) for _ in range(size)]
    return [int(x) for x in rng.integers(0, high, size=size)]


# --------------------------------------------------------------------------------------------
# Candidate set
# --------------------------------------------------------------------------------------------

def candidate_ids(vocab=None, *, vocab_size: Optional[int] = None,
                  special_ids: Sequence[int] = SPECIAL_IDS,
                  exclude_continuations: bool = True) -> np.ndarray:
    """The ids canary pieces are drawn from, which is also the exposure reference set R.

    ``vocab``: the vocabulary as a sequence of piece strings in id order (``vocab.txt``), or a
    path to ``vocab.txt``. Excluded: ``special_ids``, bracketed ``[...]`` tokens, and (default)
    ``##`` continuation pieces. Without a vocabulary (``vocab_size`` only) only ``special_ids``
    are excluded.
    """
    special = {int(i) for i in special_ids}
    if vocab is None:
        if vocab_size is None:
            raise ValueError("give vocab or vocab_size")
        ids = [i for i in range(int(vocab_size)) if i not in special]
    else:
        if isinstance(vocab, (str, os.PathLike)):
            from dpbert import storage

            vocab = storage.read_text(os.fspath(vocab)).splitlines()
        ids = []
        for i, piece in enumerate(vocab):
            if i in special or not piece.strip():
                continue
            if piece.startswith("[") and piece.endswith("]"):
                continue
            if exclude_continuations and piece.startswith("##"):
                continue
            ids.append(i)
    if len(ids) < 2:
        raise ValueError("the candidate set needs at least two tokens")
    return np.asarray(ids, dtype=np.int32)


# --------------------------------------------------------------------------------------------
# Canaries
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, repr=False)
class Canary:
    """One canary. ``tokens`` (PRIVATE) follow ``pattern``; exactly one of ``occurrences``
    (a fixed number of insertions) and ``probability`` (per-example insertion probability) is
    set; ``included=False`` marks a held-out canary (generated, scored, never inserted)."""

    canary_id: int
    pattern: str
    tokens: Tuple[int, ...]
    occurrences: Optional[int] = None
    probability: Optional[float] = None
    included: bool = True

    def __post_init__(self):
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))
        if not self.pattern or set(self.pattern) - {"H", "S"} or self.pattern.count("S") != 1:
            raise CanaryError(f"canary {self.canary_id}: pattern must contain H's and exactly one "
                              f"S, got {self.pattern!r}")
        if len(self.tokens) != len(self.pattern):
            raise CanaryError(f"canary {self.canary_id}: {len(self.tokens)} tokens for pattern "
                              f"{self.pattern!r}")
        if (self.occurrences is None) == (self.probability is None):
            raise CanaryError(f"canary {self.canary_id}: set exactly one of occurrences and "
                              "probability")
        if self.occurrences is not None and int(self.occurrences) < 0:
            raise CanaryError(f"canary {self.canary_id}: occurrences must be >= 0")
        if self.probability is not None and not 0.0 <= float(self.probability) <= 1.0:
            raise CanaryError(f"canary {self.canary_id}: probability must be in [0, 1]")

    @property
    def k(self) -> int:
        return len(self.tokens)

    @property
    def secret_index(self) -> int:
        """Position of the secret within the canary."""
        return self.pattern.index("S")

    @property
    def secret(self) -> int:
        """The secret token id (PRIVATE)."""
        return self.tokens[self.secret_index]

    @property
    def group(self) -> str:
        """Group label: ``"n=<occurrences>"`` or ``"p=<probability>"``."""
        if self.occurrences is not None:
            return f"n={int(self.occurrences)}"
        return f"p={float(self.probability):g}"

    def __repr__(self) -> str:
        return (f"Canary(id={self.canary_id}, pattern={self.pattern!r}, group={self.group!r}, "
                f"included={self.included}, tokens=<hidden>)")

    __str__ = __repr__

    def to_dict(self) -> dict:
        return {"id": self.canary_id, "pattern": self.pattern, "tokens": list(self.tokens),
                "occurrences": self.occurrences, "probability": self.probability,
                "included": bool(self.included)}

    @classmethod
    def from_dict(cls, data: dict) -> "Canary":
        return cls(canary_id=int(data["id"]), pattern=str(data["pattern"]),
                   tokens=tuple(int(t) for t in data["tokens"]),
                   occurrences=None if data.get("occurrences") is None else int(data["occurrences"]),
                   probability=None if data.get("probability") is None else float(data["probability"]),
                   included=bool(data.get("included", True)))


@dataclasses.dataclass(repr=False)
class CanarySet:
    """The canaries of one training run and their candidate / reference set. PRIVATE."""

    canaries: List[Canary]
    candidates: np.ndarray
    vocab_size: int

    def __post_init__(self):
        self.candidates = np.asarray(self.candidates, dtype=np.int32)
        self.vocab_size = int(self.vocab_size)
        allowed = set(int(c) for c in self.candidates)
        if not allowed or min(allowed) < 0 or max(allowed) >= self.vocab_size:
            raise CanaryError("candidate ids must lie in [0, vocab_size)")
        ids = [c.canary_id for c in self.canaries]
        if len(set(ids)) != len(ids):
            raise CanaryError("canary ids must be unique")
        for c in self.canaries:
            if any(t not in allowed for t in c.tokens):
                raise CanaryError(f"canary {c.canary_id}: a token is outside the candidate set")

    def __len__(self) -> int:
        return len(self.canaries)

    def __iter__(self):
        return iter(self.canaries)

    def groups(self) -> List[str]:
        seen: Dict[str, None] = {}
        for c in self.canaries:
            seen.setdefault(c.group, None)
        return list(seen)

    def __repr__(self) -> str:
        patterns = sorted({c.pattern for c in self.canaries}, key=len)
        return (f"CanarySet({len(self.canaries)} canaries, groups={self.groups()}, "
                f"patterns={patterns}, |R|={len(self.candidates)}, vocab_size={self.vocab_size}, "
                "tokens=<hidden>)")

    __str__ = __repr__

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": FORMAT_VERSION, "private": True,
                "vocab_size": self.vocab_size,
                "candidates": [int(c) for c in self.candidates],
                "canaries": [c.to_dict() for c in self.canaries]}

    @classmethod
    def from_dict(cls, data: dict) -> "CanarySet":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CanaryError(f"not a canary set (expected format {FORMAT!r})")
        if int(data.get("version", -1)) != FORMAT_VERSION:
            raise CanaryError(f"unsupported canary-set version {data.get('version')!r}")
        try:
            canaries = [Canary.from_dict(c) for c in data["canaries"]]
            return cls(canaries=canaries, candidates=np.asarray(data["candidates"], np.int32),
                       vocab_size=int(data["vocab_size"]))
        except (KeyError, TypeError) as exc:
            # exc may quote a value: name only the missing/ill-typed field kind.
            raise CanaryError(f"malformed canary set ({type(exc).__name__})") from None

    def save(self, path):
        """Write the PRIVATE JSON artifact (mode 0600 on a local disk; any ``dpbert.storage``
        URI; written whole and atomically, an existing file is replaced); returns ``path``."""
        from dpbert import storage

        storage.write_text(str(path), json.dumps(self.to_dict()), private=True)
        return path

    @classmethod
    def load(cls, path) -> "CanarySet":
        from dpbert import storage

        try:
            data = json.loads(storage.read_text(str(path)))
        except json.JSONDecodeError as exc:  # position only, no content
            raise CanaryError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno})") from None
        return cls.from_dict(data)


def occurrence_groups(n_examples: int, base: int = 10, max_fraction: float = 1.0) -> List[int]:
    """Occurrence counts 1, base, base², ... below the cap, then the cap itself, where the cap is
    ``floor(max_fraction · n_examples)`` (at least 1): e.g. n=500 → [1, 10, 100, 500]."""
    if n_examples < 1:
        raise ValueError("n_examples must be >= 1")
    if base < 2:
        raise ValueError("base must be >= 2")
    cap = max(1, int(math.floor(max_fraction * n_examples)))
    groups, value = [], 1
    while value < cap:
        groups.append(value)
        value *= base
    groups.append(cap)
    return groups


def make_canary(canary_id: int, pattern: str, candidates: np.ndarray,
                rng: Optional[np.random.Generator] = None, **schedule) -> Canary:
    """One canary of ``pattern`` with every piece uniform over ``candidates`` (CSPRNG unless
    ``rng`` is given — tests only). ``schedule``: ``occurrences=`` or ``probability=``, and
    ``included=``."""
    candidates = np.asarray(candidates)
    picks = _draw_indices(len(pattern), len(candidates), rng)
    return Canary(canary_id=canary_id, pattern=pattern,
                  tokens=tuple(int(candidates[i]) for i in picks), **schedule)


def make_canary_set(candidates: np.ndarray, vocab_size: int, *,
                    occurrences: Sequence[int] = (), probabilities: Sequence[float] = (),
                    patterns: Sequence[str] = PATTERNS, canaries_per_group: int = 10,
                    rng: Optional[np.random.Generator] = None) -> CanarySet:
    """``canaries_per_group`` canaries for every (group, pattern): a group is an occurrence
    count (from ``occurrences``, e.g. :func:`occurrence_groups`) or an insertion probability.
    ``rng``: tests only (default: the OS CSPRNG)."""
    schedules = ([{"occurrences": int(o)} for o in occurrences]
                 + [{"probability": float(p)} for p in probabilities])
    if not schedules:
        raise ValueError("give occurrences and/or probabilities")
    drawer = _DistinctHints(candidates, rng)
    canaries: List[Canary] = []
    for schedule in schedules:
        for pattern in patterns:
            for _ in range(int(canaries_per_group)):
                canaries.append(drawer.draw(len(canaries), pattern, **schedule))
    return CanarySet(canaries=canaries, candidates=candidates, vocab_size=vocab_size)


class _DistinctHints:
    """Draws canaries whose (pattern, hints) differ from every earlier one: two canaries with
    the same hints and different secrets would be indistinguishable queries for the exposure.
    A colliding canary is redrawn whole; the rejection depends on the hints only, so each secret
    stays uniform over the candidates and independent of everything else."""

    def __init__(self, candidates, rng, max_tries: int = 1000):
        self.candidates, self.rng, self.max_tries = np.asarray(candidates), rng, max_tries
        self.seen = set()

    def draw(self, canary_id: int, pattern: str, **schedule) -> Canary:
        for _ in range(self.max_tries):
            canary = make_canary(canary_id, pattern, self.candidates, self.rng, **schedule)
            key = (pattern, tuple(t for i, t in enumerate(canary.tokens) if i != canary.secret_index))
            if key not in self.seen:
                self.seen.add(key)
                return canary
        raise CanaryError(f"could not draw canary {canary_id} with hints distinct from the others: "
                          f"too many {pattern!r} canaries for {len(self.candidates)} candidates")


def make_audit_canaries(candidates: np.ndarray, vocab_size: int, m: int, *, pattern: str = "HHSHH",
                        occurrences: int = 1, rng: Optional[np.random.Generator] = None
                        ) -> CanarySet:
    """``m`` canaries for a one-run audit (``dpbert.privacy.one_run_audit``): each is included with
    probability 1/2, independently (OS CSPRNG unless ``rng``), and inserted ``occurrences`` times
    when included. For an audit comparable with the accountant's per-example ε use
    ``occurrences=1`` (one privacy unit per canary)."""
    if rng is None:
        system = secrets.SystemRandom()
        included = [system.random() < 0.5 for _ in range(int(m))]
    else:
        included = [bool(x) for x in rng.random(int(m)) < 0.5]
    drawer = _DistinctHints(candidates, rng)
    canaries = [drawer.draw(i, pattern, occurrences=int(occurrences), included=included[i])
                for i in range(int(m))]
    return CanarySet(canaries=canaries, candidates=candidates, vocab_size=vocab_size)


# --------------------------------------------------------------------------------------------
# Insertion
# --------------------------------------------------------------------------------------------

def _layout(row: np.ndarray, pad_id: int, cls_id: int, sep_id: int) -> Tuple[int, int, int]:
    """(length, content start, content end) of one example: padding after the last non-pad
    token; a leading [CLS] and trailing [SEP] are protected."""
    nonpad = np.nonzero(row != pad_id)[0]
    if nonpad.size == 0:
        return 0, 0, 0
    length = int(nonpad[-1]) + 1
    start = 1 if row[0] == cls_id else 0
    end = length - 1 if (length - 1 >= start and row[length - 1] == sep_id) else length
    return length, start, end


def insert_canaries(token_ids: np.ndarray, canaries, key: Optional[int] = None, *,
                    row_ids: Optional[np.ndarray] = None, rows_planned: Optional[int] = None,
                    pad_id: int = PAD_ID, cls_id: int = CLS_ID, sep_id: int = SEP_ID
                    ) -> Tuple[np.ndarray, np.ndarray]:
    """Insert the included canaries into examples ``token_ids`` ``[n, L]``, row by row.

    Every decision is made PER ROW, independently of the other rows: row r (non-empty, i.e. not
    all padding) draws from a generator keyed by (``key``, its own ``row_ids[r]``) whether it
    carries each canary — with probability ``probability``, or ``occurrences / rows_planned`` for
    a canary given as a number of occurrences (``rows_planned``: a PUBLIC number of rows, so the
    expected count is ``occurrences``) — and where the chosen ones go. Adding or removing a row
    therefore never changes which canaries the other rows carry (a uniform choice of c rows
    among the eligible ones did: a new row could take a canary another row would have had, so
    neighbouring training sets differed in ≥ 2 rows). Within a row the position is uniform over
    the gaps between content tokens (see docs/audits.md for truncation).

    ``key``: the secret insertion key (default: OS entropy); ``row_ids``: each row's own record
    id (default: the row index — tests). Returns ``(new_token_ids [n, L], counts
    [len(canaries)])``, ``counts[i]`` the number of rows that contain canary ``i`` whole (0 for
    held-out canaries).
    """
    token_ids = np.asarray(token_ids)
    if token_ids.ndim != 2:
        raise CanaryError(f"token_ids must be [n, L], got shape {token_ids.shape}")
    canary_list = list(canaries.canaries if isinstance(canaries, CanarySet) else canaries)
    key_given_as_generator = isinstance(key, np.random.Generator)
    if key_given_as_generator:  # an explicit generator (tests): its next draw is the key
        key = int(key.integers(0, 2 ** 63))
    key = secrets.randbits(63) if key is None else int(key)
    n, L = token_ids.shape
    row_ids = np.arange(n, dtype=np.int64) if row_ids is None else np.asarray(row_ids, dtype=np.int64)
    if row_ids.shape != (n,):
        raise CanaryError(f"row_ids must have shape ({n},), got {row_ids.shape}")
    if rows_planned is None and key_given_as_generator:
        # Legacy call (tests): plan with the number of non-empty rows — a count of THESE rows, so
        # not neighbour-independent; the trainer passes a public rows_planned.
        rows_planned = sum(1 for i in range(n) if token_ids[i].any())
    if any(c.occurrences is not None and c.included for c in canary_list):
        if rows_planned is None or int(rows_planned) < 1:
            raise CanaryError("canaries given by occurrences need rows_planned (a public number of rows >= 1)")
    probabilities = np.array([0.0 if not c.included else
                              (min(1.0, float(c.occurrences) / int(rows_planned)) if c.occurrences is not None
                               else float(c.probability)) for c in canary_list])
    layouts = [_layout(token_ids[i], pad_id, cls_id, sep_id) for i in range(n)]

    row_rngs: Dict[int, np.random.Generator] = {}
    assigned: Dict[int, List[int]] = {}
    for e in range(n):
        if layouts[e][0] == 0:
            continue
        rid = int(row_ids[e]) & 0xFFFFFFFFFFFFFFFF
        rng = np.random.default_rng([key & 0xFFFFFFFFFFFFFFFF, rid >> 32, rid & 0xFFFFFFFF])
        chosen = np.flatnonzero(rng.random(len(canary_list)) < probabilities)
        if chosen.size:
            assigned[e] = [int(ci) for ci in chosen]
            row_rngs[e] = rng

    out = token_ids.copy()
    counts = np.zeros(len(canary_list), dtype=np.int64)
    for e in sorted(assigned):
        length, start, end = layouts[e]
        row = token_ids[e]
        prefix = [int(t) for t in row[:start]]
        content = [int(t) for t in row[start:end]]
        suffix = [int(t) for t in row[end:length]]
        rng = row_rngs[e]
        order = list(assigned[e])
        rng.shuffle(order)
        room = L - len(prefix) - len(suffix)
        kept: List[int] = []
        used = 0
        for ci in order:  # canaries that fit whole, in random order
            k = canary_list[ci].k
            if used + k <= room:
                kept.append(ci)
                used += k
        content = content[:room - used]
        gaps = rng.integers(0, len(content) + 1, size=len(kept))
        pieces: List[int] = []
        by_gap: Dict[int, List[int]] = {}
        for ci, g in zip(kept, gaps):
            by_gap.setdefault(int(g), []).append(ci)
        for position in range(len(content) + 1):
            for ci in by_gap.get(position, []):
                pieces.extend(canary_list[ci].tokens)
            if position < len(content):
                pieces.append(content[position])
        new_row = prefix + pieces + suffix
        out[e] = pad_id
        out[e, :len(new_row)] = new_row
        for ci in kept:
            counts[ci] += 1
    return out, counts


def canary_examples(canaries, max_seq_length: int, *, mask_secret: bool = False,
                    pad_id: int = PAD_ID, cls_id: int = CLS_ID, sep_id: int = SEP_ID,
                    mask_id: int = MASK_ID) -> Tuple[np.ndarray, np.ndarray]:
    """Each canary as a standalone example ``[CLS] canary [SEP] pad...`` ``[m, L]`` int32, and the
    position of its secret ``[m]``. ``mask_secret`` replaces the secret by ``[MASK]`` (the
    exposure query). Without masking, these rows can be appended to the training set as
    canary-only examples (one privacy unit per canary, as a one-run audit wants)."""
    canary_list = list(canaries.canaries if isinstance(canaries, CanarySet) else canaries)
    L = int(max_seq_length)
    ids = np.full((len(canary_list), L), pad_id, dtype=np.int32)
    positions = np.zeros(len(canary_list), dtype=np.int32)
    for i, canary in enumerate(canary_list):
        if canary.k + 2 > L:
            raise CanaryError(f"canary {canary.canary_id}: {canary.k} tokens do not fit in L={L}")
        row = [cls_id, *canary.tokens, sep_id]
        positions[i] = 1 + canary.secret_index
        if mask_secret:
            row[positions[i]] = mask_id
        ids[i, :len(row)] = row
    return ids, positions


def canary_context_queries(canaries, contexts: np.ndarray, contexts_per_canary: int = 16,
                           rng: Optional[np.random.Generator] = None, *, pad_id: int = PAD_ID,
                           cls_id: int = CLS_ID, sep_id: int = SEP_ID, mask_id: int = MASK_ID
                           ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each canary inserted, with its secret masked, into ``contexts_per_canary`` distinct
    carrier rows of ``contexts`` ``[N, L]`` (non-empty rows, chosen uniformly), exactly as
    :func:`insert_canaries` inserts it into a training example: at a uniform gap between content
    tokens, ``[CLS]``/``[SEP]`` kept, the carrier's content truncated at the end if needed.

    The carriers should be held-out text from the training domain (not training examples:
    querying a training row would also measure the memorisation of that row). ``rng`` drives the
    choice of carriers and gaps (default: seeded, the query is public and reproducible).
    Returns ``(queries [m·K, L] int32, mask_positions [m·K], owner [m·K])``, ``owner[j]`` the
    index of the canary of query ``j`` (``K = min(contexts_per_canary, #non-empty rows)``).
    """
    canary_list = list(canaries.canaries if isinstance(canaries, CanarySet) else canaries)
    contexts = np.asarray(contexts)
    if contexts.ndim != 2:
        raise CanaryError(f"contexts must be [n, L], got shape {contexts.shape}")
    if int(contexts_per_canary) < 1:
        raise CanaryError("contexts_per_canary must be >= 1")
    rng = np.random.default_rng(0) if rng is None else rng
    L = contexts.shape[1]
    layouts = [_layout(row, pad_id, cls_id, sep_id) for row in contexts]
    eligible = np.asarray([i for i, lay in enumerate(layouts) if lay[0] > 0], dtype=np.int64)
    if eligible.size == 0:
        raise CanaryError("contexts has no non-empty row")
    K = min(int(contexts_per_canary), int(eligible.size))
    queries = np.full((len(canary_list) * K, L), pad_id, dtype=np.int32)
    positions = np.zeros(len(canary_list) * K, dtype=np.int32)
    owner = np.repeat(np.arange(len(canary_list)), K)
    j = 0
    for canary in canary_list:
        for e in rng.choice(eligible, size=K, replace=False):
            length, start, end = layouts[int(e)]
            row = contexts[int(e)]
            prefix = [int(t) for t in row[:start]]
            suffix = [int(t) for t in row[end:length]]
            room = L - len(prefix) - len(suffix)
            if canary.k > room:
                raise CanaryError(f"canary {canary.canary_id}: {canary.k} tokens do not fit in a "
                                  f"carrier row of L={L}")
            content = [int(t) for t in row[start:end]][:room - canary.k]
            gap = int(rng.integers(0, len(content) + 1))
            new_row = prefix + content[:gap] + list(canary.tokens) + content[gap:] + suffix
            positions[j] = len(prefix) + gap + canary.secret_index
            new_row[positions[j]] = mask_id
            queries[j, :len(new_row)] = new_row
            j += 1
    return queries, positions, owner


# --------------------------------------------------------------------------------------------
# Exposure
# --------------------------------------------------------------------------------------------

def _log_perplexities(scores: np.ndarray) -> np.ndarray:
    """``-log softmax(scores)`` over the vocabulary axis (float64)."""
    scores = np.asarray(scores, dtype=np.float64)
    return -(scores - special.logsumexp(scores, axis=-1, keepdims=True))


def _check_scores(scores, secret_ids, candidates) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2:
        raise CanaryError(f"scores must be [n, V], got shape {scores.shape}")
    secret_ids = np.asarray(secret_ids, dtype=np.int64).reshape(-1)
    candidates = np.asarray(candidates, dtype=np.int64).reshape(-1)
    if secret_ids.shape[0] != scores.shape[0]:
        raise CanaryError(f"{scores.shape[0]} score rows but {secret_ids.shape[0]} secrets")
    if candidates.size < 2 or candidates.min() < 0 or candidates.max() >= scores.shape[1]:
        raise CanaryError("candidate ids must be >= 2 ids within the score vocabulary")
    if not np.isin(secret_ids, candidates).all():
        raise CanaryError("every secret must be in the candidate set")  # no value in the message
    if not np.isfinite(scores[:, candidates]).all():
        raise CanaryError("scores of candidate tokens must be finite")
    return scores, secret_ids, candidates


def compute_exposure_rank(scores: np.ndarray, secret_ids: np.ndarray, candidates: np.ndarray,
                          ties: str = "average") -> Tuple[np.ndarray, np.ndarray]:
    """Rank of each secret among the candidate set and its exposure.

    ``scores`` ``[n, V]``: logits or log-probabilities at the masked secret position (higher =
    more likely). ``rank = 1 + #{c in R: score(c) > score(secret)} + t · #{c in R, c != secret:
    score(c) == score(secret)}`` with ``t = 1/2`` (``ties="average"``), ``1`` (``"max"``, the
    pessimistic rank) or ``0`` (``"min"``). ``exposure = log2 |R| - log2 rank``.
    Returns ``(ranks [n] float, exposures [n] float)``.
    """
    if ties not in ("average", "max", "min"):
        raise ValueError(f"ties must be 'average', 'max' or 'min', got {ties!r}")
    scores, secret_ids, candidates = _check_scores(scores, secret_ids, candidates)
    cand = scores[:, candidates]                                   # [n, |R|]
    own = scores[np.arange(scores.shape[0]), secret_ids][:, None]  # [n, 1]
    higher = (cand > own).sum(axis=1)
    equal = (cand == own).sum(axis=1) - 1                          # minus the secret itself
    weight = {"average": 0.5, "max": 1.0, "min": 0.0}[ties]
    ranks = 1.0 + higher + weight * equal
    exposures = np.log2(len(candidates)) - np.log2(ranks)
    return ranks, exposures


def exposure_interpolation(secret_perplexities: Sequence[float],
                           reference_perplexities: Sequence[float]) -> np.ndarray:
    """tf-privacy's ``compute_exposure_interpolation`` for one group: rank of each secret's
    perplexity among reference perplexities (sequences never trained on; lower = more likely),
    ``rank = 1 + #{reference < secret}`` and exposure ``log2 |ref| - log2 rank``."""
    reference = np.sort(np.asarray(reference_perplexities, dtype=np.float64))
    secret = np.asarray(secret_perplexities, dtype=np.float64)
    ranks = np.searchsorted(reference, secret, side="left") + 1
    return np.log2(len(reference)) - np.log2(ranks)


def _skewnorm_log_cdf(x: float, params: Sequence[float]) -> float:
    """``log F(x)`` of a skew-normal. ``scipy.stats.skewnorm.cdf`` is accurate until it underflows
    (~1e-308); below that ``log F(x) = log f(x) + log ∫_0^∞ f(x - w/c) / (f(x) c) dw`` with ``c``
    the local slope of ``log f`` (the integrand then decays like ``e^{-w}``), all in log space."""
    cdf = float(stats.skewnorm.cdf(x, *params))
    if cdf > 1e-250:
        return math.log(cdf)
    log_f = float(stats.skewnorm.logpdf(x, *params))
    if not np.isfinite(log_f):
        return -math.inf
    h = 1e-6 * max(1.0, abs(x))
    slope = (float(stats.skewnorm.logpdf(x + h, *params))
             - float(stats.skewnorm.logpdf(x - h, *params))) / (2 * h)
    c = max(abs(slope), 1e-3)
    value, _ = integrate.quad(
        lambda w: math.exp(min(float(stats.skewnorm.logpdf(x - w / c, *params)) - log_f, 700.0)) / c,
        0.0, np.inf)
    return log_f + math.log(value) if value > 0 else -math.inf


def exposure_extrapolation(secret_perplexities: Sequence[float],
                           reference_perplexities: Sequence[float]) -> Tuple[np.ndarray, tuple]:
    """tf-privacy's ``compute_exposure_extrapolation``: fit a skew-normal to the reference
    perplexities (``scipy.stats.skewnorm.fit``) and return ``-log2 F(secret perplexity)`` and the
    fitted ``(a, loc, scale)``. The log-CDF is computed in log space, so a secret far beyond the
    reference gets a large finite exposure instead of ``-log2(0) = inf``."""
    reference = np.asarray(reference_perplexities, dtype=np.float64)
    params = tuple(float(p) for p in stats.skewnorm.fit(reference))
    secret = np.asarray(secret_perplexities, dtype=np.float64).reshape(-1)
    log_cdf = np.asarray([_skewnorm_log_cdf(float(x), params) for x in secret])
    return -log_cdf / math.log(2.0), params


def compute_exposure_extrapolation(scores: np.ndarray, secret_ids: np.ndarray,
                                   candidates: np.ndarray, max_reference: Optional[int] = None,
                                   rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """Extrapolated exposure of each secret: skew-normal fitted, per row, to the
    log-perplexities (``-log softmax``) of the candidates OTHER than the secret (at most
    ``max_reference`` of them, sampled with ``rng``), evaluated at the secret's log-perplexity.
    Returns ``[n]`` exposures in bits (may exceed ``log2 |R|``)."""
    scores, secret_ids, candidates = _check_scores(scores, secret_ids, candidates)
    perplexities = _log_perplexities(scores)
    rng = np.random.default_rng(0) if rng is None else rng
    out = np.empty(scores.shape[0])
    for i in range(scores.shape[0]):
        others = candidates[candidates != secret_ids[i]]
        if max_reference is not None and len(others) > max_reference:
            others = rng.choice(others, size=int(max_reference), replace=False)
        exposure, _ = exposure_extrapolation([perplexities[i, secret_ids[i]]], perplexities[i, others])
        out[i] = exposure[0]
    return out


def score_canaries(canaries, score_fn: ScoreFn, max_seq_length: int, batch_size: int = 64, *,
                   contexts: Optional[np.ndarray] = None, contexts_per_canary: int = 16,
                   rng: Optional[np.random.Generator] = None, **ids) -> np.ndarray:
    """``score_fn`` on every canary's masked query, in batches: returns scores ``[m, V]`` at the
    secret positions. ``contexts=None``: the standalone query (:func:`canary_examples`);
    otherwise the in-context queries of :func:`canary_context_queries` (carriers ``contexts``
    ``[N, max_seq_length]``), and a canary's scores are its queries' log-softmax averaged."""
    if contexts is None:
        queries, positions = canary_examples(canaries, max_seq_length, mask_secret=True, **ids)
        owner = None
    else:
        if np.asarray(contexts).shape[1:] != (int(max_seq_length),):
            raise CanaryError(f"contexts must be [n, {int(max_seq_length)}], got shape "
                              f"{np.asarray(contexts).shape}")
        queries, positions, owner = canary_context_queries(canaries, contexts, contexts_per_canary,
                                                           rng, **ids)
    chunks = []
    for start in range(0, len(queries), int(batch_size)):
        stop = start + int(batch_size)
        chunk = np.asarray(score_fn(queries[start:stop], positions[start:stop]))
        if chunk.ndim != 2 or chunk.shape[0] != len(queries[start:stop]):
            raise CanaryError(f"score_fn must return [batch, V], got shape {chunk.shape}")
        chunks.append(chunk)
    if not chunks:
        return np.zeros((0, 0))
    scores = np.concatenate(chunks, axis=0)
    if owner is None:
        return scores
    log_probs = -_log_perplexities(scores)
    m = int(owner.max()) + 1 if owner.size else 0
    return np.stack([log_probs[owner == i].mean(axis=0) for i in range(m)])


def _summary(values: np.ndarray) -> dict:
    values = np.asarray(values, dtype=np.float64)
    finite = values[np.isfinite(values)]
    if values.size == 0:
        return {"n": 0}
    return {"n": int(values.size), "mean": float(np.mean(values)),
            "std": float(np.std(values, ddof=1)) if values.size > 1 else 0.0,
            "median": float(np.median(values)), "min": float(np.min(values)),
            "max": float(np.max(values)), "n_infinite": int(values.size - finite.size)}


@dataclasses.dataclass(frozen=True, eq=False)
class InContext:
    """The in-context query of :func:`evaluate_exposure`: held-out carrier rows ``contexts``
    ``[N, max_seq_length]``, each canary queried in ``contexts_per_canary`` of them
    (:func:`canary_context_queries`, carriers and gaps drawn with ``context_seed``)."""
    contexts: np.ndarray
    contexts_per_canary: int = 16
    context_seed: int = 0


def evaluate_exposure(canaries: CanarySet, score_fn: ScoreFn, max_seq_length: int, *,
                      counts: Optional[Sequence[int]] = None, extrapolate: bool = True,
                      max_reference: Optional[int] = None, batch_size: int = 64,
                      ties: str = "average", in_context: Optional[InContext] = None) -> dict:
    """Exposure of every canary and per-group summaries. Contains no token of any canary.

    ``in_context``: for canaries inserted into training text (:func:`insert_canaries`), the
    carriers each is queried in (:class:`InContext`). ``None``: the standalone ``[CLS] canary
    [SEP]`` query, right only for canaries trained as examples of their own
    (:func:`canary_examples`, the audit's); see docs/audits.md.

    ``counts``: realised insertion counts from :func:`insert_canaries` (reported per canary and
    as the group's mean occurrences). Returns ``{"log2_reference_size", "query": {"form":
    "standalone" | "in_context", ...}, "canaries": [{id, group,
    pattern, included, inserted, rank, exposure, exposure_extrapolated}], "groups": [{group,
    occurrences, mean_inserted, exposure: {n, mean, std, median, min, max}, exposure_extrapolated:
    {...}, by_pattern: {pattern: {...}}}]}`` with groups sorted by occurrences (held-out canaries
    form the ``held_out`` group, listed first). For a one-run audit (``dpbert.privacy.one_run_audit``)
    use ``[row["exposure_extrapolated"] for row in report["canaries"]]`` as the scores (continuous,
    unlike the rank exposure that saturates at ``log2 |R|``) and ``[c.included for c in canaries]``.
    """
    canary_list = canaries.canaries
    contexts = None if in_context is None else in_context.contexts
    contexts_per_canary = 16 if in_context is None else in_context.contexts_per_canary
    context_seed = 0 if in_context is None else in_context.context_seed
    scores = score_canaries(canary_list, score_fn, max_seq_length, batch_size, contexts=contexts,
                            contexts_per_canary=contexts_per_canary,
                            rng=np.random.default_rng(context_seed))
    secrets_ = np.asarray([c.secret for c in canary_list], dtype=np.int64)
    if canary_list:
        ranks, exposures = compute_exposure_rank(scores, secrets_, canaries.candidates, ties)
        extrapolated = (compute_exposure_extrapolation(scores, secrets_, canaries.candidates,
                                                       max_reference)
                        if extrapolate else np.full(len(canary_list), np.nan))
    else:
        ranks = exposures = extrapolated = np.zeros(0)
    if counts is not None and len(counts) != len(canary_list):
        raise CanaryError(f"{len(counts)} counts for {len(canary_list)} canaries")
    rows = []
    for i, c in enumerate(canary_list):
        rows.append({"id": c.canary_id, "group": c.group if c.included else "held_out",
                     "pattern": c.pattern, "included": bool(c.included),
                     "inserted": None if counts is None else int(counts[i]),
                     "rank": float(ranks[i]), "exposure": float(exposures[i]),
                     "exposure_extrapolated": float(extrapolated[i])})

    def order(c: Canary):
        if not c.included:
            return (-1.0, 0.0)
        return (0.0, float(c.occurrences)) if c.occurrences is not None else (1.0, float(c.probability))

    members_of: Dict[str, List[int]] = {}
    for i, r in enumerate(rows):
        members_of.setdefault(r["group"], []).append(i)
    groups = []
    for label in sorted(members_of, key=lambda g: order(canary_list[members_of[g][0]])):
        members = members_of[label]
        first = canary_list[members[0]]
        inserted = [rows[i]["inserted"] for i in members if rows[i]["inserted"] is not None]
        groups.append({
            "group": label,
            "occurrences": None if label == "held_out" else first.occurrences,
            "probability": None if label == "held_out" else first.probability,
            "mean_inserted": float(np.mean(inserted)) if inserted else None,
            "exposure": _summary(exposures[members]),
            "exposure_extrapolated": _summary(extrapolated[members]) if extrapolate else None,
            "by_pattern": {
                pattern: _summary(exposures[[i for i in members if canary_list[i].pattern == pattern]])
                for pattern in sorted({canary_list[i].pattern for i in members}, key=len)},
        })
    if contexts is None:
        query = {"form": "standalone"}
    else:
        nonempty = int(np.any(np.asarray(contexts) != PAD_ID, axis=1).sum())
        query = {"form": "in_context", "contexts_per_canary": min(int(contexts_per_canary), nonempty),
                 "carrier_rows": int(len(contexts)), "context_seed": int(context_seed)}
    return {"log2_reference_size": float(np.log2(len(canaries.candidates))), "query": query,
            "canaries": rows, "groups": groups}


def mlm_score_fn(mlm_model, max_predictions: int) -> ScoreFn:
    """Adapt a Keras MLM with inputs ``{"input_ids" [B, L], "masked_positions" [B, M]}`` and
    output logits ``[B, M, V]`` (``dpbert.network.bert.BertModels.mlm``) to a ``score_fn``: the
    masked position goes in slot 0 (other slots repeat it) and slot 0's logits are returned."""

    def score_fn(token_ids: np.ndarray, mask_positions: np.ndarray) -> np.ndarray:
        token_ids = np.asarray(token_ids, dtype=np.int32)
        positions = np.repeat(np.asarray(mask_positions, dtype=np.int32)[:, None],
                              int(max_predictions), axis=1)
        logits = mlm_model({"input_ids": token_ids, "masked_positions": positions}, training=False)
        return np.asarray(logits)[:, 0, :]

    return score_fn
