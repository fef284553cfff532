"""How much a dχ-privatization hides: plausible-deniability statistics and an inversion attack.

Plausible deniability (Feyisetan et al. 2020; Qu et al. 2021 §5), per token w, over n
independent privatizations of w:

* ``N_w`` — how many of the n outputs are w itself (high = little deniability);
* ``S_w`` — how many DISTINCT tokens the n outputs are (high = many plausible sources).

They are computed for a sample of candidate tokens and summarized over it (mean, median,
percentiles); with well-separated embeddings and a large η, N_w = n and S_w = 1.

Token-embedding inversion attack: an attacker who sees the noisy representation φ(x) + z guesses
the token(s) nearest to it. Its top-1 accuracy on a corpus is the corpus-frequency-weighted
probability that text-to-text privatization leaves a token unchanged; top-k counts a hit when
the true token is among the k nearest. Measured on real text: the bundled BC5CDR subset
(public PubMed abstracts) or the synthetic clinical corpus.

Plots are written with matplotlib's Agg backend as PNG files.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import numpy as np

from dpbert.local_privacy.dchi import DchiMechanism, SeedLike, check_eta, make_rng

DEFAULT_PERCENTILES = (5, 10, 25, 50, 75, 90, 95)


def summarize(values, percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> Dict[str, float]:
    """mean, std, min, max and the given percentiles (``p50`` is the median) of ``values``."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("nothing to summarize")
    out = {"count": int(values.size), "mean": float(values.mean()), "std": float(values.std()),
           "min": float(values.min()), "max": float(values.max()), "median": float(np.median(values))}
    for p in percentiles:
        out[f"p{p:g}"] = float(np.percentile(values, p))
    return out


def deniability_counts(mechanism: DchiMechanism, token_ids, eta: float, n_draws: int,
                       rng: SeedLike = None) -> Dict[str, np.ndarray]:
    """``N_w`` and ``S_w`` for each of ``token_ids`` over ``n_draws`` privatizations each."""
    check_eta(eta)
    if n_draws < 1:
        raise ValueError(f"n_draws must be >= 1, got {n_draws}")
    rng = make_rng(rng)
    token_ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    draws = mechanism.privatize_ids(np.repeat(token_ids[:, None], n_draws, axis=1), eta, rng)
    n_same = np.sum(draws == token_ids[:, None], axis=1)
    ordered = np.sort(draws, axis=1)
    n_distinct = 1 + np.sum(ordered[:, 1:] != ordered[:, :-1], axis=1)
    return {"token_ids": token_ids, "N": n_same, "S": n_distinct}


def sample_tokens(mechanism: DchiMechanism, count: Optional[int], rng: SeedLike = 0) -> np.ndarray:
    """``count`` candidate tokens drawn uniformly without replacement (all when None / too many)."""
    ids = mechanism.candidate_ids
    if count is None or count >= ids.size:
        return ids.copy()
    return np.sort(make_rng(rng).choice(ids, size=int(count), replace=False))


def deniability_report(mechanism: DchiMechanism, etas: Sequence[float], n_draws: int = 100,
                       token_ids=None, rng: SeedLike = None) -> List[dict]:
    """One row per η: summaries of N_w and S_w (and the raw arrays under ``N`` / ``S``)."""
    rng = make_rng(rng)
    token_ids = mechanism.candidate_ids if token_ids is None else np.asarray(token_ids, np.int64)
    rows = []
    for eta in etas:
        counts = deniability_counts(mechanism, token_ids, eta, n_draws, rng)
        rows.append({"eta": float(eta), "n_draws": int(n_draws), "tokens": int(token_ids.size),
                     "N_w": summarize(counts["N"]), "S_w": summarize(counts["S"]),
                     "N": counts["N"], "S": counts["S"]})
    return rows


def inversion_attack(mechanism: DchiMechanism, corpus_ids, eta: float, rng: SeedLike = None,
                     top_k: Sequence[int] = (1, 5, 10)) -> Dict[str, float]:
    """Nearest-neighbour inversion of φ(x) + z over a corpus of token ids (non-candidates, e.g.
    special tokens, are skipped): top-k accuracies."""
    eta = check_eta(eta)
    rng = make_rng(rng)
    ids = np.asarray(corpus_ids, dtype=np.int64).reshape(-1)
    ids = ids[mechanism.is_candidate(ids)]
    if ids.size == 0:
        raise ValueError("no candidate token in the corpus")
    ranks = np.empty(ids.size, np.int64)
    step = max(1, mechanism.chunk_rows)
    for start in range(0, ids.size, step):
        chunk = ids[start:start + step]
        ranks[start:start + chunk.size] = mechanism.ranks(mechanism.noisy_embeddings(chunk, eta, rng), chunk)
    out = {"eta": eta, "tokens": int(ids.size)}
    for k in top_k:
        out[f"top{k}"] = float(np.mean(ranks < k))
    return out


