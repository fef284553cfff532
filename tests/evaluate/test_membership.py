"""Membership-inference attacks (dpbert.evaluate.membership): samples, metrics, features, attacks."""
import json
import math

import numpy as np
import pytest
from scipy import stats

from dpbert.data.splits import split_patients
from dpbert.evaluate import membership as mi

# --------------------------------------------------------------------------------------------
# Sample selection (the patient split: tests/data/test_splits.py)
# --------------------------------------------------------------------------------------------


def test_select_samples_takes_whole_patients_up_to_half_each():
    patients = [f"m{i // 4}" for i in range(40)] + [f"o{i // 5}" for i in range(30)]
    members = np.array([True] * 40 + [False] * 30)
    idx = mi.select_samples(patients, members, max_samples=20, seed=1)
    assert np.all(np.diff(idx) > 0)
    assert members[idx].sum() == 10 and (~members[idx]).sum() == 10
    np.testing.assert_array_equal(idx, mi.select_samples(patients, members, 20, seed=1))
    chosen = [patients[i] for i in idx]
    # every patient but at most one per class (the last, truncated) is complete
    incomplete = [p for p in set(chosen) if chosen.count(p) != patients.count(p)]
    assert len(incomplete) <= 2
    assert len(mi.select_samples(patients, members, 1000, seed=1)) == 70
    capped = mi.select_samples(patients, members, 20, seed=1, max_per_patient=2)
    chosen = [patients[i] for i in capped]
    assert len(capped) == 20 and max(chosen.count(p) for p in chosen) == 2 and len(set(chosen)) == 10
    spread = mi.select_samples(patients, members, 24, seed=2, min_patients=3)  # quota 12 → ≤ 4 each
    chosen = [patients[i] for i in spread]
    assert len(spread) == 24 and max(chosen.count(p) for p in chosen) == 4
    few = mi.select_samples(patients[:8] + patients[40:45], members[:8].tolist() + [False] * 5, 20, seed=0,
                            min_patients=10)  # 2 member patients: 4 tuples each, all taken
    assert len(few) == 8 + 5


# --------------------------------------------------------------------------------------------
# Metrics on synthetic scores with known values
# --------------------------------------------------------------------------------------------


def test_advantage_is_pr_a0_b0_minus_pr_a0_b1():
    b = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0], bool)
    a = np.array([1, 1, 1, 0, 1, 0, 0, 0, 0], bool)
    # Pr[A=0|b=0] = 4/5, Pr[A=0|b=1] = 1/4
    assert mi.advantage(b, a) == pytest.approx(4 / 5 - 1 / 4)
    assert mi.advantage(b, b) == 1.0 and mi.advantage(b, ~b) == -1.0
    assert math.isnan(mi.advantage([1, 1], [1, 0])) and math.isnan(mi.auc([0, 0], [0.1, 0.2]))


def _binomial_se(tpr, fpr, n1, n0):
    return math.sqrt(tpr * (1 - tpr) / n1 + fpr * (1 - fpr) / n0)


def _hanley_mcneil_se(a, n1, n0):
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    return math.sqrt((a * (1 - a) + (n1 - 1) * (q1 - a * a) + (n0 - 1) * (q2 - a * a)) / (n1 * n0))


@pytest.mark.parametrize("shift", [0.0, 0.5, 1.5])
def test_metrics_recover_a_known_advantage_and_auc(shift):
    """Member scores ~ N(shift, 1), non-member ~ N(0, 1), decision at t = shift/2:
    TPR = Φ(shift/2), FPR = 1 − Φ(shift/2), AUC = Φ(shift/√2). Tolerance: 4 standard errors
    (binomial for TPR − FPR, Hanley–McNeil for the AUC)."""
    n1, n0 = 3000, 5000
    rng = np.random.default_rng(int(shift * 10) + 1)
    scores = np.concatenate([rng.normal(shift, 1, n1), rng.normal(0, 1, n0)])
    member = np.concatenate([np.ones(n1, bool), np.zeros(n0, bool)])
    t = shift / 2
    tpr, fpr = stats.norm.sf(t - shift), stats.norm.sf(t)
    adv = mi.advantage(member, scores > t)
    assert abs(adv - (tpr - fpr)) < 4 * _binomial_se(tpr, fpr, n1, n0)
    true_auc = stats.norm.cdf(shift / math.sqrt(2))
    assert abs(mi.auc(member, scores) - true_auc) < 4 * _hanley_mcneil_se(true_auc, n1, n0)
    # tensorflow-privacy's advantage: max |TPR − FPR| = 2Φ(shift/2) − 1 for this pair, an
    # optimistic estimate (the threshold is chosen on the data): not below the truth − 4 SE.
    best = 2 * stats.norm.cdf(shift / 2) - 1
    assert mi.max_advantage(member, scores) >= max(0.0, best - 4 * _binomial_se(tpr, fpr, n1, n0))
    assert mi.max_advantage(member, scores) >= adv


