"""Canaries: generation, private serialization, insertion, exposure (rank and extrapolation)."""
import json
import math
import os
import stat

import numpy as np
import pytest
from scipy import stats

from dpbert.evaluate import canary as C
from dpbert.evaluate.canary import Canary, CanaryError, CanarySet

# Distinctive ids (never produced by a repr's counters) to detect leaks of canary tokens.
LEAK_IDS = np.arange(987_600, 987_700, dtype=np.int32)
LEAK_VOCAB = 1_000_000


def leaky_set():
    return C.make_canary_set(LEAK_IDS, LEAK_VOCAB, occurrences=[1, 10], patterns=["HS", "HHSHH"],
                             canaries_per_group=3, rng=np.random.default_rng(0))


def assert_no_leak(text):
    assert "98765" not in text


# ------------------------------------------------------------------------- candidates

def test_candidate_ids_excludes_specials_brackets_and_continuations(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "the", "##s", "pain", ",",
             "##ing", "chest"]
    np.testing.assert_array_equal(C.candidate_ids(vocab), [6, 8, 9, 11])
    np.testing.assert_array_equal(C.candidate_ids(vocab, exclude_continuations=False), [6, 7, 8, 9, 10, 11])
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    np.testing.assert_array_equal(C.candidate_ids(tmp_path / "vocab.txt"), [6, 8, 9, 11])
    np.testing.assert_array_equal(C.candidate_ids(vocab_size=8), [5, 6, 7])
    with pytest.raises(ValueError):
        C.candidate_ids(["[PAD]", "the"])


def test_occurrence_groups():
    assert C.occurrence_groups(500) == [1, 10, 100, 500]
    assert C.occurrence_groups(1000) == [1, 10, 100, 1000]
    assert C.occurrence_groups(7) == [1, 7]
    assert C.occurrence_groups(1) == [1]
    assert C.occurrence_groups(10_000, max_fraction=0.05) == [1, 10, 100, 500]
    assert C.occurrence_groups(300, base=2, max_fraction=0.1) == [1, 2, 4, 8, 16, 30]


# ------------------------------------------------------------------------- canaries

def test_make_canary_set_patterns_groups_and_candidates():
    candidates = np.arange(5, 105, dtype=np.int32)
    cs = C.make_canary_set(candidates, 105, occurrences=[1, 10, 100], probabilities=[0.01],
                           canaries_per_group=2, rng=np.random.default_rng(1))
    assert len(cs) == 4 * len(C.PATTERNS) * 2
    assert cs.groups() == ["n=1", "n=10", "n=100", "p=0.01"]
    for c in cs:
        assert c.k == len(c.pattern) and set(c.tokens) <= set(candidates.tolist())
        assert c.tokens[c.secret_index] == c.secret and c.pattern[c.secret_index] == "S"
    assert {c.pattern: c.secret_index for c in cs} == {"HS": 1, "HSH": 1, "HSHH": 1, "HHSHH": 2}
    assert [c.canary_id for c in cs] == list(range(len(cs)))


def test_hints_are_distinct_within_a_set():
    # 4 candidates: 4 possible hint values for "HS" -> the 5th "HS" canary cannot be drawn
    four = LEAK_IDS[:4]
    cs = C.make_canary_set(four, LEAK_VOCAB, occurrences=[1], patterns=["HS"],
                           canaries_per_group=4, rng=np.random.default_rng(2))
    assert sorted(c.tokens[0] for c in cs) == sorted(four.tolist())
    with pytest.raises(CanaryError, match="distinct") as info:
        C.make_canary_set(four, LEAK_VOCAB, occurrences=[1], patterns=["HS"],
                          canaries_per_group=5, rng=np.random.default_rng(2))
    assert_no_leak(str(info.value))


