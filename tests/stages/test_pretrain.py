"""dpbert.stages.pretrain without TFX: the plan (planned steps == executed steps), the holdout,
the state directory and resume, the artifact files and properties."""
import json
import os
import random

import pytest

from dpbert import schema, storage
from dpbert.config import MembershipConfig, PrivacyConfig
from dpbert.stages import pretrain as stage

from .conftest import tiny_model_config, tiny_training_config


def _pretrain(tmp_path, tuples_dir, vocabulary_dir, tc, membership=None, name="model", **options):
    root = tmp_path / "root"
    model_dir = root / "MLMPretrainer" / "model" / name
    result = stage.pretrain(stage.PretrainInputs(tuples_dir, vocabulary_dir), str(model_dir),
                            model_config=tiny_model_config(), training_config=tc,
                            privacy_config=PrivacyConfig(tuple_words=24),
                            membership_config=membership or MembershipConfig(), pipeline_root=str(root),
                            options=stage.PretrainOptions(export_saved_model=False, **options))
    return result, model_dir


#: The issue's case: the guard planned 11 steps, the trainer used to run 12.
FIRST_DRAW = ({"epochs": 1.1, "steps": None}, 5, 50)


def _draws(count, seed=13):
    """Random (steps | epochs, B, n) with at most ~12 planned steps; the issue's case first."""
    rng = random.Random(seed)
    yield FIRST_DRAW
    for _ in range(count):
        B = rng.choice([2, 3, 4, 5, 8])
        n = rng.randint(B, 60)
        if rng.random() < 0.3:
            yield {"steps": rng.randint(1, 12), "epochs": None}, B, n
        else:
            max_epochs = 12 * B / n
            yield {"epochs": round(rng.uniform(0.05, max_epochs), rng.choice([1, 2, 3])) or 0.1, "steps": None}, B, n


# The case in make test (the shared run conftest.PUBLIC_N_RUN); the random draws in the
# slow tier (CI).
@pytest.mark.parametrize("draw", [pytest.param(d, marks=pytest.mark.xdist_group("public_n_run")) if d == FIRST_DRAW
                                  else pytest.param(d, marks=pytest.mark.slow)
                                  for d in _draws(2)], ids=lambda d: f"{d[0]}-B{d[1]}-n{d[2]}")
def test_planned_steps_equal_executed_steps(tmp_path, tuples_dir, vocabulary_dir, draw, request):
    """The budget guard's plan and the trainer stage agree on the number of steps (one TrainingPlan)."""
    from dpbert.config import load_config
    from dpbert.accounting.accountant import planned_ledger
    from pipeline import guard

    length, B, n = draw
    length_args = [f"training.{k}={'null' if v is None else v}" for k, v in length.items()]
    config = load_config(overrides=length_args + [f"training.batch_size={B}", "training.warmup_steps=0",
                                                  "vocab.sigma=2", "privacy.tuple_words=24"])
    planned_steps = guard.planned(config, dataset_size=n)["steps"]
    assert planned_steps == planned_ledger(config, n)["steps"] <= 13
    # DP or not, the run takes the plan's steps; the DP path is cheaper to skip in a loop of draws.
    tc = tiny_training_config(batch_size=B, steps=config.training.steps, epochs=config.training.epochs,
                              dataset_size=n)
    if draw == FIRST_DRAW:  # the DP run other tests read too, trained once
        shared = request.getfixturevalue("public_n_run")
        assert shared.training_config == tc
        result = shared.result
    else:
        result, _ = _pretrain(tmp_path, tuples_dir, vocabulary_dir, tc, non_private=True)
    assert result.plan.steps == planned_steps
    assert result.train.steps_this_run == planned_steps == result.properties[schema.STEPS_TAKEN_TOTAL]
    assert result.properties[schema.STEPS_PLANNED] == planned_steps
    assert result.properties["planned_dataset_size"] == n
    if draw == FIRST_DRAW:
        assert planned_steps == 11 and result.dp_event["steps"] == 11


