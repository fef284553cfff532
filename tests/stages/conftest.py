"""Tiny inputs for the stage tests: tuples of a small synthetic corpus, a WordPiece vocabulary
learnt from them, a tiny BERT artifact, tiny model and training configurations; and the trainer
stage's runs several tests read, each trained once per session (below). No TFX anywhere."""
from collections import Counter

import pytest

TUPLE_WORDS = 24
PATIENTS = 10
HOLDOUT_KEY = bytes(range(32))


@pytest.fixture(scope="session")
def raw_tuples():
    from dpbert.data.synthetic import generate_notes
    from dpbert.data.tuples import corpus_tuples

    return list(corpus_tuples(generate_notes(patients=PATIENTS, admissions_per_patient=1, notes_per_admission=1,
                                             seed=4), tuple_words=TUPLE_WORDS))


@pytest.fixture(scope="session")
def tuples_dir(tmp_path_factory, raw_tuples):
    from dpbert.data.tfrecord import write_tuples

    from dpbert.data.splits import write_holdout_key

    path = tmp_path_factory.mktemp("stages") / "tuples"
    write_tuples(raw_tuples, str(path), num_shards=2)
    write_holdout_key(str(path), HOLDOUT_KEY)  # what the ingestion writes (a fixed key for the tests)
    return str(path)


@pytest.fixture(scope="session")
def vocabulary_dir(tmp_path_factory, raw_tuples):
    from dpbert.vocab.wordpiece import save_vocabulary, train_wordpiece

    path = tmp_path_factory.mktemp("stages") / "vocabulary"
    save_vocabulary(train_wordpiece(Counter(w for t in raw_tuples for w in t.words).items(), vocab_size=120), path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory, vocabulary_dir):
    """A model artifact's folders (``model/``, ``tokenizer/``) of a tiny random BERT on the session
    vocabulary (32 tokens), for the stages that read a trained model. Read-only."""
    import shutil

    from dpbert import schema
    from dpbert.network.bert import BertSpec, build_bert, save_bert
    from dpbert.vocab.wordpiece import load_tokenizer

    root = tmp_path_factory.mktemp("tiny_bert") / "model"
    spec = BertSpec(vocab_size=load_tokenizer(vocabulary_dir).get_vocab_size(), hidden_size=16, num_layers=1,
                    num_heads=2, intermediate_size=32, max_seq_length=32, max_predictions=5)
    save_bert(build_bert(spec, seed=1), root / schema.MODEL_DIR)
    shutil.copytree(vocabulary_dir, root / schema.TOKENIZER_DIR)
    return str(root)


def tiny_model_config(max_seq_length=16):
    from dpbert.config import ModelConfig

    return ModelConfig(preset="custom", hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                       max_seq_length=max_seq_length, dropout=0.0)


def tiny_training_config(**overrides):
    from dpbert.config import TrainingConfig

    # No noise seed: a seeded run is recorded as ε = ∞ (predictable noise). No run-time integrity
    # checks (their eager brute-force clipping check costs seconds a run): the stage tests are about
    # plans, records, ledgers and windows; the checks are tests/model/test_integrity_checks.py's.
    params = dict(batch_size=4, steps=2, warmup_steps=0, clip_norm=1.0, noise_multiplier=1.0, checkpoint_every=50,
                  delta=1e-5, integrity_check_every=0)
    params.update(overrides)
    return TrainingConfig(**params)


# Stage runs several tests read. A DP stage run costs seconds of CPU (mostly tracing its step), so
# each is trained ONCE per session and the tests assert on it; a test that uses one carries
# ``xdist_group(<fixture name>)`` so that ``--dist loadgroup`` trains it on one worker only. The
# runs of a few steps whose claims are about the stage (plan, records, ledger, windows), not the
# traced step, run their steps eagerly (tests/model/conftest.py ``eagerly``); the planning case's
# run (11 steps) stays traced, so a traced stage run remains in make test.