def test_default_draws_come_from_the_os_csprng_and_are_uniform():
    # no rng: secrets.SystemRandom. 4000 draws over 100 candidates (40 expected per cell); a
    # chi-square goodness-of-fit test rejects uniformity with probability 1e-6.
    cs = C.make_canary_set(LEAK_IDS, LEAK_VOCAB, occurrences=[1], patterns=["HHSHH"],
                           canaries_per_group=800)
    draws = np.concatenate([c.tokens for c in cs])
    counts = np.array([np.sum(draws == t) for t in LEAK_IDS])
    assert counts.sum() == 4000
    assert stats.chisquare(counts).pvalue > 1e-6


def test_repr_str_and_errors_never_show_tokens():
    cs = leaky_set()
    for text in (repr(cs), str(cs), f"{cs}", repr(cs.canaries), str(cs.canaries[0]),
                 repr(cs.canaries[-1])):
        assert_no_leak(text)
        assert "hidden" in text
    assert "6 canaries" not in repr(cs) and "12 canaries" in repr(cs)
    # error messages about canaries name ids, never tokens
    bad = Canary(canary_id=7, pattern="HS", tokens=(987_651, 987_752), occurrences=1)
    with pytest.raises(CanaryError) as info:
        CanarySet([bad], LEAK_IDS, LEAK_VOCAB)
    assert "canary 7" in str(info.value)
    assert_no_leak(str(info.value))
    with pytest.raises(CanaryError) as info:
        C.compute_exposure_rank(np.zeros((1, 10)), [9], [5, 6, 7])
    assert "9" not in str(info.value)
    with pytest.raises(CanaryError) as info:
        Canary(canary_id=3, pattern="HSS", tokens=(987_651, 987_653, 987_657), occurrences=1)
    assert_no_leak(str(info.value))