def test_loss_threshold_attack_recovers_its_advantage():
    """S-BBA on losses member ~ N(2, 1), non-member ~ N(3, 1); τ = mean member loss ≈ 2:
    TPR = 1/2, FPR = Φ(−1). The estimated τ adds (φ(0) − φ(1))/√n1 to the standard error."""
    n1, n0 = 4000, 4000
    rng = np.random.default_rng(5)
    losses = np.concatenate([rng.normal(2, 1, n1), rng.normal(3, 1, n0)])
    member = np.concatenate([np.ones(n1, bool), np.zeros(n0, bool)])
    result = mi.loss_threshold_attack(losses, member)
    assert result.threshold == pytest.approx(losses[:n1].mean())
    tpr, fpr = 0.5, stats.norm.cdf(-1)
    se = math.hypot(_binomial_se(tpr, fpr, n1, n0), (stats.norm.pdf(0) - stats.norm.pdf(1)) / math.sqrt(n1))
    assert abs(result.advantage - (tpr - fpr)) < 4 * se
    assert abs(result.auc - stats.norm.cdf(1 / math.sqrt(2))) < 4 * _hanley_mcneil_se(0.76, n1, n0)
    summary = result.summary()
    assert set(summary) == {"advantage", "auc", "roc", "n"} and summary["n"] == n1 + n0
    assert len(summary["roc"]["fpr"]) <= 200 and len(summary["roc"]["fpr"]) == len(summary["roc"]["tpr"])
    json.dumps(summary)


def test_roc_curve_endpoints_monotone_downsampled():
    rng = np.random.default_rng(0)
    member = rng.random(5000) < 0.5
    scores = rng.normal(member.astype(float), 1.0)
    fpr, tpr = mi.roc_curve(member, scores)
    assert len(fpr) <= 200 and (fpr[0], tpr[0]) == (0.0, 0.0) and (fpr[-1], tpr[-1]) == (1.0, 1.0)
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)
    # The downsampled curve's trapezoid area is the AUC to within the discretisation.
    assert abs(np.trapz(tpr, fpr) - mi.auc(member, scores)) < 0.005
    full_f, full_t = mi.roc_curve(member, scores, max_points=10 ** 6)
    assert len(full_f) > 200
    small_f, small_t = mi.downsample_curve(full_f, full_t, 5)
    assert len(small_f) == 5 and small_f[0] == full_f[0] and small_t[-1] == full_t[-1]


def test_privacy_bounds():
    assert mi.advantage_bound(0.0, 0.0) == 0.0 and mi.advantage_bound(0.0, 0.01) == pytest.approx(0.01)
    assert mi.advantage_bound(1.0) == pytest.approx((math.e - 1) / (math.e + 1))
    assert mi.advantage_bound(float("inf")) == 1.0 and mi.advantage_bound(50.0, 0.0) <= 1.0
    # Group privacy for k tuples of one patient: (kε, k e^{(k−1)ε} δ), δ capped at 1.
    assert mi.group_privacy(0.5, 1e-6, 1) == (0.5, pytest.approx(1e-6))
    eps, delta = mi.group_privacy(0.5, 1e-6, 4)
    assert eps == 2.0 and delta == pytest.approx(4 * math.exp(1.5) * 1e-6)
    assert delta > 4 * 1e-6  # not the naive kδ
    assert mi.group_privacy(2.0, 1e-5, 20)[1] == 1.0  # vacuous
    assert mi.group_privacy(1.0, 0.0, 3) == (3.0, 0.0)
    tight = mi.group_privacy(0.5, 1e-6, 4, tight=True)[1]
    assert tight == pytest.approx(1e-6 * sum(math.exp(0.5 * j) for j in range(4))) and tight <= delta
    assert mi.group_privacy(0.5, 1e-6, 1, tight=True)[1] == pytest.approx(1e-6)
    with pytest.raises(ValueError):
        mi.group_privacy(1.0, 1e-6, 0)