#: The planning case of tests/stages/test_pretrain.py: training.epochs 1.1 of a public n = 50 at
#: B = 5 plans 11 steps (one TrainingPlan for the budget guard and the trainer).
PUBLIC_N_RUN = dict(batch_size=5, steps=None, epochs=1.1, dataset_size=50)
#: The shuffled chain: 3 planned steps at B = 4, a crash after 2 (no checkpoint), the resume.
SHUFFLED_CRASH_AFTER = 2
#: The patient chain: 3 planned steps of B = 2 patients (k = 2 tuples each) over the public number
#: of patients, a checkpoint every step, a crash after 2, the resume from that checkpoint.
PATIENT_CHAIN = dict(batch_size=2, steps=3, dataset_patients=PATIENTS, checkpoint_every=1)
PATIENT_CRASH_AFTER = 2


@pytest.fixture
def eager_steps():
    """The test's training steps run eagerly (tests/model/conftest.py ``eagerly``)."""
    from tests.model.conftest import eagerly

    with eagerly():
        yield


def ledger_target(location, budget=None, unit="tuple") -> str:
    """The dataset ledger's ``LedgerTarget`` JSON of the stage tests (one dataset)."""
    from dpbert.accounting.target import LedgerTarget

    return LedgerTarget(dataset_id="ward-7", unit=unit, delta=1e-5, epsilon_budget=budget,
                        location=str(location)).to_json()


def ledger_entries(location, unit="tuple") -> list:
    """The entries of the stage tests' dataset ledger under ``location``."""
    from dpbert.accounting.target import LedgerTarget
    from dpbert.ledger.dataset import read_ledger

    return list(read_ledger(LedgerTarget.from_json(ledger_target(location, unit=unit)).uri())["entries"].values())


def run_stage(root, tuples_dir, vocabulary_dir, tc, name="model", privacy_config=None, **options):
    """``dpbert.stages.pretrain.pretrain`` of the tiny model into ``root``/MLMPretrainer/model/``name``
    (``options``: ``PretrainOptions``' fields)."""
    from dpbert.config import MembershipConfig, PrivacyConfig
    from dpbert.stages import pretrain as stage

    return stage.pretrain(stage.PretrainInputs(tuples_dir, vocabulary_dir),
                          str(root / "MLMPretrainer" / "model" / name),
                          model_config=tiny_model_config(), training_config=tc,
                          privacy_config=privacy_config or PrivacyConfig(tuple_words=24),
                          membership_config=MembershipConfig(), pipeline_root=str(root),
                          options=stage.PretrainOptions(export_saved_model=False, **options))


def step_probe():
    """A hook recording what the loop shows it: ``started`` (start step, planned steps, units > 0),
    ``steps`` (per step: the step, the write-ahead step log's count when the hook sees it, the
    units sampled, the units the step processed) and ``ended``."""
    import numpy as np

    from dpbert.engine.hooks import Hook

    class StepProbe(Hook):
        def __init__(self):
            self.started, self.ended, self.steps = None, False, []

        def on_start(self, loop):
            self.started = (loop.start_step, loop.steps_planned, loop.source.units > 0)

        def on_step(self, loop, step, rounds, stats, sampled):
            logged = loop.step_log.read()["steps_executed"]
            self.steps.append((step, logged, np.asarray(sampled).size, int(stats["units"])))

        def on_end(self, loop):
            self.ended = True

    return StepProbe()


@pytest.fixture(scope="session")
def public_n_run(tmp_path_factory, tuples_dir, vocabulary_dir):
    """The DP run of :data:`PUBLIC_N_RUN` with a :func:`step_probe` and a dataset ledger:
    ``training_config``, ``result`` (the stage's), ``probe``, ``root`` and ``ledgers`` (the
    ledger's folder; a test that adds to it works on a copy)."""
    from types import SimpleNamespace

    root = tmp_path_factory.mktemp("public_n_run")
    tc, probe = tiny_training_config(**PUBLIC_N_RUN), step_probe()
    result = run_stage(root, tuples_dir, vocabulary_dir, tc, hooks=[probe],
                       ledger_target=ledger_target(root / "ledgers"))
    return SimpleNamespace(training_config=tc, result=result, probe=probe, root=root, ledgers=root / "ledgers")