def test_save_load_round_trip_private_file(tmp_path):
    cs = leaky_set()
    path = cs.save(tmp_path / "sub" / "canaries.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    data = json.loads(path.read_text())
    assert data["format"] == "dpbert.canary_set" and data["private"] is True
    loaded = CanarySet.load(path)
    assert [c.to_dict() for c in loaded] == [c.to_dict() for c in cs]
    np.testing.assert_array_equal(loaded.candidates, cs.candidates)
    assert loaded.vocab_size == LEAK_VOCAB
    # corrupted files: errors without content
    path.write_text(path.read_text()[:-40])
    with pytest.raises(CanaryError) as info:
        CanarySet.load(path)
    assert_no_leak(str(info.value))
    data["canaries"][0].pop("tokens")
    path.write_text(json.dumps(data))
    with pytest.raises(CanaryError, match="malformed"):
        CanarySet.load(path)
    with pytest.raises(CanaryError, match="not a canary set"):
        CanarySet.from_dict({"canaries": []})


# ------------------------------------------------------------------------- insertion

def make_examples(lengths, L, rng):
    """[CLS] content(ids 100..199) [SEP] pad; length 0 = an all-padding row."""
    rows = np.zeros((len(lengths), L), dtype=np.int32)
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        content = rng.integers(100, 200, size=n - 2)
        rows[i, :n] = [C.CLS_ID, *content, C.SEP_ID]
    return rows


def find(row, tokens):
    k = len(tokens)
    return [j for j in range(len(row) - k + 1) if tuple(row[j:j + k]) == tuple(tokens)]


def strip_canaries(row, canaries):
    """The row with every whole canary occurrence removed (canary ids are >= 500)."""
    return [int(t) for t in row if t < 500]


def test_insert_canaries_counts_structure_and_content_preserved():
    rng = np.random.default_rng(3)
    L = 24
    lengths = [24, 10, 0, 2, 15, 24, 5, 12, 20, 8] * 5
    examples = make_examples(lengths, L, rng)
    cs = C.make_canary_set(np.arange(500, 600), 600, occurrences=[1, 5, 20], patterns=["HSH", "HS"],
                           canaries_per_group=2, rng=rng)
    held_out = Canary(canary_id=99, pattern="HS", tokens=(598, 599), occurrences=3, included=False)
    canaries = list(cs) + [held_out]
    out, counts = C.insert_canaries(examples, canaries, 4, rows_planned=len(examples))
    assert out.shape == examples.shape and out.dtype == examples.dtype
    # per-row decisions: about `occurrences` rows each (Binomial), the held-out canary in none
    assert counts[-1] == 0 and all(counts[i] > 0 for i, c in enumerate(canaries) if c.occurrences == 20)
    for c, n in zip(canaries, counts):
        assert sum(1 for row in out if find(row, c.tokens)) == n
    truncated = []
    for original, row, length in zip(examples, out, lengths):
        if length == 0:
            assert not row.any()                       # all-padding rows untouched
            continue
        new_length = int(np.nonzero(row)[0][-1]) + 1
        assert row[0] == C.CLS_ID and row[new_length - 1] == C.SEP_ID
        assert not row[new_length:].any() and new_length <= L
        assert (row[1:new_length - 1] != C.SEP_ID).all() and (row[1:new_length - 1] != C.CLS_ID).all()
        # the original content survives, in order, truncated at the end only
        kept = strip_canaries(row[:new_length], canaries)
        orig = [int(t) for t in original[:length]]
        assert kept == orig[:len(kept) - 1] + [C.SEP_ID]
        inserted_tokens = new_length - len(kept)
        assert len(kept) == min(length, L - inserted_tokens)
        truncated.append(len(kept) < length)
    assert any(truncated) and not all(truncated)  # full rows lost their tail, others did not


def test_insert_canaries_errors_and_canaries_that_do_not_fit():
    examples = make_examples([6, 6, 0], 8, np.random.default_rng(0))
    c = Canary(canary_id=0, pattern="HS", tokens=(500, 501), occurrences=3)
    with pytest.raises(CanaryError, match="need rows_planned"):
        C.insert_canaries(examples, [c], 0)
    # room for 6 tokens between [CLS] and [SEP]: a 5-token canary fits, a second one does not
    big = [Canary(canary_id=i, pattern="HHSHH", tokens=(510 + i,) * 5, occurrences=2) for i in range(2)]
    out, counts = C.insert_canaries(examples, big, 0, rows_planned=2)  # p = 2/2: every row
    # both rows were chosen for both canaries, but each row holds exactly one of them
    assert counts.sum() == 2
    for row in out[:2]:
        assert row[0] == C.CLS_ID and row[7] == C.SEP_ID
        assert sum(len(find(row, c.tokens)) for c in big) == 1
        assert len(strip_canaries(row, big)) == 3  # [CLS] + 1 content token + [SEP]
    assert not out[2].any()
    # rows without [CLS]/[SEP] (raw pieces) are filled up to L, content truncated at the end
    raw = np.array([[7, 8, 9, 0, 0, 0], [7, 8, 9, 10, 11, 12]], dtype=np.int64)
    one = Canary(canary_id=5, pattern="HSH", tokens=(600, 601, 602), occurrences=2)
    out, counts = C.insert_canaries(raw, [one], 1, rows_planned=2)
    assert out.dtype == np.int64 and counts.tolist() == [2]
    for row in out:
        assert len(find(row, one.tokens)) == 1 and strip_canaries(row, [one]) == [7, 8, 9]
    with pytest.raises(CanaryError):
        C.insert_canaries(np.zeros(5, np.int32), [c])


def _carried(out, canaries):
    return [tuple(bool(find(row, c.tokens)) for c in canaries) for row in out]


def test_adding_a_row_never_changes_which_canaries_other_rows_carry():
    """Neighbouring datasets: insert one row anywhere; every other row keeps exactly its canaries."""
    rng = np.random.default_rng(11)
    examples = make_examples([14] * 60, 24, rng)
    ids = np.arange(1000, 1060)
    canaries = list(C.make_canary_set(np.arange(500, 600), 600, occurrences=[3, 10], patterns=["HS"],
                                      canaries_per_group=2, rng=rng))
    base, _ = C.insert_canaries(examples, canaries, 99, row_ids=ids, rows_planned=60)
    extra = make_examples([14], 24, np.random.default_rng(12))[0]
    for position in (0, 30, 60):
        out, _ = C.insert_canaries(np.insert(examples, position, extra, axis=0), canaries, 99,
                                   row_ids=np.insert(ids, position, 7), rows_planned=60)
        np.testing.assert_array_equal(np.delete(out, position, axis=0), base)


def test_positive_control_decisions_keyed_by_row_position_move_between_rows():
    """Keyed by the row's position instead of its record id, an insertion at the front re-draws
    every later row's canaries: the check above catches it."""
    rng = np.random.default_rng(11)
    examples = make_examples([14] * 60, 24, rng)
    canaries = list(C.make_canary_set(np.arange(500, 600), 600, occurrences=[3, 10], patterns=["HS"],
                                      canaries_per_group=2, rng=rng))
    base, _ = C.insert_canaries(examples, canaries, 99, rows_planned=60)  # row_ids = row index
    out, _ = C.insert_canaries(np.insert(examples, 0, examples[0], axis=0), canaries, 99, rows_planned=60)
    assert not np.array_equal(out[1:], base)


def test_insertion_probability_and_position_are_uniform():
    L, n = 16, 3000
    examples = make_examples([11] * n, L, np.random.default_rng(5))  # 9 content tokens, 10 gaps
    # probability mode: 20 canaries, count ~ Binomial(n, p): mean 600, sd sqrt(n p (1-p)) ~ 20.5
    p = 0.2
    canaries = [Canary(canary_id=i, pattern="HS", tokens=(500 + i, 520 + i), probability=p)
                for i in range(20)]
    _, counts = C.insert_canaries(examples, canaries, 6)
    sd = math.sqrt(n * p * (1 - p))
    assert np.all(np.abs(counts - n * p) < 5 * sd)
    assert abs(counts.mean() - n * p) < 4 * sd / math.sqrt(20)
    # position: one canary in every example; the gap index is uniform on {0..9}
    one = Canary(canary_id=0, pattern="HSH", tokens=(600, 601, 602), occurrences=n)
    out, counts = C.insert_canaries(examples, [one], 7, rows_planned=n)
    assert counts[0] == n
    gaps = np.array([find(row, one.tokens)[0] - 1 for row in out])
    assert gaps.min() == 0 and gaps.max() == 9
    # mean of U{0..9} is 4.5, sd 2.87: the sample mean has sd 2.87 / sqrt(n) ~ 0.052
    assert abs(gaps.mean() - 4.5) < 4 * math.sqrt(99 / 12 / n)
    assert stats.chisquare(np.bincount(gaps, minlength=10)).pvalue > 1e-4


def test_canary_examples():
    c1 = Canary(canary_id=0, pattern="HSH", tokens=(10, 11, 12), occurrences=1)
    c2 = Canary(canary_id=1, pattern="HHSHH", tokens=(20, 21, 22, 23, 24), occurrences=1)
    ids, pos = C.canary_examples([c1, c2], 8, mask_secret=True)
    np.testing.assert_array_equal(ids, [[2, 10, 4, 12, 3, 0, 0, 0], [2, 20, 21, 4, 23, 24, 3, 0]])
    np.testing.assert_array_equal(pos, [2, 3])
    ids, _ = C.canary_examples([c1], 5)
    np.testing.assert_array_equal(ids, [[2, 10, 11, 12, 3]])
    with pytest.raises(CanaryError):
        C.canary_examples([c2], 6)


# ------------------------------------------------------------------------- exposure

def test_compute_exposure_rank_known_ranks():
    V = 10
    candidates = np.arange(5, 10)                        # |R| = 5
    logits = np.full((4, V), 100.0)                      # specials score high: must not count
    logits[0, 5:] = [0.1, 0.9, 0.5, 0.7, 0.2]            # secret 7: 6 and 8 are higher -> rank 3
    logits[1, 5:] = [0.0, 0.0, 9.0, 0.0, 0.0]            # secret 7 top -> rank 1
    logits[2, 5:] = 1.0                                  # all tied
    logits[3, 5:] = [5.0, 4.0, 3.0, 2.0, 1.0]            # secret 9 last -> rank 5
    secrets_ = [7, 7, 7, 9]
    ranks, exposure = C.compute_exposure_rank(logits, secrets_, candidates)
    np.testing.assert_allclose(ranks, [3, 1, 3, 5])
    np.testing.assert_allclose(exposure, [math.log2(5 / 3), math.log2(5), math.log2(5 / 3), 0.0])
    ranks_max, _ = C.compute_exposure_rank(logits, secrets_, candidates, ties="max")
    ranks_min, _ = C.compute_exposure_rank(logits, secrets_, candidates, ties="min")
    np.testing.assert_allclose(ranks_max, [3, 1, 5, 5])
    np.testing.assert_allclose(ranks_min, [3, 1, 1, 5])
    # log-probabilities instead of logits: same ranks
    log_probs = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) - logits.max(1, keepdims=True)
    np.testing.assert_allclose(C.compute_exposure_rank(log_probs, secrets_, candidates)[0], ranks)