# --------------------------------------------------------------------------------------------
# Group means, white-box split
# --------------------------------------------------------------------------------------------


def test_group_means_use_only_the_groups_own_samples():
    losses = np.array([1.0, 3.0, 10.0, 20.0, 30.0, 5.0, 7.0])
    groups = ["a", "a", "b", "b", "b", None, "c"]
    keys, means, sizes = mi.group_means(losses, groups)
    assert keys == ["a", "b", "c"]
    np.testing.assert_allclose(means, [2.0, 20.0, 7.0])
    np.testing.assert_array_equal(sizes, [2, 3, 1])
    changed = losses.copy()
    changed[[2, 3, 4, 5]] = [1e6, -1e6, 3.0, 99.0]  # other groups' samples and the ungrouped one
    _, means2, _ = mi.group_means(changed, groups)
    assert means2[0] == 2.0 and means2[2] == 7.0
    member = np.array([1, 1, 0, 0, 0, 1, 1], bool)
    result = mi.group_threshold_attack(losses, member, groups, threshold=6.0, name="P-BBA")
    np.testing.assert_array_equal(result.is_member, [True, False, True])
    np.testing.assert_array_equal(result.predicted_member, [True, False, False])
    assert result.n == 3 and result.advantage == pytest.approx(0.5)  # TPR 1/2 − FPR 0
    with pytest.raises(ValueError, match="mixes"):
        mi.group_threshold_attack(losses, np.array([1, 0, 0, 0, 0, 1, 1], bool), groups, 6.0, "P-BBA")


def _toy_population(seed=0, patients=30, per_patient=4):
    rng = np.random.default_rng(seed)
    pid = [f"p{i}" for i in range(patients) for _ in range(per_patient)]
    member_patient = {p: rng.random() < 0.6 for p in set(pid)}
    member_patient["p0"], member_patient["p1"] = True, False
    return pid, np.array([member_patient[p] for p in pid])


def test_attacker_split_never_fits_and_evaluates_on_the_same_sample_or_patient():
    pid, member = _toy_population()
    fit, ev = mi.attacker_split(pid, member, 0.2, seed=4)
    assert not set(fit) & set(ev) and sorted(set(fit) | set(ev)) == list(range(len(pid)))
    assert not {pid[i] for i in fit} & {pid[i] for i in ev}
    for label in (True, False):
        assert member[fit].tolist().count(label) >= 1 and member[ev].tolist().count(label) >= 1
        share = (member[fit] == label).sum() / (member == label).sum()
        assert 0.1 <= share <= 0.3
    f2, e2 = mi.attacker_split(pid, member, 0.2, seed=4)
    np.testing.assert_array_equal(fit, f2)
    # patient_ids None: sample-level groups
    fit, ev = mi.attacker_split(None, member, 0.2, seed=0)
    assert not set(fit) & set(ev) and len(fit) + len(ev) == len(pid)
    with pytest.raises(ValueError, match=">= 2"):
        mi.attacker_split(["a", "a", "b"], np.array([1, 1, 0], bool))


class _Spy:
    """A classifier recording the sample ids (column 0) it is fitted and evaluated on."""

    fitted, scored = [], []

    def __init__(self, seed):
        self.inner = mi._default_classifier(seed)

    def fit(self, X, y):
        _Spy.fitted.append(X[:, 0].astype(int).tolist())
        self.inner.fit(X[:, 1:], y)
        return self

    def predict_proba(self, X):
        _Spy.scored.append(X[:, 0].astype(int).tolist())
        return self.inner.predict_proba(X[:, 1:])


