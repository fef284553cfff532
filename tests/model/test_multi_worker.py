"""DP-SGD across worker processes (issue 25 items 1–3): MultiWorkerMirroredStrategy on loopback.

1. The broken noise placements (positive controls, test fixtures ``broken_mechanisms.PLACEMENTS``
   applied in the worker processes by ``multi_worker_worker.py``) fail the two-worker noise
   check: full σ per worker before the SUM (ratio √2), the same draw before the SUM (ratio 2),
   each worker its own seed after the SUM (parameters diverge). The honest check (ratio ≈ 1,
   identical parameters) is ``dpbert privacy noise-check --workers 2``
   (tests/model/test_noise_check_cli.py).
2. Same mechanism, any layout: a tiny model trained 2 steps on 2 workers and in 1 process, with the
   same test keys (noise seed, MLM mask key, patient-row key), the test-only PRF sampler (a unit's
   coin is a function of (key, its id, step), so the same units are sampled whichever worker holds
   them) and dropout 0, releases the same parameters (rtol 1e-5), per tuple and per patient. The
   noise is the SAME draw in both layouts, not a stand-in: the mechanism adds one seeded draw
   z(seed, step, variable) after the SUM whatever the layout (``dpbert.mechanism.gaussian``), and the
   2-worker run's seed is the chief's, shared by the all-reduce. What may differ is the float
   summation order of the clipped sums (hence rtol, not equality).
   The 2-worker run's recorded event matches what ran (``event_check.check_event`` on the chief's
   ``observe``): global q and B, the chief's ledger, σ and mode from the step.
"""
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import SPECIALS, eagerly, repetitive_corpus, tiny_model  # noqa: E402

HERE = Path(__file__).parent
STEPS = 2  # the first step runs the clipping check, the second starts from parameters a step moved


def runs(replicas: int):
    """The two tiny runs (keyword arguments of ``build_training``) for a layout with ``replicas``. The
    2-worker runs also run the brute-force clipping check (it reads the weights, it changes
    nothing) at their first step, where it runs eagerly (a collective replay on both workers; no
    trace of the check's function); the 1-process reference skips it (test time)."""
    from prf_sampling import prf_sampler

    from dpbert.config import TrainingConfig
    from dpbert.privacy.plan import plan_training

    model = tiny_model()
    accumulation = 4 // replicas  # m = B/(P·T) = 2 in both layouts (the packing differs anyway)

    def training(**kw):
        return TrainingConfig(batch_size=8, steps=STEPS, replicas=replicas, accumulation_steps=accumulation,
                              strategy="multi_worker" if replicas > 1 else "default", noise_multiplier=0.7,
                              clip_norm=1.0, checkpoint_every=2, warmup_steps=1, noise_seed=11,
                              integrity_check_every=4 if replicas > 1 else 0, **kw)

    ids = repetitive_corpus(n=60)
    keys = [f"P{i % 20}" for i in range(60)]
    tc_patient = training()
    common = dict(special_token_ids=SPECIALS, vocab_size=40, model_config=model, progress=False,
                  export_saved_model=False, sampler_factory=prf_sampler(5))
    return {
        "tuple": dict(common, token_ids=ids, training_config=training(), example_ids=np.arange(60) * 7 + 3),
        "patient": dict(common, token_ids=ids, training_config=tc_patient, patient_keys=keys,
                        plan=plan_training(tc_patient, 20, unit="patient", max_contributions=2)),
    }


