r"""dχ-privacy (metric local differential privacy) for token embeddings, vectorized in numpy.

The mechanism (Feyisetan et al. 2020; Qu et al. 2021, §3): with φ: V → ℝᵈ a FIXED, public
token-embedding table and η > 0, a token x is sent as ``M̃(x) = φ(x) + z``, z of density
``∝ exp(−η‖z‖)`` (sampled as r·u, r ~ Gamma(d, 1/η), u uniform on the sphere), and text-to-text
privatization outputs ``M(x)``, the candidate token nearest to M̃(x); the candidates are the
vocabulary minus every bracketed special token, so a special token is never output.

Contract: M is ηd(x, x')-private with d(x, x') = ‖φ(x) − φ(x')‖ (a sequence privatized with
independent noise: η Σᵢ d(xᵢ, x'ᵢ)); it is a LOCAL guarantee, with no δ, and it does not combine
into the accountant's (ε, δ) ledger. The generator is seeded from OS entropy unless a seed is
given (tests only); nearest neighbours are computed in chunks of ``chunk_elements`` floats. The
sampling derivation, the proof, and how it differs from the central (ε, δ) guarantee:
docs/local-privacy.md ("The mechanism and its proof").
"""
from __future__ import annotations

import math
import re
import secrets
from typing import Iterable, Optional, Sequence, Union

import numpy as np

#: A query × candidate distance block holds at most this many float32 values (64 MiB).
DEFAULT_CHUNK_ELEMENTS = 1 << 24
#: Bracketed tokens ([PAD], [unused12], ...) are never candidates.
_BRACKETED = re.compile(r"^\[[^\[\]]+\]$")

SeedLike = Union[None, int, np.random.Generator]


def make_rng(seed: SeedLike = None) -> np.random.Generator:
    """A numpy Generator: OS entropy when ``seed`` is None (production), else seeded (tests)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None:
        return np.random.Generator(np.random.PCG64(secrets.randbits(128)))
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    return np.random.default_rng(int(seed))


def check_eta(eta) -> float:
    """η as a float: > 0, ``math.inf`` allowed (no noise: the identity on candidate tokens)."""
    try:
        value = float(eta)
    except (TypeError, ValueError):
        raise ValueError(f"eta must be a number > 0, got {eta!r}") from None
    if isinstance(eta, bool) or math.isnan(value) or value <= 0:
        raise ValueError(f"eta must be a number > 0 (math.inf for no noise), got {eta!r}")
    return value


def is_special_token(token: str) -> bool:
    """Special tokens: BERT's five and every other bracketed token (``[unused0]``, ...)."""
    return bool(_BRACKETED.match(token))


def expected_noise_norm(dim: int, eta: float) -> float:
    """E‖z‖ = d/η."""
    return dim / check_eta(eta)


def noise_norm_std(dim: int, eta: float) -> float:
    """Standard deviation of ‖z‖: √d/η (a Gamma(d, 1/η) variable)."""
    return math.sqrt(dim) / check_eta(eta)