def test_exposure_interpolation_matches_tf_privacy_definition():
    reference = [8, 1, 7, 2, 6, 3, 5, 4]                 # 8 references, log2 8 = 3 bits
    exposure = C.exposure_interpolation([0.5, 3.5, 10], reference)
    # ranks 1 + #{reference < secret}: 1, 4, 9
    np.testing.assert_allclose(exposure, [3.0, 1.0, 3 - math.log2(9)])


def test_exposure_extrapolation_recovers_a_skew_normal_tail():
    rng = np.random.default_rng(11)
    a, loc, scale = 4.0, 10.0, 2.0
    n = 20_000
    reference = stats.skewnorm.rvs(a, loc, scale, size=n, random_state=rng)
    # a secret at the reference's 1% quantile: empirical exposure log2(1/F_n(x)) has sd
    # ~ sqrt((1-p)/(n p)) / ln 2 = 0.10 bits; the fitted tail must agree within 0.3 bits.
    x = np.quantile(reference, 0.01)
    extrapolated, params = C.exposure_extrapolation([x], reference)
    empirical = C.exposure_interpolation([x], reference)[0]
    assert abs(extrapolated[0] - empirical) < 0.3
    assert abs(extrapolated[0] - (-math.log2(stats.skewnorm.cdf(x, a, loc, scale)))) < 0.3
    np.testing.assert_allclose(params, (a, loc, scale), rtol=0.15)
    # beyond the rank's resolution: below every reference the rank saturates at log2 n bits,
    # the extrapolation keeps growing
    below = reference.min() - 1.0
    far = C.exposure_extrapolation([below], reference)[0][0]
    assert C.exposure_interpolation([below], reference)[0] == pytest.approx(math.log2(n))
    assert far > math.log2(n) + 1


