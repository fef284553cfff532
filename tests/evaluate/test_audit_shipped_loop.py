"""The white-box audit runs the SHIPPED training loop (dpbert.evaluate.whitebox.whitebox_audit):
``build_training``'s TrainLoop with the configured unit, sampler, trainable set and plan; its
canaries are extra units of the run's own sampler and live on a TRAINED piece.

Setting: the embedded synthetic corpus (160 rows of L = 16, WordPiece V = 1024), a 1-layer
H = 16 BERT without dropout, C = 1, σ = 1.5, δ = 1e-5, β = 0.05, fixed seeds, m = 500 canaries.
Two audited runs (each costs a trace of the DP step): the patient-unit run (two rows a patient,
k = 2, B = 8 of 80 patients → q = 0.1, only bias and head trained), run ONCE with its
positive control and read by the tests of the loop and of the bounds (``patient_audit``); and the
broken-noise run with every unit a row (B = 16 over n = 160 → q = 0.1), only bias and head
trained too (the cheaper trace; the audit of all weights: tests/stages/test_audit.py); T = 12 in
both, so the f-DP bound's DP-SGD curves (cached by σ, q, T) are shared.
The accountant's ε at (σ, q, T) is what the bound is compared with.

Positive controls: the run's own sums read before the noise (public rows only) and a test
fixture that computes the noise draw and does not add it (``noise_drawn_not_added``) must put
the lower bound ABOVE the claimed ε; the honest run must keep it at or below (probability ≥ 1 − β).
"""
import math

import numpy as np
import pytest

from dpbert.config import load_config
from dpbert.evaluate import whitebox as wb
from dpbert.mechanism import clipping
from dpbert.mechanism import integrity
from dpbert.engine.hooks import Hook
from dpbert.engine.loop import TrainLoop
from dpbert.privacy import events
from tests.model.broken_mechanisms import noise_drawn_not_added, patched
from tests.tiny import CLASSIC

ROWS, STEPS, SIGMA, CANARIES = 160, 12, 1.5, 500
TINY_MODEL = ["model.max_seq_length=16", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
              "model.intermediate_size=32", "model.dropout=0.0", "training.batch_size=16",
              f"training.steps={STEPS}", f"training.dataset_size={ROWS}", "membership.holdout_patient_fraction=0",
              f"training.noise_multiplier={SIGMA}", "training.clip_norm=1.0", "training.warmup_steps=0",
              "training.dp_diagnostics=false", "training.checkpoint_every=1000"]


def config(*extra):
    return load_config(None, CLASSIC + TINY_MODEL + list(extra), preset="demo")


@pytest.fixture(scope="module")
def rows():
    ids, vocab = wb.demo_token_rows()
    return ids[:ROWS], vocab


def patients(n):
    return [f"p{i // 2}" for i in range(n)]  # two tuples per patient


PATIENTS = 80
PATIENT_RUN = ("privacy.unit=patient", "privacy.max_tuples_per_patient=2", f"training.dataset_patients={PATIENTS}",
               "training.batch_size=8", "training.trainable=[bias,head]")


class LoopSpy(Hook):
    """Sees the loop the audit runs: its class, selection, sampler and the units of every step."""

    def __init__(self):
        self.loop, self.sampled = None, []

    def on_start(self, loop):
        self.loop = loop

    def on_step(self, loop, step, rounds, stats, sampled):
        self.sampled.append(np.asarray(sampled).copy())


def audit(rows, cfg, plan=None, patient_keys=None, hooks=(), **settings):
    from dpbert.privacy.plan import plan_for_config

    ids, vocab = rows
    settings.setdefault("public", True)
    return wb.whitebox_audit(ids, list(wb.SPECIAL_IDS), vocab, cfg.model, cfg.training,
                             settings=wb.AuditSettings(**settings), plan=plan or plan_for_config(cfg, ROWS),
                             patient_keys=patient_keys, hooks=hooks, mask_token_id=wb.MASK_ID)


@pytest.fixture(scope="module")
def patient_audit(rows):
    """``(spy, result)``: the patient-unit run's audit with its positive control, its per-step
    arrays and power, the loop seen by a ``LoopSpy``. Its tests share an xdist group: one run."""
    from dpbert.privacy.plan import plan_for_config

    cfg = config(*PATIENT_RUN)
    spy = LoopSpy()
    res = audit(rows, cfg, plan=plan_for_config(cfg, PATIENTS), patient_keys=patients(ROWS), canaries=CANARIES, seed=3,
                positive_control=True, hooks=[spy], return_arrays=True)
    return spy, res