@pytest.mark.slow  # make test-all (≈ 30 s); docs/development.md
def test_broken_noise_placements_fail_the_two_worker_noise_check():
    """Positive controls (``broken_mechanisms.PLACEMENTS``, applied by the test worker script in its
    own two processes): full σ per worker before the SUM (ratio √2), the same draw before the SUM
    (ratio 2), each worker its own seed after the SUM (parameters diverge). The honest two-worker
    check: ``dpbert privacy noise-check --workers 2`` in tests/model/test_noise_check_cli.py."""
    from dpbert.diagnostics.noise_check import combine_workers, launch_workers

    placements = ["per_replica_full", "same_before_sum", "own_seed"]
    started = time.monotonic()
    stdout = launch_workers([sys.executable, str(HERE / "multi_worker_worker.py"), "noise", *placements], 2,
                            timeout=150)
    seconds = time.monotonic() - started
    per_worker = [json.loads(s.strip().splitlines()[-1]) for s in stdout]
    controls = {name: combine_workers([w[name] for w in per_worker]) for name in placements}
    assert all(c["strategy"] == "MultiWorkerMirroredStrategy" and c["workers"] == 2 for c in controls.values())
    assert not controls["per_replica_full"]["passed"] and abs(controls["per_replica_full"]["ratio"] - 2 ** 0.5) < 0.05
    assert not controls["same_before_sum"]["passed"] and abs(controls["same_before_sum"]["ratio"] - 2) < 0.07
    assert not controls["own_seed"]["passed"] and not controls["own_seed"]["checks"]["replicas_in_sync"]
    assert seconds <= 140, seconds  # two worker start-ups and three traced steps each, on a shared CPU


pytestmark = pytest.mark.xdist_group("multi_worker")  # one launch of the worker processes per session


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """``launch(unit)``: one two-worker cluster training that unit's run (launched once per unit)."""
    from dpbert.diagnostics.noise_check import launch_workers

    launched = {}

    def launch(unit):
        if unit not in launched:
            out = tmp_path_factory.mktemp("mw")
            stdout = launch_workers([sys.executable, str(HERE / "multi_worker_worker.py"), str(out), unit], 2,
                                    timeout=150)
            launched[unit] = out, [json.loads(s.strip().splitlines()[-1]) for s in stdout]
        return launched[unit]

    return launch


# The patient unit's cluster in the slow tier (CI): the tuple unit's covers the cross-worker code.
@pytest.mark.parametrize("unit", ["tuple", pytest.param("patient", marks=pytest.mark.slow)])
def test_two_workers_release_what_one_process_releases(two_workers, tmp_path, unit):
    from dpbert.network import bert as bert_lib
    from prf_sampling import train_with

    from dpbert.privacy.event_check import check_event
    from dpbert.stages.pretrain import training_record

    out, results = two_workers(unit)
    chief, other = results[0][unit], results[1][unit]
    assert (chief["workers"], chief["worker_rank"], other["worker_rank"]) == (2, 0, 1)
    assert chief["strategy"] == "MultiWorkerMirroredStrategy"
    assert chief["parameter_digest"] == other["parameter_digest"]  # identical on every worker
    assert chief["steps_taken_total"] == STEPS and json.loads((out / unit / "dp_steps.json").read_text())[
        "steps_executed"] == STEPS
    assert all(c["passed"] is not False for c in chief["integrity_checks"].values())
    assert chief["integrity_checks"]["clipping"]["ran"]
    kwargs = runs(replicas=1)[unit]
    with eagerly():  # 2 steps: cheaper than their trace; the values are compared (rtol 1e-5), not the trace
        reference = train_with(output_dir=str(tmp_path / unit), **kwargs)
    assert reference.strategy != "MultiWorkerMirroredStrategy"
    ours = bert_lib.load_bert(out / unit / "model").mlm.get_weights()
    theirs = bert_lib.load_bert(tmp_path / unit / "model").mlm.get_weights()
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    # Not vacuous: training moved the parameters by far more than the tolerance.
    init = bert_lib.build_bert(bert_lib.load_bert(out / unit / "model").spec, seed=0).mlm.get_weights()
    assert max(float(np.max(np.abs(a - c))) for a, c in zip(ours, init)) > 1e-3
    # The recorded event of the 2-worker run matches what ran: global q and B, the chief's ledger.
    plan = kwargs.get("plan")
    if plan is None:
        from dpbert.privacy.plan import plan_training
        plan = plan_training(kwargs["training_config"], 60)
    record = training_record(chief["effective_noise_multiplier"], plan, 60, chief["steps_taken_total"])
    assert check_event(record, chief["observed"]) == []
    assert chief["observed"]["workers"] == 2 and chief["observed"]["replicas"] == 2
    # ... and a record that charges one worker's share (its expected batch B/W) is caught.
    half = dict(chief["observed"], expected_batch_size=chief["observed"]["expected_batch_size"] / 2)
    assert check_event(record, half)