def test_compute_exposure_extrapolation_on_mlm_scores():
    rng = np.random.default_rng(12)
    V = 1005
    candidates = np.arange(5, V)
    logits = np.zeros((3, V))
    logits[:, 5:] = -stats.skewnorm.rvs(3.0, 0.0, 1.0, size=(3, V - 5), random_state=rng)
    secrets_ = np.array([100, 200, 300])
    logits[0, 100] = 20.0                                # memorised: far above every other candidate
    logits[2, 300] = logits[2, 5:].min() - 0.5            # the least likely candidate
    extrapolated = C.compute_exposure_extrapolation(logits, secrets_, candidates)
    _, ranked = C.compute_exposure_rank(logits, secrets_, candidates)
    assert ranked[0] == pytest.approx(math.log2(1000))
    assert extrapolated[0] > math.log2(1000) + 5        # resolves past log2 |R|
    assert extrapolated[2] < 0.01 and ranked[2] == 0.0
    # row 1 equals the plain extrapolation on its perplexities, excluding the secret
    perplexity = -(logits[1] - np.log(np.exp(logits[1]).sum()))
    others = np.delete(candidates, np.nonzero(candidates == 200)[0])
    expected = C.exposure_extrapolation([perplexity[200]], perplexity[others])[0][0]
    assert extrapolated[1] == pytest.approx(expected, rel=1e-6)