def test_logistic_attack_fits_on_fit_rows_scores_only_eval_rows():
    pid, member = _toy_population(1)
    rng = np.random.default_rng(2)
    X = np.column_stack([np.arange(len(pid)), rng.normal(member[:, None] * 1.5, 1.0, (len(pid), 3))])
    fit, ev = mi.attacker_split(pid, member, 0.2, seed=0)
    _Spy.fitted, _Spy.scored = [], []
    result = mi.logistic_attack(X, member, fit, ev, "S-AWBA", classifier_factory=_Spy)
    assert _Spy.fitted == [sorted(fit.tolist())] and _Spy.scored == [sorted(ev.tolist())]
    assert not set(_Spy.fitted[0]) & set(_Spy.scored[0])
    assert result.n == len(ev) and result.auc > 0.7
    with pytest.raises(ValueError, match="both fitted and evaluated"):
        mi.logistic_attack(X, member, fit, np.append(ev, fit[0]), "S-AWBA")


# --------------------------------------------------------------------------------------------
# Attention concentration
# --------------------------------------------------------------------------------------------


def test_attention_concentration_on_a_hand_made_matrix():
    # 5 query rows over 4 keys (key 3 is padding: no attention); query 4 is padding.
    a = np.array([
        [1.0, 0.0, 0.0, 0.0],        # one-hot: C = 0
        [0.5, 0.5, 0.0, 0.0],        # uniform over 2: C = −log 2
        [1 / 3, 1 / 3, 1 / 3, 0.0],  # uniform over 3: C = −log 3
        [0.7, 0.2, 0.1, 0.0],
        [0.2, 0.3, 0.5, 0.0],        # padding query: excluded from the summaries
    ])
    c = mi.attention_concentration(a)
    expected = [0.0, -math.log(2), -math.log(3), 0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1)]
    np.testing.assert_allclose(c[:4], expected)
    valid = np.array([True, True, True, True, False])
    summary = mi.masked_summaries(c, valid)
    ref = np.array(expected)
    np.testing.assert_allclose(summary, [ref.mean(), np.median(ref), np.percentile(ref, 5), np.percentile(ref, 95)])


def test_masked_summaries_match_numpy_percentiles_row_by_row():
    rng = np.random.default_rng(0)
    values = rng.normal(size=(6, 3, 9))
    valid = rng.random((6, 1, 9)) < 0.6
    valid[0] = False  # an all-padding row gives zeros
    out = mi.masked_summaries(values, valid)
    assert out.shape == (6, 3, 4) and np.all(out[0] == 0)
    for i in range(1, 6):
        for j in range(3):
            v = values[i, j][valid[i, 0]]
            if v.size:
                np.testing.assert_allclose(out[i, j], [v.mean(), np.median(v), np.percentile(v, 5),
                                                       np.percentile(v, 95)])


# --------------------------------------------------------------------------------------------
# Features from a tiny BERT
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    from dpbert.network.bert import BertSpec, build_bert

    spec = BertSpec(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                    max_seq_length=12, max_predictions=4, dropout=0.1, attention_dropout=0.1)
    rng = np.random.default_rng(0)
    ids = np.zeros((10, 12), np.int32)
    ids[:, 0] = mi.CLS_ID
    for i in range(10):
        k = int(rng.integers(3, 10))
        ids[i, 1:1 + k] = rng.integers(5, 40, k)
        ids[i, 1 + k] = mi.SEP_ID
    ids[3, 1:4] = 7  # a repeated token (the embedding norm must sum its rows first)
    return build_bert(spec, seed=1), ids


def test_sample_losses_are_seeded_per_example_and_batch_independent(tiny):
    import tensorflow as tf

    from dpbert.engine import masking

    models, ids = tiny
    a = mi.sample_losses(models, ids, seed=3, batch_size=4)
    np.testing.assert_allclose(a, mi.sample_losses(models, ids, seed=3, batch_size=10), rtol=1e-5)
    assert a.shape == (10,) and np.all(a > 0)
    assert not np.allclose(a, mi.sample_losses(models, ids, seed=4))
    # Example 2 by hand: its masked positions' mean cross-entropy, no dropout.
    m = masking.mask_with_seed(ids, *mi._mask_seed(3), special_token_ids=mi.SPECIAL_IDS, mask_token_id=mi.MASK_ID,
                            vocab_size=40, max_predictions=4)
    logits = models.mlm({"input_ids": m["input_ids"][2:3], "masked_positions": m["masked_positions"][2:3]},
                        training=False)[0].numpy()
    w = m["masked_weights"][2]
    labels = m["masked_labels"][2]
    xent = -tf.nn.log_softmax(logits).numpy()[np.arange(4), labels]
    assert a[2] == pytest.approx((xent * w).sum() / w.sum(), rel=1e-5)
    two = mi.sample_losses(models, ids, seed=3, num_masks=2)
    assert not np.allclose(two, a)


