"""Plausible-deniability estimators and the inversion attack on tables with known answers."""
import math

import numpy as np
import pytest

from dpbert.local_privacy import deniability as den
from dpbert.local_privacy.dchi import DchiMechanism


def test_summarize():
    s = den.summarize([1, 2, 3, 4, 5])
    assert (s["mean"], s["median"], s["min"], s["max"], s["p50"], s["count"]) == (3, 3, 1, 5, 3, 5)
    with pytest.raises(ValueError):
        den.summarize([])


def test_well_separated_large_eta_gives_full_counts(separated_embeddings):
    mechanism = separated_embeddings.mechanism()
    n = 50
    # d = 33 one-hot rows at distance √2: E‖z‖ = 33/η = 0.0033 at η = 1e4, far below √2/2.
    rows = den.deniability_report(mechanism, [1e4, math.inf], n_draws=n, rng=0)
    for row in rows:
        assert np.all(row["N"] == n) and np.all(row["S"] == 1)
        assert row["N_w"]["mean"] == n and row["S_w"]["median"] == 1


def test_small_eta_spreads_outputs(separated_embeddings):
    mechanism = separated_embeddings.mechanism()
    counts = den.deniability_counts(mechanism, mechanism.candidate_ids, 1.0, 50, rng=1)
    assert counts["N"].mean() < 10 and counts["S"].mean() > 10
    assert np.all(counts["S"] <= 50) and np.all(counts["N"] <= 50)


def test_N_w_matches_the_exact_laplace_probability():
    """d = 1, table 0, 1, 3: P[M(0) = 0] = 1 − ½e^{−η/2} (Laplace noise), so E[N_w] = n·that."""
    mechanism = DchiMechanism(np.array([[0.0], [1.0], [3.0]], np.float32))
    eta, n = 2.0, 400
    counts = den.deniability_counts(mechanism, np.zeros(200, int), eta, n, rng=3)
    p = 1 - 0.5 * math.exp(-eta * 0.5)
    sd = math.sqrt(n * p * (1 - p) / 200)  # of the mean over 200 tokens
    assert abs(counts["N"].mean() - n * p) < 4 * sd
    assert set(np.unique(counts["S"])) <= {1, 2, 3}


def test_inversion_attack(separated_embeddings):
    mechanism = separated_embeddings.mechanism()
    corpus = np.concatenate([mechanism.candidate_ids, [0, 1, 2]])  # specials are skipped
    high = den.inversion_attack(mechanism, corpus, 1e4, rng=0)
    assert high["tokens"] == mechanism.candidate_ids.size
    assert high["top1"] == high["top5"] == 1.0
    low = den.inversion_attack(mechanism, np.repeat(corpus, 20), 1.0, rng=0)
    assert low["top1"] < 0.3 and low["top1"] <= low["top5"] <= low["top10"]


def test_tables_and_plots(tmp_path, separated_embeddings):
    mechanism = separated_embeddings.mechanism()
    rows = den.deniability_report(mechanism, [math.inf, 5.0, 1.0], n_draws=20, rng=0)
    inv = den.inversion_report(mechanism, mechanism.candidate_ids, [math.inf, 5.0, 1.0], rng=0)
    text = den.format_tables(rows, inv)
    assert "| ∞ |" in text and "inversion top1" in text
    for path in (den.plot_deniability(rows, tmp_path / "d.png"), den.plot_inversion(inv, tmp_path / "i.png")):
        assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_corpora_token_ids(toy_embeddings):
    ids = den.corpus_token_ids(toy_embeddings.tokenizer, [["the", "patient"], ["fever"]])
    assert ids.tolist() == [toy_embeddings.token_id(t) for t in ("the", "patient", "fever")]
    assert len(den.bc5cdr_words("test")) == 300
    assert den.synthetic_words(patients=1)