def test_evaluate_exposure_groups_with_a_memorising_toy_model():
    """A toy 'model' that has memorised every canary inserted >= 10 times and knows nothing
    about the others (uniformly random logits): exposure is log2|R| for the former; for the
    latter the rank is uniform on 1..|R| and the mean exposure is log2|R| - E[log2 rank]."""
    V = 205
    candidates = np.arange(5, V)                         # |R| = 200
    # 5 canaries per (group, pattern): each costs a skew-normal fit (~50 ms), and the rank check
    # below keeps its 4-sd tolerance at its n
    cs = C.make_canary_set(candidates, V, occurrences=[1, 10, 100], canaries_per_group=5,
                           rng=np.random.default_rng(13))
    counts = np.array([c.occurrences for c in cs])  # realised counts as insert_canaries reports them
    memorised = {tuple(c.tokens[:c.secret_index]) + ("S",) + tuple(c.tokens[c.secret_index + 1:]): c.secret
                 for c, n in zip(cs, counts) if n >= 10}
    noise = np.random.default_rng(16)
    calls = []

    def score_fn(token_ids, mask_positions):
        calls.append(token_ids.shape)
        out = noise.normal(size=(len(token_ids), V))
        for i, (row, pos) in enumerate(zip(token_ids, mask_positions)):
            assert row[pos] == C.MASK_ID
            end = int(np.nonzero(row == C.SEP_ID)[0][0])
            key = tuple(int(t) for t in row[1:pos]) + ("S",) + tuple(int(t) for t in row[pos + 1:end])
            if key in memorised:
                out[i, memorised[key]] = 50.0
        return out

    report = C.evaluate_exposure(cs, score_fn, 8, counts=counts, batch_size=32,
                                 max_reference=150)
    assert [tuple(s) for s in calls] == [(32, 8), (28, 8)]
    assert report["log2_reference_size"] == pytest.approx(math.log2(200))
    groups = {g["group"]: g for g in report["groups"]}
    assert [g["group"] for g in report["groups"]] == ["n=1", "n=10", "n=100"]
    assert groups["n=10"]["mean_inserted"] == 10 and groups["n=100"]["mean_inserted"] == 100
    assert set(groups["n=1"]["by_pattern"]) == set(C.PATTERNS)
    assert groups["n=1"]["by_pattern"]["HS"]["n"] == 5
    for label in ("n=10", "n=100"):
        assert groups[label]["exposure"]["min"] == pytest.approx(math.log2(200))
        assert groups[label]["exposure_extrapolated"]["min"] > math.log2(200)
    # unmemorised: 20 canaries; exposure log2(200) - log2(U), U uniform rank; sd ~1.43 bits
    expected = math.log2(200) - np.mean(np.log2(np.arange(1, 201)))
    sd = np.std(math.log2(200) - np.log2(np.arange(1, 201)))
    g1 = groups["n=1"]["exposure"]
    assert g1["n"] == 20
    assert abs(g1["mean"] - expected) < 4 * sd / math.sqrt(20)
    assert g1["max"] < math.log2(200)
    # rows carry no token
    row = report["canaries"][0]
    assert set(row) == {"id", "group", "pattern", "included", "inserted", "rank", "exposure",
                        "exposure_extrapolated"}