@pytest.fixture(scope="session")
def dp_count_run(tmp_path_factory, tuples_dir, vocabulary_dir):
    """A 2-step DP run without training.dataset_size (its plan is over a DP count):
    ``training_config``, ``result``, ``root`` (the pipeline root; a test that changes its state
    works on a copy) and ``model_dir``."""
    from types import SimpleNamespace

    from tests.model.conftest import eagerly

    root = tmp_path_factory.mktemp("dp_count_run") / "root"
    tc = tiny_training_config(steps=2)
    with eagerly():
        result = run_stage(root, tuples_dir, vocabulary_dir, tc)
    return SimpleNamespace(training_config=tc, result=result, root=root,
                           model_dir=root / "MLMPretrainer" / "model" / "model")


def _finalized_training_records(location):
    (entry,) = ledger_entries(location)
    return entry["status"], [r for r in entry["executed"] if r["mechanism"] == "dp_sgd"]


@pytest.fixture(scope="session")
def shuffled_chain(tmp_path_factory, tuples_dir, vocabulary_dir, raw_tuples):
    """A shuffle-sampled DP chain with a dataset ledger: 3 planned steps at B = 4 over the n rows,
    a crash after :data:`SHUFFLED_CRASH_AFTER` steps (no checkpoint), then the resume to the end.
    ``training_config``, ``n``; the ledger's entry after the crash (``crashed``: (status, DP-SGD
    records)) and after the resume (``finalized``); ``result`` (the resume's); ``sampled``: the
    rows of every window the sampler drew, in order, over both runs."""
    from types import SimpleNamespace

    from dpbert.mechanism import sampling
    from dpbert.engine.hooks import CrashAfter, SimulatedCrash
    from tests.model.conftest import eagerly

    root = tmp_path_factory.mktemp("shuffled_chain")
    tc = tiny_training_config(steps=3, dataset_size=len(raw_tuples), sampling="shuffle")
    target, sampled = ledger_target(root / "ledgers"), []
    real_sample = sampling.ShuffleSampler.sample

    def spy(self, step):
        rows = real_sample(self, step)
        sampled.append(rows)
        return rows

    with pytest.MonkeyPatch.context() as patch, eagerly():
        patch.setattr(sampling.ShuffleSampler, "sample", spy)
        with pytest.raises(SimulatedCrash):
            run_stage(root, tuples_dir, vocabulary_dir, tc, hooks=[CrashAfter(SHUFFLED_CRASH_AFTER)],
                      ledger_target=target)
        crashed = _finalized_training_records(root / "ledgers")
        result = run_stage(root, tuples_dir, vocabulary_dir, tc, ledger_target=target)
    return SimpleNamespace(training_config=tc, n=len(raw_tuples), crashed=crashed, result=result,
                           finalized=_finalized_training_records(root / "ledgers"), sampled=sampled)


@pytest.fixture(scope="session")
def patient_chain(tmp_path_factory, tuples_dir, vocabulary_dir):
    """The per-patient DP chain of :data:`PATIENT_CHAIN` with a dataset ledger (unit patient): a
    crash after :data:`PATIENT_CRASH_AFTER` steps, then the resume from its checkpoint to the end.
    ``training_config``, ``privacy_config``, ``crashed`` (the ledger's entries after the crash),
    ``result`` (the resume's), ``entries`` (after it) and ``ledgers`` (the ledger's folder)."""
    from types import SimpleNamespace

    from dpbert.config import PrivacyConfig
    from dpbert.engine.hooks import CrashAfter, SimulatedCrash
    from tests.model.conftest import eagerly

    root = tmp_path_factory.mktemp("patient_chain")
    tc = tiny_training_config(**PATIENT_CHAIN)
    pc = PrivacyConfig(tuple_words=24, unit="patient", max_tuples_per_patient=2)
    target = ledger_target(root / "ledgers", unit="patient")
    with eagerly():
        with pytest.raises(SimulatedCrash):
            run_stage(root, tuples_dir, vocabulary_dir, tc, privacy_config=pc, ledger_target=target,
                      hooks=[CrashAfter(PATIENT_CRASH_AFTER)])
        crashed = ledger_entries(root / "ledgers", unit="patient")
        result = run_stage(root, tuples_dir, vocabulary_dir, tc, privacy_config=pc, ledger_target=target)
    return SimpleNamespace(training_config=tc, privacy_config=pc, crashed=crashed, result=result,
                           entries=ledger_entries(root / "ledgers", unit="patient"), ledgers=root / "ledgers")
