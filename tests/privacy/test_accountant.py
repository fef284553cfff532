"""The ledger: DP-SGD ε, composition with the vocabulary, planning, calibration."""
import math
import re
import sys

import pytest

from dpbert.config import load_config
from dpbert.accounting import accountant as A
from dpbert.privacy import events as E
from dpbert.privacy import histogram as H

#: --dist loadgroup: its module fixture's accounting runs on one worker.
pytestmark = pytest.mark.xdist_group("accountant")


Q_NOTES = 131072 / 83_000_000


# ------------------------------------------------------------------------------------ DP-SGD

def test_dpsgd_report_reference_values():
    r = A.dpsgd_report(60000, 256, 1.1, 1e-5, epochs=60)
    assert r["steps"] == 14063 == math.ceil(60 * 60000 / 256)
    assert r["sampling_probability"] == 256 / 60000
    assert r["epsilon_rdp"] == pytest.approx(2.597, abs=5e-4)
    assert r["epsilon_pld"] == pytest.approx(2.382, abs=5e-4)
    assert r["epsilon_pld"] < r["epsilon_rdp"]
    assert (r["sampling"], r["delta"], r["adjacency"]) == ("poisson", 1e-5, "add_or_remove_one")
    assert "used_microbatching" in r["tf_privacy_note"]
    assert E.validate_record(r["event"])["steps"] == 14063


def test_dpsgd_epsilon_matches_report_with_smaller_settings():
    q, steps = 0.01, 300
    pld = A.dpsgd_epsilon(2.0, q, steps, 1e-5)
    rdp = A.dpsgd_epsilon(2.0, q, steps, 1e-5, accountant="rdp")
    assert pld < rdp
    r = A.dpsgd_report(10000, 100, 2.0, 1e-5, steps=steps)
    assert (r["epsilon_pld"], r["epsilon_rdp"]) == (pytest.approx(pld), pytest.approx(rdp))
    # More noise, fewer steps or a smaller q: smaller ε.
    assert A.dpsgd_epsilon(3.0, q, steps, 1e-5) < pld
    assert A.dpsgd_epsilon(2.0, q, steps // 2, 1e-5) < pld
    assert A.dpsgd_epsilon(2.0, q / 2, steps, 1e-5) < pld


def _tfp_lines(text):
    once = float(re.search(r"once per epoch:\s+([0-9.]+)", text).group(1))
    poisson = float(re.search(r"Poisson sampling \(\*\):\s+([0-9.]+)", text).group(1))
    return once, poisson


def test_against_tensorflow_privacy():
    sys.skip_tf_privacy_import = True
    from tensorflow_privacy.privacy.analysis import compute_dp_sgd_privacy_lib as lib

    # Per-example clipping: no microbatch doubling → the same RDP ε as ours.
    _, poisson = _tfp_lines(lib.compute_dp_sgd_privacy_statement(60000, 256, 60, 1.1, 1e-5,
                                                                 used_microbatching=False))
    assert poisson == pytest.approx(A.dpsgd_epsilon(1.1, 256 / 60000, 14063, 1e-5, accountant="rdp"),
                                    abs=1e-3)
    # Its default doubles the sensitivity: 16.384 (what the note in our report warns about).
    _, doubled = _tfp_lines(lib.compute_dp_sgd_privacy_statement(60000, 256, 60, 1.1, 1e-5))
    assert doubled == pytest.approx(16.384, abs=1e-3)
    # Shuffle with aligned batches (n % B == 0): our zero-out bound Gaussian(σ) × epochs is
    # tf-privacy's "once per epoch" without its microbatching doubling.
    once, _ = _tfp_lines(lib.compute_dp_sgd_privacy_statement(60000, 250, 60, 1.1, 1e-5,
                                                              used_microbatching=False))
    ours = A.dpsgd_report(60000, 250, 1.1, 1e-5, epochs=60, sampling="shuffle")
    assert (ours["participations"], ours["straddling"]) == (60, False)
    assert ours["epsilon_rdp"] == pytest.approx(once, abs=1e-3)


def test_gaussian_only_compositions_match_the_pld_accountant():
    import dp_accounting as dpa
    event = dpa.ComposedDpEvent([dpa.GaussianDpEvent(12.5),
                                 dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(5.0), 7)])
    pld = dpa.pld.PLDAccountant(value_discretization_interval=1e-4).compose(event).get_epsilon(1e-6)
    ours = A._epsilon(event, 1e-6, "pld")
    assert ours == pytest.approx(pld, abs=1e-3)
    assert ours <= pld + 1e-9                      # the closed form is exact, PLD pessimistic