def sample_noise(n: int, dim: int, eta: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` draws of z ∈ ℝᵈ with density ∝ exp(−η‖z‖), float64 ``[n, d]`` (zeros if η = ∞)."""
    eta = check_eta(eta)
    if n < 0 or dim < 1:
        raise ValueError(f"need n >= 0 and dim >= 1, got n={n}, dim={dim}")
    if math.isinf(eta):
        return np.zeros((n, dim))
    radius = rng.gamma(shape=float(dim), scale=1.0 / eta, size=n)
    direction = rng.standard_normal((n, dim))
    norms = np.linalg.norm(direction, axis=1, keepdims=True)
    # ‖g‖ = 0 has probability 0 for d >= 1 (a continuous distribution); guard anyway.
    norms[norms == 0] = 1.0
    return direction / norms * radius[:, None]


class DchiMechanism:
    """dχ-privacy over one fixed embedding table (see docs/local-privacy.md).

    Args:
      table: ``[V, d]`` token embeddings (public, fixed).
      exclude_ids: token ids that are never output (special tokens); the candidates are all the
        other ids, or ``candidate_ids`` when given.
      chunk_elements: bound on the float32 values of one query × candidate distance block.
    """

    def __init__(self, table: np.ndarray, exclude_ids: Iterable[int] = (),
                 candidate_ids: Optional[Sequence[int]] = None,
                 chunk_elements: int = DEFAULT_CHUNK_ELEMENTS):
        table = np.asarray(table)
        if table.ndim != 2 or table.shape[0] < 1 or table.shape[1] < 1:
            raise ValueError(f"table must be a non-empty [V, d] matrix, got shape {table.shape}")
        if not np.all(np.isfinite(table)):
            raise ValueError("table holds non-finite values")
        self.table = np.ascontiguousarray(table, dtype=np.float32)
        vocab = self.table.shape[0]
        exclude = np.zeros(vocab, bool)
        for i in exclude_ids:
            if not 0 <= int(i) < vocab:
                raise ValueError(f"exclude id {i} outside [0, {vocab})")
            exclude[int(i)] = True
        if candidate_ids is None:
            candidates = np.flatnonzero(~exclude)
        else:
            candidates = np.unique(np.asarray(candidate_ids, dtype=np.int64))
            if candidates.size and (candidates[0] < 0 or candidates[-1] >= vocab):
                raise ValueError("candidate ids outside the table")
            candidates = candidates[~exclude[candidates]]
        if candidates.size == 0:
            raise ValueError("no candidate token left to output")
        self.candidate_ids = candidates.astype(np.int64)
        candidates_table = self.table[self.candidate_ids]
        self._candidate_sq = np.einsum("kd,kd->k", candidates_table, candidates_table)
        # −2·Cᵀ laid out for one BLAS product per block: scores = Q·(−2Cᵀ) + ‖C‖².
        self._minus_2ct = np.ascontiguousarray(-2.0 * candidates_table.T)
        self._is_candidate = np.zeros(vocab, bool)
        self._is_candidate[self.candidate_ids] = True
        self._candidate_index = np.full(vocab, -1, np.int64)
        self._candidate_index[self.candidate_ids] = np.arange(self.candidate_ids.size)
        self.chunk_rows = max(1, int(chunk_elements) // len(self.candidate_ids))

    @property
    def vocab_size(self) -> int:
        return int(self.table.shape[0])

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    def is_candidate(self, ids) -> np.ndarray:
        return self._is_candidate[np.asarray(ids, dtype=np.int64)]

    def distance(self, x: int, y: int) -> float:
        """d(x, y) = ‖φ(x) − φ(y)‖ (float64)."""
        return float(np.linalg.norm(self.table[x].astype(np.float64) - self.table[y].astype(np.float64)))

    def privacy_loss_bound(self, x: int, y: int, eta: float) -> float:
        """η·d(x, y): the log-ratio bound of any output's probability under inputs x and y."""
        return check_eta(eta) * self.distance(x, y)

    # -------------------------------------------------------------------- vectors

    def noisy_embeddings(self, ids, eta: float, rng: np.random.Generator) -> np.ndarray:
        """φ(x) + z for every id (any shape) → float32 ``[*ids.shape, d]`` (token representation
        privatization; what an embedding-inversion attacker observes)."""
        ids = self._check_ids(ids)
        flat = ids.reshape(-1)
        out = self.table[flat] + sample_noise(flat.size, self.dim, eta, rng).astype(np.float32)
        return out.reshape(ids.shape + (self.dim,))

    def nearest(self, vectors: np.ndarray) -> np.ndarray:
        """Id of the candidate nearest (Euclidean) to each row of ``[n, d]`` vectors."""
        vectors = np.asarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        out = np.empty(vectors.shape[0], np.int64)
        for start in range(0, vectors.shape[0], self.chunk_rows):
            scores = self._scores(vectors[start:start + self.chunk_rows])
            out[start:start + scores.shape[0]] = self.candidate_ids[np.argmin(scores, axis=1)]
        return out

    def _scores(self, block: np.ndarray) -> np.ndarray:
        """``‖c‖² − 2 q·c`` for every query row q and candidate c (= ‖q − c‖² − ‖q‖²)."""
        scores = block @ self._minus_2ct
        scores += self._candidate_sq
        return scores

    def ranks(self, vectors: np.ndarray, true_ids) -> np.ndarray:
        """Rank of each true id among the candidates by distance to its vector (0 = nearest);
        -1 where the true id is not a candidate. ``rank < k`` is a top-k inversion hit."""
        vectors = np.asarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        true_ids = np.asarray(true_ids, dtype=np.int64).reshape(-1)
        ranks = np.full(true_ids.shape[0], -1, np.int64)
        for start in range(0, vectors.shape[0], self.chunk_rows):
            scores = self._scores(vectors[start:start + self.chunk_rows])
            column = self._candidate_index[true_ids[start:start + scores.shape[0]]]
            # The true token's own score from the same product, so rounding cannot rank it
            # behind itself; ties count in the token's favour.
            own = scores[np.arange(scores.shape[0]), np.maximum(column, 0)]
            rank = np.sum(scores < own[:, None], axis=1)
            ranks[start:start + scores.shape[0]] = np.where(column >= 0, rank, -1)
        return ranks

    # -------------------------------------------------------------------- tokens

    def privatize_ids(self, ids, eta: float, rng: np.random.Generator,
                      keep_ids: Iterable[int] = ()) -> np.ndarray:
        """Text-to-text privatization of every token id (any shape, same shape out, int64).

        Positions holding one of ``keep_ids`` are copied unchanged (e.g. ``[PAD]``, ``[CLS]``,
        ``[SEP]`` framing a model input: structure, not content). Every other position gets
        fresh, independent noise. With η = ∞ a candidate token maps to itself and a
        non-candidate input (e.g. ``[UNK]``) to its nearest candidate.
        """
        eta = check_eta(eta)
        ids = self._check_ids(ids)
        flat = ids.reshape(-1)
        out = flat.copy()
        keep_ids = np.asarray(list(keep_ids), dtype=np.int64)
        keep = np.isin(flat, keep_ids) if keep_ids.size else np.zeros(flat.size, bool)
        todo = np.flatnonzero(~keep)
        if math.isinf(eta):
            identity = self._is_candidate[flat[todo]]
            todo = todo[~identity]
        for start in range(0, todo.size, self.chunk_rows):
            where = todo[start:start + self.chunk_rows]
            noisy = self.table[flat[where]] + sample_noise(where.size, self.dim, eta, rng).astype(np.float32)
            out[where] = self.nearest(noisy)
        return out.reshape(ids.shape)

    def _check_ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"token ids must be integers, got dtype {ids.dtype}")
        ids = ids.astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"token ids outside [0, {self.vocab_size})")
        return ids


def special_ids_of(tokens: Sequence[str]) -> np.ndarray:
    """Ids of the special (bracketed) tokens of a vocabulary."""
    return np.asarray([i for i, t in enumerate(tokens) if is_special_token(t)], dtype=np.int64)


__all__ = ["DchiMechanism", "make_rng", "check_eta", "sample_noise", "expected_noise_norm", "noise_norm_std",
           "is_special_token", "special_ids_of", "DEFAULT_CHUNK_ELEMENTS"]