@pytest.mark.xdist_group("dp_count_run")
def test_artifact_files_properties_and_dp_event(dp_count_run, raw_tuples):
    from dpbert.accounting import accountant
    from dpbert.privacy import events

    # The shared 2-step run over a DP count (conftest.dp_count_run), its pipeline root ``root``.
    tc, result, model_dir, root = (dp_count_run.training_config, dp_count_run.result, dp_count_run.model_dir,
                                   dp_count_run.root)
    assert tc.steps == 2 and tc.dataset_size is None
    for name in (schema.MODEL_DIR, schema.TOKENIZER_DIR, schema.DP_EVENTS_FILE, schema.RUN_CONFIG_FILE,
                 schema.STEP_LOG_FILE):
        assert (model_dir / name).exists(), name
    # The exact training curves stay in the private state directory.
    assert not (model_dir / schema.TRAIN_RESULT_FILE).exists()
    assert (root / stage.STATE_ROOT / stage.PRIVATE_MARKER).exists()
    assert not (model_dir / schema.CANARY_COUNTS_FILE).exists()
    tokenizer_dir = str(model_dir / schema.TOKENIZER_DIR)  # listed as the storage layer sees it
    assert storage.storage_for(tokenizer_dir).listdir(tokenizer_dir) == ["tokenizer.json", "vocab.txt"]
    props = result.properties
    n = len(raw_tuples)
    # Without training.dataset_size the plan's n is a DP count (charged), never the exact n.
    assert "dataset_size" not in props and props["dataset_size_source"] == "dp_count"
    n_hat = props["planned_dataset_size"]
    assert abs(n_hat - n) < 6 * 20.0 and props["sampling_rate"] == pytest.approx(4 / n_hat)
    assert props[schema.NON_PRIVATE] is False and props[schema.PRIVATE] == 0
    assert props[schema.HOLDOUT_FRACTION] is None and props["holdout_key_id"] is None
    assert props["diagnostics"] == "dp" and len(props["loss_curve"]) == 2
    assert props[schema.MAX_SEQ_LENGTH] == 16 and props["model_preset"] == "custom"
    count_record, record = events.from_json(props[schema.DP_EVENTS])
    assert [count_record, record] == json.loads((model_dir / schema.DP_EVENTS_FILE).read_text())
    assert count_record["mechanism"] == "dp_count" and count_record["released"] == n_hat
    # ε_T charges the DP count and the steps together (one ledger).
    assert props["epsilon_train"] == pytest.approx(accountant.ledger(None, [count_record, record], tc.delta)[
        "epsilon_train"])
    assert props["epsilon_train"] > accountant.dpsgd_epsilon(
        record["noise_multiplier"], record["sampling_probability"], 2, tc.delta, "poisson")
    # The state lives under the pipeline root, keyed by the inputs: stable across executions.
    assert os.path.dirname(result.state_dir) == str(root / stage.STATE_ROOT)


HOLDOUT = MembershipConfig(holdout_patient_fraction=0.3)


@pytest.fixture(scope="module")
def non_private_holdout_run(tmp_path_factory, tuples_dir, vocabulary_dir, raw_tuples):
    """One step (eager) of the non-private baseline with 30 % of the patients held out, for the two
    tests below."""
    from tests.model.conftest import eagerly

    with eagerly():
        result, _ = _pretrain(tmp_path_factory.mktemp("non_private_holdout"), tuples_dir, vocabulary_dir,
                              tiny_training_config(steps=1, dataset_size=len(raw_tuples)), HOLDOUT, non_private=True)
    return result


@pytest.mark.xdist_group("non_private_holdout_run")
def test_non_private_baseline_and_patient_unit(non_private_holdout_run):
    result = non_private_holdout_run
    assert result.properties[schema.NON_PRIVATE] is True and result.properties[schema.PRIVATE] == 1
    assert result.epsilon == float("inf") and result.dp_event["mechanism"] == "non_private"
    # privacy.unit = patient is no longer refused: user-level DP-SGD, tests/stages/test_pretrain_patient.py.


@pytest.mark.xdist_group("non_private_holdout_run")
def test_holdout_trains_on_the_split_membership_recomputes(non_private_holdout_run, tuples_dir, raw_tuples):
    from dpbert.data.splits import key_fingerprint, patient_key, split_patients

    from .conftest import HOLDOUT_KEY

    membership, result = HOLDOUT, non_private_holdout_run
    split = split_patients([patient_key(t) for t in raw_tuples], 0.7, HOLDOUT_KEY)
    assert split.oot and split.train
    props = result.properties
    assert props[schema.HOLDOUT_FRACTION] == 0.3 and props["holdout_key_id"] == key_fingerprint(HOLDOUT_KEY)
    train_patients, _ = stage.training_patients(tuples_dir, membership)
    assert train_patients == split.train
    # q is planned from the public n·(1 − f), never from the trained rows' exact count.
    assert props["planned_dataset_size"] == round(len(raw_tuples) * 0.7)
    assert stage.training_patients(tuples_dir, MembershipConfig()) == (None, None)


@pytest.mark.slow  # make test-all; covered in make test by the stage's crash and resume: tests/stages/test_pretrain_ledger.py
def test_a_crashed_run_resumes_from_the_state_directory(tmp_path, tuples_dir, vocabulary_dir, monkeypatch):
    from dpbert.engine.train import SimulatedCrash

    tc = tiny_training_config(steps=2, checkpoint_every=1)
    monkeypatch.setenv(stage.CRASH_AFTER_STEPS_ENV, "1")
    assert stage.crash_after_steps_from_env() == 1
    with pytest.raises(SimulatedCrash):
        _pretrain(tmp_path, tuples_dir, vocabulary_dir, tc, name="1")  # the env var adds a CrashAfter hook
    monkeypatch.delenv(stage.CRASH_AFTER_STEPS_ENV)
    assert stage.crash_after_steps_from_env() is None
    # A new execution (another output directory) of the same inputs finds the same state.
    result, _ = _pretrain(tmp_path, tuples_dir, vocabulary_dir, tc, name="2")
    assert result.properties["resumed_from_step"] == 1 and result.properties["steps_this_run"] == 1
    assert result.properties[schema.STEPS_TAKEN_TOTAL] == 2 == result.dp_event["steps"]


def test_state_dir_and_loss_curve():
    assert stage.state_dir("/r", "k") == stage.state_dir("/r", "k") != stage.state_dir("/r", "k2")
    assert stage.state_dir("/r", "k").startswith("/r/_trainer_state/")
    assert stage.loss_curve([1.0, 2.0]) == [1.0, 2.0]
    curve = stage.loss_curve(list(range(1000)), points=10)
    assert len(curve) == 11 and curve[-1] == 999.0