@pytest.mark.xdist_group("patient_audit")
def test_the_audit_runs_the_configured_loop_with_canaries_as_patients_of_its_sampler(patient_audit):
    spy, res = patient_audit
    loop = spy.loop
    assert type(loop) is TrainLoop and loop.source.patient_unit and loop.source.k == 2
    assert loop.stepper.selection.names == ["bias", "head"] and loop.stepper.config.group_size == 2
    # the report names the audited unit, k, the trainable set and the (trained) piece with the canaries
    assert res["audited_unit"] == "patient" and res["max_contributions"] == 2
    pieces = loop.stepper.selection.pieces
    largest = max(pieces, key=lambda p: p.size)  # the output bias (V = 1024 > H² = 256 here)
    assert res["trainable"] == ["bias", "head"] and res["probe_variable"] == largest.name
    assert "word_embeddings/embeddings:0" not in [p.name for p in pieces]
    assert res["q"] == pytest.approx(8 / 80) and res["steps_executed"] == STEPS
    # canary units: the included ones only, each a patient of its own, drawn by the run's sampler
    units = loop.source.sampler.units
    assert units.size == res["included"].sum() and len(loop.source.groups) == PATIENTS + units.size
    assert all(loop.source.groups.members[u].size == 1 for u in units)
    for t, sampled in enumerate(spy.sampled):
        drawn = np.isin(units, sampled)
        np.testing.assert_array_equal(res["participation"][t][res["included"]], drawn)
    assert not res["participation"][:, ~res["included"]].any()
    # an audit is a DP release on its rows: the run's per-patient record, marked as the audit's
    event = res["dp_event"]
    assert event["origin"] == "audit" and event["sampling_unit"] == "patient" and event["steps"] == STEPS
    events.validate_record({k: v for k, v in event.items() if k != "origin"})
    assert "DP release" in res["dp_release"]


def test_canary_rows_contribute_no_gradient_of_their_own(rows):
    """No double count: the empty row's loss and every gradient are exactly 0, so a canary unit
    adds its injected vector (norm C) and nothing else."""
    from dpbert.network import bert as bert_lib
    from dpbert.engine.mlm import make_mlm_functions

    ids, vocab = rows
    spec = wb.demo_spec(vocab, ids.shape[1])
    models = bert_lib.build_bert(spec, seed=0)
    mask_fn, prepare_fn, loss_fn, _ = make_mlm_functions(spec, list(wb.SPECIAL_IDS), wb.MASK_ID, 0.15)
    from dpbert.engine.masking import example_keys

    features = mask_fn(wb.canary_rows(3, ids.shape[1]), example_keys(7, 0, np.arange(3)))
    assert not features["masked_weights"].any()
    inputs, targets = prepare_fn({k: np.asarray(v) for k, v in features.items()})
    grads, losses, _ = clipping.plain_gradients(models.mlm, inputs, lambda o: loss_fn(targets, o), np.ones(3))
    assert float(np.abs(losses).sum()) == 0.0 and all(float(np.abs(g).sum()) == 0.0 for g in grads)
    # a real row does move the same gradients (the check above is not vacuous)
    real = mask_fn(ids[:3], example_keys(7, 0, np.arange(3)))
    inputs, targets = prepare_fn({k: np.asarray(v) for k, v in real.items()})
    grads, _, _ = clipping.plain_gradients(models.mlm, inputs, lambda o: loss_fn(targets, o), np.ones(3))
    assert sum(float(np.abs(g).sum()) for g in grads) > 0


@pytest.mark.xdist_group("patient_audit")
def test_positive_control_before_the_noise_exceeds_the_claim_and_the_honest_bound_does_not(patient_audit):
    _, res = patient_audit
    upper = res["epsilon_upper_bound"]
    assert res["noise_multiplier_applied"] == SIGMA and res["q"] == pytest.approx(0.1)
    assert 0.0 <= res["epsilon_lower_bound"] <= upper, res
    assert res["positive_control_lower_bound"] > upper, res
    assert res["positive_control_lower_bound"] <= res["max_reachable_lower_bound"] + 1e-9
    # the f-DP bound is at least as strong as SNJ's on the same guesses; the report names its power
    assert res["positive_control_lower_bound"] >= res["positive_control_lower_bound_snj"]
    assert 0 < res["weakest_detected_noise_factor"] < 1 and res["cannot_detect"] and "σ ×" in res["detects"]
    # the probe sees the claimed σ: mean square of g̃_t − canary sums − (sum before the noise −
    # canary sums) over T·d' values is σ²C² (χ² law, 5 sd)
    noise = res["observed"].astype(np.float64) - res["noiseless"]
    ratio = np.mean(noise ** 2) / SIGMA ** 2
    assert abs(ratio - 1.0) <= 5 * math.sqrt(2.0 / noise.size), ratio
    # included canaries take part in Binomial(T, q) steps (5 sd)
    n_in = res["canaries_included"]
    assert abs(res["canary_participations"] - 0.1 * STEPS) <= 5 * math.sqrt(STEPS * 0.09 / n_in)


@pytest.mark.xdist_group("patient_audit")  # after it on one worker: the DP-SGD curves at (q, T) are cached
def test_fault_injection_noise_not_added_is_refuted_by_the_honest_reading(rows):
    """Test fixture: the step computes its draw and does not add it. The run-time checks would
    stop the run first; they are switched off here (no brute-force clipping check, no evaluation)
    so the audit itself is what catches it."""
    with noise_drawn_not_added(), patched(integrity.RunChecks, _evaluate=lambda self: None):
        res = audit(rows, config("training.integrity_check_every=0", "training.trainable=[bias,head]"),
                    canaries=CANARIES, seed=4, report_power=False)
    assert res["epsilon_lower_bound"] > res["epsilon_upper_bound"], res
    assert not res["consistent"]


def test_the_positive_control_is_refused_on_non_public_rows(rows):
    with pytest.raises(ValueError, match="not private"):
        audit(rows, config(), canaries=100, public=False, positive_control=True)