# ------------------------------------------------------------------------------ no TensorFlow cluster needed
def test_sharding_keeps_a_patient_on_one_worker_and_the_union_is_the_whole_poisson_sample():
    from dpbert.mechanism import sampling

    groups = sampling.group_rows([f"P{i % 37}" for i in range(300)])
    owner = sampling.shard_of(groups.ids, 3)
    assert np.array_equal(owner, sampling.shard_of(groups.ids, 3))  # stable (no salted hash)
    assert set(np.bincount(owner, minlength=3) > 0) == {True}
    # The PRF coins: the union of the workers' samples is the one-process sample, step by step.
    one = sampling.PatientPoissonSampler(groups, 0.3, 2, key=1, prf_key=9)
    shards = [sampling.PatientPoissonSampler(groups, 0.3, 2, key=1, prf_key=9, shard=np.nonzero(owner == w)[0])
              for w in range(3)]
    for step in range(4):
        assert np.array_equal(np.sort(np.concatenate([s.sample(step) for s in shards])), one.sample(step))
    # Fresh-key coins per worker: the union's size is Binomial(n, q) (mean and variance).
    ids = np.arange(400) * 13 + 1
    owner = sampling.shard_of(ids, 2)
    workers = [sampling.PoissonSampler(400, 0.1, seed=w, shard=np.nonzero(owner == w)[0]) for w in range(2)]
    sizes = np.array([sum(len(s.sample(t)) for s in workers) for t in range(400)])
    assert abs(sizes.mean() - 40) < 4 * np.sqrt(36 / 400)
    assert 0.7 < sizes.var() / 36 < 1.3
    # A worker samples only its own units.
    assert all(set(workers[w].sample(0)) <= set(np.nonzero(owner == w)[0]) for w in range(2))


def test_config_names_multi_worker_and_refuses_shuffle_with_it(monkeypatch):
    from dpbert.config import ConfigError, TrainingConfig
    from dpbert.engine.train import make_strategy

    with pytest.raises(ConfigError, match="t.strategy multi_worker_mirrored is now called multi_worker"):
        TrainingConfig(strategy="multi_worker_mirrored", steps=1).validate("t")
    with pytest.raises(ConfigError, match="t.sampling must be poisson with training.strategy multi_worker"):
        TrainingConfig(strategy="multi_worker", sampling="shuffle", steps=1).validate("t")
    TrainingConfig(strategy="multi_worker", steps=1, replicas=2, batch_size=8).validate("t")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="TF_CONFIG"):
        make_strategy("multi_worker", 2)


def test_one_strategy_per_process(monkeypatch):
    """``multi_worker_strategy`` builds ONE MultiWorkerMirroredStrategy per process: the trainer
    worker's (dpbert.trainer_workers, before any op) is the one the stage trains with. A second one
    re-enabled the collectives on the live context and hung the first broadcast when a worker
    reached it before the chief built its second strategy (the killed-worker re-run,
    tests/e2e/test_workers.py)."""
    import tensorflow as tf

    from dpbert.engine import devices

    built = []

    class FakeStrategy:
        num_replicas_in_sync = 2

        def __init__(self, **kwargs):
            built.append(kwargs)

    monkeypatch.setattr(devices, "_MULTI_WORKER", {}, raising=False)
    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", FakeStrategy)
    cluster = {"worker": ["localhost:1", "localhost:2"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}))
    first = devices.multi_worker_strategy(2)
    assert devices.make_strategy("multi_worker", 2) is first and len(built) == 1
    with pytest.raises(ValueError, match="training.replicas says 4"):
        devices.multi_worker_strategy(4)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    with pytest.raises(RuntimeError, match="another TF_CONFIG"):
        devices.multi_worker_strategy(2)