def test_shuffle_gets_no_amplification():
    poisson = A.dpsgd_report(10000, 100, 1.0, 1e-5, epochs=5)
    shuffle = A.dpsgd_report(10000, 100, 1.0, 1e-5, epochs=5, sampling="shuffle")
    assert shuffle["participations"] == 5 and shuffle["straddling"] is False
    assert shuffle["epsilon_pld"] > 3 * poisson["epsilon_pld"]
    # Exactly a Gaussian mechanism with noise multiplier σ/√5 (zero-out: sensitivity C).
    single = H.gaussian_epsilon(1.0 / math.sqrt(5), 1e-5, 1.0, method="analytic")
    assert shuffle["epsilon_pld"] == pytest.approx(single, abs=2e-3)


@pytest.mark.parametrize("call,message", [
    (lambda: A.dpsgd_epsilon(-1, 0.01, 100, 1e-5), "noise_multiplier must be a finite number > 0"),
    (lambda: A.dpsgd_epsilon(1, 0.01, 100, 1.0), "delta must be in (0, 1)"),
    (lambda: A.dpsgd_epsilon(1, 0.01, 100, 0), "delta must be in (0, 1)"),
    (lambda: A.dpsgd_epsilon(1, 0.01, 0, 1e-5), "steps must be an integer >= 1"),
    (lambda: A.dpsgd_epsilon(1, 0, 100, 1e-5), "sampling_probability must be in (0, 1]"),
    (lambda: A.dpsgd_epsilon(1, 0.01, 100, 1e-5, accountant="gdp"), "accountant must be one of"),
    (lambda: A.dpsgd_epsilon(1, 0.01, 100, 1e-5, sampling="uniform"), "sampling must be one of"),
    (lambda: A.dpsgd_report(1000, 10, 1.0, 1e-5), "exactly one of epochs and steps"),
    (lambda: A.dpsgd_report(1000, 10, 1.0, 1e-5, epochs=1, steps=1), "exactly one of epochs and steps"),
    (lambda: A.dpsgd_report(1000, 10, 1.0, 1e-5, epochs=-1), "epochs must be a finite number > 0"),
    (lambda: A.noise_multiplier_for_target(-1, 0.01, 100, 1e-5), "target_epsilon must be"),
])
def test_invalid_inputs(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value)


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_noise_multiplier_for_target_round_trip(accountant):
    q, steps, delta, target, tol = 0.01, 100, 1e-5, 0.2, 1e-3
    sigma = A.noise_multiplier_for_target(target, q, steps, delta, accountant=accountant, tol=tol)
    assert A.dpsgd_epsilon(sigma, q, steps, delta, accountant=accountant) <= target
    # Smallest: a little less noise (beyond the tolerance) overshoots the target.
    assert A.dpsgd_epsilon(sigma - 2 * tol, q, steps, delta, accountant=accountant) > target


def test_noise_multiplier_for_target_shuffle():
    sigma = A.noise_multiplier_for_target(5.0, 0.1, 50, 1e-5, sampling="shuffle")
    assert A.dpsgd_epsilon(sigma, 0.1, 50, 1e-5, sampling="shuffle") <= 5.0
    assert A.dpsgd_epsilon(sigma - 2e-3, 0.1, 50, 1e-5, sampling="shuffle") > 5.0


# ------------------------------------------------------------------------------------ ledger

@pytest.fixture(scope="module")
def notes_records():
    vocab = E.histogram_event(H.histogram_report(200.0, 1e-9, 256))
    train = E.dpsgd_event(2.72, 131072, 83_000_000, 50000)
    return vocab, train