def test_mlm_score_fn_adapts_a_keras_mlm():
    import tensorflow as tf
    import tf_keras

    L, M, V = 8, 3, 11
    ids = tf_keras.Input(shape=(L,), dtype=tf.int32, name="input_ids")
    positions = tf_keras.Input(shape=(M,), dtype=tf.int32, name="masked_positions")
    # logits[b, m, v] = 10 * (masked position) + v: checks slot 0 carries the right position
    logits = tf_keras.layers.Lambda(
        lambda t: 10.0 * tf.cast(t[1], tf.float32)[:, :, None] + tf.range(V, dtype=tf.float32)[None, None, :]
        + 0.0 * tf.cast(t[0][:, :1, None], tf.float32))([ids, positions])
    model = tf_keras.Model({"input_ids": ids, "masked_positions": positions}, logits)
    score_fn = C.mlm_score_fn(model, M)
    out = score_fn(np.zeros((2, L), np.int32), np.array([2, 5]))
    assert out.shape == (2, V)
    np.testing.assert_allclose(out[0], 20 + np.arange(V))
    np.testing.assert_allclose(out[1], 50 + np.arange(V))


# ------------------------------------------------------------------------- in-context query

def test_canary_context_queries_insert_like_training():
    """Each query is a carrier row with the canary inserted as insert_canaries inserts it (uniform
    gap, [CLS]/[SEP] kept, content in order and truncated at the end) and its secret masked."""
    rng = np.random.default_rng(21)
    L = 16
    carriers = make_examples([16, 9, 0, 16, 12, 3, 16, 14] * 4, L, rng)
    cs = C.make_canary_set(np.arange(500, 600), 600, occurrences=[1, 10], canaries_per_group=2,
                           rng=np.random.default_rng(22))
    queries, positions, owner = C.canary_context_queries(cs, carriers, 8, np.random.default_rng(23))
    assert queries.shape == (len(cs) * 8, L) and queries.dtype == np.int32
    np.testing.assert_array_equal(owner, np.repeat(np.arange(len(cs)), 8))
    nonempty = [r for r in carriers if r.any()]
    gaps = []
    for j, (row, pos) in enumerate(zip(queries, positions)):
        canary = cs.canaries[owner[j]]
        assert row[pos] == C.MASK_ID and (row == C.MASK_ID).sum() == 1
        restored = row.copy()
        restored[pos] = canary.secret
        start = pos - canary.secret_index
        assert tuple(restored[start:start + canary.k]) == canary.tokens
        assert restored[0] == C.CLS_ID and (restored == C.SEP_ID).sum() == 1
        # without the canary: [CLS] + a carrier's content, in order, truncated at the end + [SEP]
        stripped = [t for t in strip_canaries(restored, cs) if t != C.PAD_ID]
        assert stripped[-1] == C.SEP_ID and (restored != 0).sum() == len(stripped) + canary.k
        assert any(stripped[:-1] == [int(t) for t in r if t != 0][:len(stripped) - 1] for r in nonempty)
        gaps.append(start - 1)
    # K distinct carriers per canary; the gap is uniform, so it reaches both ends
    assert min(gaps) == 0 and max(gaps) >= L - 2 - 5
    again = C.canary_context_queries(cs, carriers, 8, np.random.default_rng(23))
    np.testing.assert_array_equal(again[0], queries)                 # reproducible from the seed
    with pytest.raises(CanaryError, match="no non-empty row"):
        C.canary_context_queries(cs, np.zeros((3, L), np.int32), 4)


def _in_text_memoriser(memorised, V, seed, min_content):
    """A toy MLM that has memorised ``memorised`` (canary tokens -> secret) the way an MLM trained
    on full-length rows does: it predicts the secret only when the canary sits in a row with at
    least ``min_content`` tokens; on a short row (``[CLS] canary [SEP]``, out of distribution) it
    knows nothing (random logits)."""
    noise = np.random.default_rng(seed)

    def score_fn(token_ids, mask_positions):
        out = noise.normal(size=(len(token_ids), V))
        for i, (row, pos) in enumerate(zip(token_ids, mask_positions)):
            if (row != C.PAD_ID).sum() < min_content:
                continue
            for tokens, secret_index, secret in memorised:
                start = pos - secret_index
                window = [int(t) for t in row[start:start + len(tokens)]] if start >= 0 else []
                expected = list(tokens)
                expected[secret_index] = C.MASK_ID
                if window == expected:
                    out[i, secret] = 50.0
        return out

    return score_fn