def inversion_report(mechanism: DchiMechanism, corpus_ids, etas: Sequence[float], rng: SeedLike = None,
                     top_k: Sequence[int] = (1, 5, 10)) -> List[dict]:
    rng = make_rng(rng)
    return [inversion_attack(mechanism, corpus_ids, eta, rng, top_k) for eta in etas]


# ------------------------------------------------------------------------------------- corpora

def bc5cdr_words(split: str = "train") -> List[List[str]]:
    """Sentences of the bundled BC5CDR subset as word lists (public PubMed text)."""
    from dpbert.evaluate.ner import bundled_bc5cdr

    return [list(s.tokens) for s in bundled_bc5cdr(split)]


def synthetic_words(patients: int = 10, seed: int = 1234) -> List[List[str]]:
    """Notes of the synthetic clinical corpus as word lists."""
    from dpbert.data.synthetic import generate_notes
    from dpbert.data.words import split_words

    return [split_words(doc.text) for doc in generate_notes(patients, 1, 1, seed)]


def corpus_token_ids(tokenizer, word_lists: Sequence[Sequence[str]]) -> np.ndarray:
    """All WordPiece ids of the word lists (no special tokens), concatenated."""
    encodings = tokenizer.encode_batch([list(w) for w in word_lists], is_pretokenized=True,
                                       add_special_tokens=False)
    return np.fromiter((i for e in encodings for i in e.ids), dtype=np.int64)


# ------------------------------------------------------------------------------------- tables, plots

def _eta_label(eta: float) -> str:
    return "∞" if math.isinf(eta) else f"{eta:g}"


def format_tables(deniability_rows: Sequence[dict], inversion_rows: Sequence[dict] = ()) -> str:
    """Markdown tables of the summaries."""
    lines = []
    if deniability_rows:
        n = deniability_rows[0]["n_draws"]
        lines += [f"| η | N_w mean | N_w median | N_w p10–p90 | S_w mean | S_w median | S_w p10–p90 |  (n = {n})",
                  "|---|---|---|---|---|---|---|"]
        for row in deniability_rows:
            a, b = row["N_w"], row["S_w"]
            lines.append(f"| {_eta_label(row['eta'])} | {a['mean']:.1f} | {a['median']:g} | {a['p10']:g}–{a['p90']:g} | "
                         f"{b['mean']:.1f} | {b['median']:g} | {b['p10']:g}–{b['p90']:g} |")
    if inversion_rows:
        keys = [k for k in inversion_rows[0] if k.startswith("top")]
        lines += ["", "| η | " + " | ".join(f"inversion {k}" for k in keys) + " | tokens |",
                  "|---|" + "---|" * (len(keys) + 1)]
        for row in inversion_rows:
            lines.append(f"| {_eta_label(row['eta'])} | " + " | ".join(f"{row[k]:.3f}" for k in keys)
                         + f" | {row['tokens']} |")
    return "\n".join(lines)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_deniability(rows: Sequence[dict], path) -> str:
    """Box plots of N_w and S_w per η (PNG)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    labels = [_eta_label(r["eta"]) for r in rows]
    for ax, key, title in ((axes[0], "N", "N_w: outputs equal to the input"),
                           (axes[1], "S", "S_w: distinct outputs")):
        ax.boxplot([np.asarray(r[key]) for r in rows], tick_labels=labels, showfliers=False)
        ax.plot(range(1, len(rows) + 1), [float(np.mean(r[key])) for r in rows], "o--", label="mean")
        ax.set_xlabel("η")
        ax.set_title(f"{title} (n = {rows[0]['n_draws']})")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def plot_inversion(rows: Sequence[dict], path, title: str = "token-embedding inversion") -> str:
    """Inversion accuracy (top-k) against η (PNG)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    finite = [r for r in rows if math.isfinite(r["eta"])]
    for key in [k for k in rows[0] if k.startswith("top")]:
        ax.plot([r["eta"] for r in finite], [r[key] for r in finite], "o-", label=key)
    ax.set_xlabel("η")
    ax.set_ylabel("attack accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


__all__ = ["summarize", "deniability_counts", "deniability_report", "sample_tokens", "inversion_attack",
           "inversion_report", "bc5cdr_words", "synthetic_words", "corpus_token_ids", "format_tables",
           "plot_deniability", "plot_inversion"]