def test_attention_features_shape_range_and_padding_excluded(tiny):
    models, ids = tiny
    feats = mi.attention_features(models, ids, batch_size=4)
    assert feats.shape == (10, 2 * 2 * 4)
    assert len(mi.attention_feature_names(2, 2)) == 16
    assert np.all(feats <= 1e-9)
    n_real = (ids != 0).sum(axis=1)
    assert np.all(feats >= -np.log(n_real)[:, None] - 1e-6)  # at most uniform over the real keys
    probs = models.encoder(ids[5:6], training=False)["attention_probs"][1].numpy()[0, 0]  # layer 1, head 0
    c = mi.attention_concentration(probs)[: n_real[5]]
    np.testing.assert_allclose(feats[5, 4:8], [c.mean(), np.median(c), np.percentile(c, 5), np.percentile(c, 95)],
                               rtol=1e-4, atol=1e-6)


def test_gradient_features_match_per_example_gradients(tiny):
    import tensorflow as tf

    from dpbert.mechanism import clipping
    from dpbert.engine import masking

    models, ids = tiny
    names = mi.gradient_feature_names(models)
    assert names[:3] == ["word_embeddings", "position_embeddings", "embeddings_layer_norm"]
    assert len(names) == 3 + 5 * 2 + 3 and names[-1] == "mlm_output"
    g = mi.gradient_features(models, ids, seed=2, batch_size=4)
    assert g.shape == (10, len(names)) and np.all(g >= 0) and np.all(g.sum(axis=1) > 0)
    # Brute force: one example at a time, the gradient of its own loss, grouped by layer.
    m = masking.mask_with_seed(ids, *mi._mask_seed(2), special_token_ids=mi.SPECIAL_IDS, mask_token_id=mi.MASK_ID,
                            vocab_size=40, max_predictions=4)
    layers = [models.mlm.get_layer(name) for name in names]
    for i in (0, 3, 7):
        with tf.GradientTape() as tape:
            logits = models.mlm({"input_ids": m["input_ids"][i:i + 1],
                                 "masked_positions": m["masked_positions"][i:i + 1]}, training=False)
            loss = clipping.per_example_mlm_loss(m["masked_labels"][i:i + 1], logits, m["masked_weights"][i:i + 1])[0]
        grads = tape.gradient(loss, [layer.trainable_variables for layer in layers])
        brute = [sum(float(tf.reduce_sum(tf.square(tf.convert_to_tensor(x)))) for x in per_layer)
                 for per_layer in grads]
        np.testing.assert_allclose(g[i], brute, rtol=2e-3, atol=1e-9)
    # Independent of batching (the compiled path: tests/evaluate/test_membership_slow.py).
    np.testing.assert_allclose(g, mi.gradient_features(models, ids, seed=2, batch_size=10), rtol=1e-4, atol=1e-9)


# --------------------------------------------------------------------------------------------
# End to end on a tiny BERT trained on the members only
# --------------------------------------------------------------------------------------------