def test_ledger_notes_example(notes_records):
    """DP-VOCABULARY-NOTES: q = 131072/83M, σ_T = 2.72, 50k steps, vocabulary σ = 200, N = 256:
    ε_T 0.675, composed 0.792, basic 1.109 (that one with the library's ε_V = 0.434)."""
    vocab, train = notes_records
    led = A.ledger(E.to_json(vocab), [E.to_json(train)], 1.1e-8)
    # δ split, stated next to each ε.
    assert led["delta_vocab"] == 1e-9 and led["delta_train"] == pytest.approx(1e-8)
    assert led["delta_vocab"] + led["delta_train"] == pytest.approx(led["delta_total"])
    assert led["delta_threshold"] == pytest.approx(1e-9, rel=1e-9)
    assert led["delta_composed"] + led["delta_threshold"] == pytest.approx(1.1e-8)
    assert led["epsilon_vocab"] == pytest.approx(0.4242, abs=1e-4)
    assert led["epsilon_train"] == pytest.approx(0.675, abs=2e-3)
    assert led["epsilon_total_pld"] == pytest.approx(0.792, abs=1e-3)
    assert led["epsilon_total_basic"] == pytest.approx(led["epsilon_vocab"] + led["epsilon_train"])
    assert led["epsilon_total_basic"] == pytest.approx(1.10, abs=2e-3)
    # The notes' 1.109 is the split ε_V (0.434, δ/2 to each part) + ε_T.
    split = H.histogram_report(200.0, 1e-9, 256, threshold_delta_fraction=0.5)["epsilon_split"]
    assert split + led["epsilon_train"] == pytest.approx(1.109, abs=2e-3)
    # Composition in one PLD beats basic composition; RDP is in between here.
    assert led["epsilon_total_pld"] < led["epsilon_total_rdp"] < led["epsilon_total_basic"]
    assert led["epsilon_total"] == led["epsilon_total_pld"]
    assert led["epsilon_train_rdp"] > led["epsilon_train"]
    assert led["non_private"] is False and led["steps"] == 50000


def test_ledger_with_library_split_vocabulary(notes_records):
    _, train = notes_records
    vocab = E.histogram_event(H.histogram_report(200.0, 1e-9, 256, threshold_delta_fraction=0.5))
    led = A.ledger(vocab, [train], 1.1e-8)
    assert led["delta_threshold"] == pytest.approx(5e-10, rel=1e-9)
    assert led["delta_composed"] == pytest.approx(1.05e-8)
    assert led["epsilon_total_pld"] == pytest.approx(0.790, abs=1e-3)


def test_ledger_composes_multiple_training_records():
    vocab = E.histogram_event(H.histogram_report(50.0, 1e-8, 64))
    whole = E.dpsgd_event(1.5, 100, 10000, 400)
    first, resumed = E.dpsgd_event(1.5, 100, 10000, 150), E.dpsgd_event(1.5, 100, 10000, 250)
    one = A.ledger(vocab, [whole], 1e-6)
    two = A.ledger(vocab, [first, resumed], 1e-6)
    assert two["steps"] == 400 and two["training_records"] == 2
    for key in ("epsilon_train", "epsilon_total_pld", "epsilon_total_rdp", "epsilon_total_basic"):
        assert two[key] == pytest.approx(one[key], abs=2e-3), key
    assert A.ledger(vocab, [first], 1e-6)["epsilon_total_pld"] < two["epsilon_total_pld"]


def test_ledger_without_vocabulary_is_dpsgd():
    train = E.dpsgd_event(1.1, 256, 60000, 500)
    led = A.ledger(None, [train], 1e-5)
    assert led["epsilon_vocab"] == 0.0 and led["delta_threshold"] == 0.0
    assert led["epsilon_total_pld"] == pytest.approx(A.dpsgd_epsilon(1.1, 256 / 60000, 500, 1e-5))
    assert led["epsilon_total_rdp"] == pytest.approx(
        A.dpsgd_epsilon(1.1, 256 / 60000, 500, 1e-5, accountant="rdp"))


def test_ledger_non_private_is_infinite_and_json_encodes_it():
    train = E.dpsgd_event(1.1, 256, 60000, 100)
    led = A.ledger(E.non_private_event("vocab"), [train], 1e-5)
    assert led["non_private"] is True
    assert led["epsilon_vocab"] == math.inf
    assert math.isfinite(led["epsilon_train"])
    for key in ("epsilon_total_basic", "epsilon_total_pld", "epsilon_total_rdp", "epsilon_total"):
        assert led[key] == math.inf
    text = E.to_json(led)
    assert '"epsilon_total_pld": "inf"' in text and "Infinity" not in text
    assert E.from_json(text)["epsilon_total_pld"] == math.inf
    vocab = E.histogram_event(H.histogram_report(200.0, 1e-9, 256))
    led = A.ledger(vocab, [train, E.non_private_event("train")], 1e-5)
    assert led["epsilon_train"] == math.inf and led["epsilon_total"] == math.inf
    assert math.isfinite(led["epsilon_vocab"])