def test_exposure_of_canaries_inserted_in_text_is_measured_in_context():
    """Canaries inserted mid-text into full-length training rows, memorised by a model that
    predicts them in text only: the in-context query finds them (exposure log2|R|), the
    standalone one ([CLS] canary [SEP]) reports chance-level exposure. Rank exposure only (the
    extrapolation, a skew-normal fit per canary, is tested above)."""
    V, L = 205, 32
    candidates = np.arange(5, V)
    cs = C.make_canary_set(candidates, V, occurrences=[1, 50], canaries_per_group=3,
                           rng=np.random.default_rng(31))
    memorised = [(c.tokens, c.secret_index, c.secret) for c in cs if c.occurrences >= 50]
    score_fn = _in_text_memoriser(memorised, V, 32, min_content=L // 2)
    carriers = make_examples([L] * 40, L, np.random.default_rng(33))
    in_context = C.evaluate_exposure(cs, score_fn, L, in_context=C.InContext(carriers, 4), extrapolate=False)
    standalone = C.evaluate_exposure(cs, score_fn, L, extrapolate=False)
    assert in_context["query"] == {"form": "in_context", "contexts_per_canary": 4,
                                   "carrier_rows": 40, "context_seed": 0}
    assert standalone["query"] == {"form": "standalone"}
    g_ctx = {g["group"]: g["exposure"] for g in in_context["groups"]}
    g_alone = {g["group"]: g["exposure"] for g in standalone["groups"]}
    assert g_ctx["n=50"]["min"] == pytest.approx(math.log2(200))
    assert g_ctx["n=1"]["max"] < math.log2(200)
    assert g_alone["n=50"]["max"] < math.log2(200)        # the standalone query misses them all


def test_canary_exposure_component_queries_inserted_canaries_in_context(tmp_path, monkeypatch):
    """dpbert.stages.canary._exposure_for (what CanaryExposure reports) must query the canaries the
    trainers inserted into text in context (a standalone query misses them)."""
    from collections import Counter
    from types import SimpleNamespace

    import dpbert.stages.canary as component
    import dpbert.network.bert as bert_lib
    from dpbert.data.synthetic import generate_notes
    from dpbert.data.tuples import corpus_tuples
    from dpbert.vocab.wordpiece import save_vocabulary, train_wordpiece

    words = Counter(w for t in corpus_tuples(generate_notes(patients=6, seed=3), 64) for w in t.words)
    # the trainer's artifact layout: <uri>/model (weights), <uri>/tokenizer (vocabulary)
    save_vocabulary(train_wordpiece(words.items(), vocab_size=200), tmp_path / "tokenizer")
    vocab = (tmp_path / "tokenizer" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    candidates = C.candidate_ids(vocab)
    cs = C.make_canary_set(candidates, len(vocab), occurrences=[1, 100], canaries_per_group=2,
                           rng=np.random.default_rng(41))
    L, M = 64, 10
    memorised = [(c.tokens, c.secret_index, c.secret) for c in cs if c.occurrences >= 100]
    score_fn = _in_text_memoriser(memorised, len(vocab), 42, min_content=L // 2)

    def mlm(inputs, training=False):
        logits = score_fn(np.asarray(inputs["input_ids"]), np.asarray(inputs["masked_positions"])[:, 0])
        return np.repeat(logits[:, None, :], M, axis=1)

    fake = SimpleNamespace(spec=SimpleNamespace(max_seq_length=L, max_predictions=M), mlm=mlm)
    monkeypatch.setattr(bert_lib, "load_bert", lambda directory: fake)
    report, _, _ = component._exposure_for(str(tmp_path), cs, [c.occurrences for c in cs])
    assert report["query"]["form"] == "in_context"
    assert report["query"]["contexts_per_canary"] == component.CONTEXTS_PER_CANARY
    groups = {g["group"]: g["exposure"] for g in report["groups"]}
    assert groups["n=100"]["min"] == pytest.approx(math.log2(len(candidates)))
    assert groups["n=1"]["mean"] < math.log2(len(candidates)) - 1