def test_run_attacks_end_to_end_on_a_tiny_bert():
    import tensorflow as tf
    import tf_keras

    from dpbert.mechanism import clipping
    from dpbert.engine import masking
    from dpbert.network.bert import BertSpec, build_bert

    spec = BertSpec(vocab_size=40, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                    max_seq_length=16, max_predictions=4, dropout=0.0, attention_dropout=0.0)
    models = build_bert(spec, seed=0)
    rng = np.random.default_rng(0)
    n = 48
    ids = np.zeros((n, 16), np.int32)
    ids[:, 0] = mi.CLS_ID
    for i in range(n):
        k = int(rng.integers(8, 14))
        ids[i, 1:1 + k] = rng.integers(5, 40, k)
        ids[i, 1 + k] = mi.SEP_ID
    patients = [f"p{i // 4}" for i in range(n)]
    admissions = [f"a{(i // 2) % 2}" for i in range(n)]  # "a0"/"a1" in every patient: keyed per patient
    admissions[0] = None  # a tuple without admission takes no part in A-BBA
    split = split_patients(patients, 0.5, bytes(range(32)))
    member = split.is_train(patients)
    # Over-fit the members (non-private). One traced step: autograph off (nothing in it needs
    # converting; converting the model costs tens of seconds), and the legacy Adam, whose fused
    # update is not XLA-compiled as the new one's is inside a tf.function.
    optimizer = tf_keras.optimizers.legacy.Adam(1e-2)

    @tf.function(autograph=False)
    def train_step(input_ids, masked_positions, masked_labels, masked_weights):
        with tf.GradientTape() as tape:
            logits = models.mlm({"input_ids": input_ids, "masked_positions": masked_positions}, training=True)
            loss = tf.reduce_mean(clipping.per_example_mlm_loss(masked_labels, logits, masked_weights))
        grads = tape.gradient(loss, models.mlm.trainable_variables)
        optimizer.apply_gradients(zip(grads, models.mlm.trainable_variables))

    for step in range(60):
        masked = masking.mask_with_seed(ids[member], step, 7, special_token_ids=mi.SPECIAL_IDS,
                                        mask_token_id=mi.MASK_ID, vocab_size=40, max_predictions=4)
        train_step(*(tf.constant(masked[k]) for k in ("input_ids", "masked_positions", "masked_labels",
                                                       "masked_weights")))

    # The white-box attacks' classifier is a pass-through spy (the default logistic regression
    # inside, same numbers): no feature row is both fitted and scored.
    class RowSpy(_Spy):
        def fit(self, X, y):
            RowSpy.fitted.append({row.tobytes() for row in X})
            self.inner.fit(X, y)
            return self

        def predict_proba(self, X):
            RowSpy.scored.append({row.tobytes() for row in X})
            return self.inner.predict_proba(X)

    RowSpy.fitted, RowSpy.scored = [], []
    report = mi.run_attacks(models, ids, patients, admissions, member, seed=0, classifier_factory=RowSpy)
    assert len(RowSpy.fitted) == len(RowSpy.scored) == 2
    for fitted, scored in zip(RowSpy.fitted, RowSpy.scored):
        assert not fitted & scored and len(fitted) + len(scored) == n  # distinct rows, all used once
    assert list(report) == ["S-BBA", "A-BBA", "P-BBA", "S-AWBA", "S-GWBA"]
    json.dumps(report)  # plain JSON: no numpy, no NaN
    assert report["S-BBA"]["n"] == n and report["P-BBA"]["n"] == 12
    assert report["A-BBA"]["n"] == 24  # (patient, admission) pairs, the None one excluded
    wb_fit, wb_eval = mi.attacker_split(patients, member, 0.2, seed=0)
    assert report["S-AWBA"]["n"] == report["S-GWBA"]["n"] == len(wb_eval) and len(wb_fit) + len(wb_eval) == n
    for name, r in report.items():
        assert set(r) == {"advantage", "auc", "roc", "n"}, name
        assert -1 <= r["advantage"] <= 1 and 0 <= r["auc"] <= 1, name
        fpr, tpr = r["roc"]["fpr"], r["roc"]["tpr"]
        assert 2 <= len(fpr) == len(tpr) <= 200 and fpr[0] == 0 and tpr[-1] == 1, name
    # The members were trained on: the loss attack must see it.
    assert report["S-BBA"]["auc"] > 0.75 and report["S-BBA"]["advantage"] > 0.2
    assert report["P-BBA"]["auc"] > 0.75
    with pytest.raises(ValueError, match="both member and non-member"):
        mi.run_attacks(models, ids[:4], patients[:4], None, np.ones(4, bool))

    # One non-member patient: no white-box split; those attacks are reported as not run.
    few = [i for i in range(n) if member[i] or patients[i] == patients[int(np.flatnonzero(~member)[0])]]
    partial = mi.run_attacks(models, ids[few], [patients[i] for i in few], None, member[few], seed=0)
    assert partial["S-AWBA"] == partial["S-GWBA"] == {"advantage": None, "auc": None, "n": 0,
                                                      "roc": {"fpr": [], "tpr": []}}
    assert partial["A-BBA"]["n"] == 0 and partial["S-BBA"]["n"] == len(few)