def test_ledger_rejections(notes_records):
    vocab, train = notes_records
    with pytest.raises(ValueError, match="delta_target must be > the vocabulary's delta"):
        A.ledger(vocab, [train], 1e-9)
    with pytest.raises(ValueError, match="delta_target must be in"):
        A.ledger(vocab, [train], 1.0)
    patient = E.dpsgd_event(2.72, 131072, 83_000_000, 10, max_contributions=4)
    with pytest.raises(ValueError, match="same privacy unit"):
        A.ledger(vocab, [patient], 1e-6)
    with pytest.raises(ValueError, match="vocabulary record"):
        A.ledger(train, [train], 1e-6)
    with pytest.raises(ValueError, match="training records"):
        A.ledger(vocab, [vocab], 1e-6)
    with pytest.raises(ValueError, match="must be a list"):
        A.ledger(vocab, train, 1e-6)
    # The paper's threshold really costs δ ≈ 1.2e-4: a smaller target is refused.
    paper = E.histogram_event(H.histogram_report(200.0, 1e-9, 256, threshold_mode="paper"))
    with pytest.raises(ValueError, match="delta_target"):
        A.ledger(paper, [train], 1e-5)


# ---------------------------------------------------------------------------------- planning

def _config(*overrides):
    return load_config(None, list(overrides))


def test_planned_ledger_round_trip():
    config = _config("training.steps=300", "training.batch_size=64", "training.noise_multiplier=1.2",
                     "vocab.sigma=50", "vocab.delta=1e-8", "training.delta=1e-6", "privacy.tuple_words=64")
    plan = A.planned_ledger(config, 20000)
    assert plan["delta"] == pytest.approx(1e-8 + 1e-6)
    assert plan["sampling_probability"] == 64 / 20000 and plan["steps"] == 300
    assert plan["within_budget"] is True and plan["epsilon_budget"] is None
    # The recorded events, written as JSON and read back, give the same ledger.
    again = A.ledger(E.to_json(plan["vocab_event"]), [E.to_json(t) for t in plan["train_events"]],
                     plan["delta"])
    for key in ("epsilon_vocab", "epsilon_train", "epsilon_total_basic", "epsilon_total_pld",
                "epsilon_total_rdp"):
        assert again[key] == pytest.approx(plan[key], rel=1e-12), key
    # And the parts are what the single-purpose functions give.
    assert plan["epsilon_vocab"] == pytest.approx(H.histogram_report(50.0, 1e-8, 64)["epsilon"])
    sigma = 1.2 / math.sqrt(1 + 4 / 64)  # σ combined with the 4 DP diagnostics (noise ratio 8)
    assert plan["epsilon_train"] == pytest.approx(A.dpsgd_epsilon(sigma, 64 / 20000, 300, 1e-6))
    assert plan["epsilon_total_pld"] <= plan["epsilon_total_basic"]


def test_planned_ledger_budget_and_epochs():
    base = ("training.steps=null", "training.epochs=2", "training.batch_size=100",
            "training.noise_multiplier=2.0")
    public = "training.dataset_size=5000"  # a budget needs a public n (dpbert.config)
    plan = A.planned_ledger(_config(*base, public, "privacy.epsilon_budget=100"))
    assert plan["steps"] == 100                                   # ceil(2 · 5000 / 100)
    assert plan["within_budget"] is True
    tight = A.planned_ledger(_config(*base, public, f"privacy.epsilon_budget={plan['epsilon_total_pld'] * 0.99}"))
    assert tight["within_budget"] is False
    exact = A.planned_ledger(_config(*base, public, f"privacy.epsilon_budget={plan['epsilon_total_pld']}"))
    assert exact["within_budget"] is True
    given = A.planned_ledger(_config(*base), 5000)
    assert given["epsilon_total_pld"] == pytest.approx(plan["epsilon_total_pld"])
    with pytest.raises(ValueError, match="dataset_size must be given"):
        A.planned_ledger(_config(*base))
    from dpbert.config import ConfigError

    with pytest.raises(ConfigError, match="training.dataset_size must be set"):
        _config(*base, "privacy.epsilon_budget=100")
    with pytest.raises(ConfigError, match="training.noise_seed is for tests only"):
        _config(*base, public, "privacy.epsilon_budget=100", "training.noise_seed=3")
    with pytest.raises(ConfigError, match="vocab.noise_seed is for tests only"):
        _config(*base, public, "privacy.epsilon_budget=100", "vocab.noise_seed=3")


def test_planned_ledger_holdout_plans_with_the_public_n_times_one_minus_f():
    config = _config("training.steps=10", "training.batch_size=50", "membership.holdout_patient_fraction=0.3")
    plan = A.planned_ledger(config, 1000)
    assert plan["dataset_size"] == 700 and plan["sampling_probability"] == pytest.approx(50 / 700)


def test_planned_ledger_patient_unit_and_non_private():
    common = ("training.steps=50", "training.batch_size=32", "training.noise_multiplier=4",
              "vocab.sigma=100", "privacy.tuple_words=32")
    plan = A.planned_ledger(_config("privacy.unit=patient", "privacy.max_tuples_per_patient=4", *common),
                            4000)
    assert plan["unit"] == "patient" and plan["max_contributions"] == 4
    assert plan["vocab_event"]["max_contributions"] == 4
    # Training (user-level DP-SGD): 4000 PATIENTS, 32 per step, PoissonSampled(q, Gaussian(σ))
    # per patient — the same event as 32 of 4000 tuples, no group-privacy factor.
    sigma = 4.0 / math.sqrt(1 + 4 / 64)  # with the DP diagnostics
    assert plan["epsilon_train"] == pytest.approx(A.dpsgd_epsilon(sigma, 32 / 4000, 50, 1e-6, user_level=True))
    assert plan["train_events"][0]["sampling_unit"] == "patient"
    tuple_plan = A.planned_ledger(_config(*common), 4000)
    assert plan["epsilon_vocab"] > tuple_plan["epsilon_vocab"]
    assert plan["epsilon_train"] == pytest.approx(tuple_plan["epsilon_train"])
    np_plan = A.planned_ledger(_config("training.non_private=true", "training.noise_multiplier=0"), 4000)
    assert np_plan["non_private"] is True and np_plan["epsilon_total_pld"] == math.inf
    assert np_plan["within_budget"] is True                       # no budget set (refused otherwise)


def test_planned_ledger_paper_threshold_reports_its_real_delta():
    plan = A.planned_ledger(_config("vocab.threshold_mode=paper", "training.steps=10"), 10000)
    assert plan["delta_vocab"] == pytest.approx(1.18e-4, rel=1e-2)
    assert plan["delta"] > 1e-4


def test_dp_count_composes_in_the_training_ledger():
    import numpy as np

    from dpbert.privacy import count

    n_hat = count.dp_count(1000, 20.0, rng=np.random.default_rng(0))
    assert n_hat != 1000 and abs(n_hat - 1000) < 100
    record = count.count_event(20.0, n_hat)
    train = E.dpsgd_event(1.0, 50, n_hat, 100)
    with_count = A.ledger(None, [record, train], 1e-6)
    without = A.ledger(None, [train], 1e-6)
    assert with_count["epsilon_train"] > without["epsilon_train"]
    assert with_count["epsilon_train"] == pytest.approx(A._epsilon(
        __import__("dp_accounting").ComposedDpEvent([E.accountable_event(record), E.accountable_event(train)]),
        1e-6, "pld"))
    assert E.validate_record(E.to_json(record)) == record


def test_epsilon_is_memoised_by_the_whole_event_and_delta(monkeypatch):
    """``_epsilon`` computes each (event, δ, accountant) once per process; events that differ in
    any field (σ, q, count) or another δ are computed on their own."""
    from dpbert.accounting import epsilon as memo

    calls = []
    accountant = A
    real = memo._epsilon_uncached

    def counting(event, delta, kind):
        calls.append((repr(event), delta, kind))
        return real(event, delta, kind)

    monkeypatch.setattr(memo, "_epsilon_uncached", counting)
    monkeypatch.setattr(memo, "_MEMO", {})
    first = accountant.dpsgd_epsilon(1.1, 0.01, 100, 1e-5, accountant="rdp")
    assert accountant.dpsgd_epsilon(1.1, 0.01, 100, 1e-5, accountant="rdp") == first and len(calls) == 1
    others = [accountant.dpsgd_epsilon(1.1000001, 0.01, 100, 1e-5, accountant="rdp"),
              accountant.dpsgd_epsilon(1.1, 0.0100001, 100, 1e-5, accountant="rdp"),
              accountant.dpsgd_epsilon(1.1, 0.01, 101, 1e-5, accountant="rdp"),
              accountant.dpsgd_epsilon(1.1, 0.01, 100, 1.1e-5, accountant="rdp")]
    assert len(calls) == 5 and all(o != first for o in others)
