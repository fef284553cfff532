"""`dpbert readout` (in-process, no training): on a trainer's artifact folder and its tuples, the
release is in the dataset's ledger after the command — one finalized `dp_readout` entry whose
records compose to the ε asked for at training.delta — and the printed result is labelled a DP
estimate; over the dataset's budget it is refused (exit 3) with the ledger untouched; without a
dataset identity, with a configuration that is not the run's or without the tuples: exit 2 and
nothing written; --public-only reads no private text and charges nothing."""
import json
import math

import pytest

from dpbert import exit_codes
from dpbert.config import load_config
from dpbert.data.tuples import WordTuple
from dpbert_cli.main import main
from tests.cli.test_export import VOCAB, _write_artifact

#: --dist loadgroup: the models built once per process (test_export.py's cache) are built on one worker.
pytestmark = pytest.mark.xdist_group("export_models")


DEFAULTS = "tests/cli/builtin_defaults.yaml"
EPSILON = 0.7
WORDS = [w for w in VOCAB[5:] if not w.startswith("##")]


@pytest.fixture(scope="module")
def run_folders(tmp_path_factory):
    """(the trainer's artifact folder, its WordTuples folder: 12 patients, 2 tuples each, a holdout key)."""
    from dpbert.data.splits import write_holdout_key
    from dpbert.data.tfrecord import write_tuples

    base = tmp_path_factory.mktemp("readout")
    _write_artifact(base / "artifact")
    tuples = [WordTuple(f"n{p}", i, tuple(WORDS[(p + i + j) % len(WORDS)] for j in range(10)), patient_id=f"p{p}")
              for p in range(12) for i in range(2)]
    write_tuples(tuples, str(base / "tuples"), num_shards=1)
    write_holdout_key(str(base / "tuples"), b"s" * 32)
    (base / "notes.jsonl").write_text("{}\n")
    return base


def _overrides(base, *extra):
    sets = [f"corpus.path={base / 'notes.jsonl'}", "corpus.dataset_id=notes-readout", "privacy.unit=patient",
            "model.max_seq_length=16", "membership.holdout_patient_fraction=0.5", "training.dataset_patients=12",
            "training.delta=1e-6", *extra]
    return sets, ["--config", DEFAULTS] + [a for s in sets for a in ("--set", s)]


def _ledger(sets):
    from dpbert import storage
    from dpbert.accounting.target import ledger_target

    uri = ledger_target(load_config(DEFAULTS, sets)).uri()
    return json.loads(storage.read_text(uri)) if storage.storage_for(uri).exists(uri) else None


def _readout(base, *args):
    return main(["readout", str(base / "artifact"), "--tuples", str(base / "tuples"), *map(str, args)])


def test_the_readout_is_in_the_datasets_ledger_after_the_command(run_folders, capsys):
    import dp_accounting

    from dpbert.accounting.epsilon import epsilon
    from dpbert.evaluate import readout
    from dpbert.ledger import composition

    sets, args = _overrides(run_folders)
    assert _ledger(sets) is None
    assert _readout(run_folders, *args, "--epsilon", EPSILON) == exit_codes.OK
    text = capsys.readouterr().out
    [entry] = _ledger(sets)["entries"].values()
    assert entry["mechanism"] == "dp_readout" and entry["status"] == "finalized" and entry["unit"] == "patient"
    assert entry["stage"] == "readout" and f"entry {entry['id']} of dataset notes-readout" in text
    event = composition.composed_event(composition.charged_records(entry))
    z_sum, _ = readout.noise_for(EPSILON, 1e-6, False)
    assert event == dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(z_sum)])
    assert EPSILON * 0.999 < epsilon(event, 1e-6, "pld") <= EPSILON
    assert "DP estimate over held-out patients" in text and "95% interval" in text
    assert "charged: ε = 0.7 at δ = 1e-06" in text and "divided by the declared count 6 (public)" in text
    assert f"its start {math.log(len(VOCAB)):.4f} nats" in text  # ε-free: the uniform guess, ln V


def test_over_the_budget_the_readout_is_refused_and_nothing_is_charged(run_folders, capsys):
    sets, args = _overrides(run_folders, "privacy.epsilon_budget=0.5")
    assert _readout(run_folders, *args, "--epsilon", EPSILON) == exit_codes.OVER_BUDGET
    assert "notes-readout" in capsys.readouterr().err and not (_ledger(sets) or {}).get("entries")


@pytest.mark.parametrize("extra, drop_tuples, message", [
    (["corpus.dataset_id=null"], False, "corpus.dataset_id is not set"),
    (["model.max_seq_length=32"], False, "model.max_seq_length = 32, the model's is 16"),
    (["model.init=minilm"], False, "model.init = minilm"),
    ([], True, "--tuples"),
])
def test_bad_inputs_are_exit_2_and_nothing_is_charged(run_folders, capsys, extra, drop_tuples, message):
    sets, args = _overrides(run_folders, *extra)
    command = ["readout", str(run_folders / "artifact"), *args]
    if not drop_tuples:
        command += ["--tuples", str(run_folders / "tuples")]
    assert main(command) == exit_codes.BAD_INPUT
    assert message in capsys.readouterr().err
    assert _ledger(_overrides(run_folders)[0]) is None


def test_public_only_reads_no_private_text_and_charges_nothing(run_folders, capsys):
    sets, args = _overrides(run_folders)
    assert main(["readout", str(run_folders / "artifact"), *args, "--public-only"]) == exit_codes.OK
    assert "nothing private read, nothing charged" in capsys.readouterr().out and _ledger(sets) is None


def test_the_run_form_finds_the_runs_dp_model_tuples_vocabulary_and_split(tmp_path):
    import argparse

    from dpbert import storage
    from dpbert_cli.readout import _run_parts
    from tests.dashboard import fakestore

    uris = fakestore.build_release_store(str(tmp_path / "metadata.sqlite"), str(tmp_path / "root"))
    args = argparse.Namespace(metadata=None, run=fakestore.RELEASE_RUN)
    parts = _run_parts(args, str(tmp_path))
    files = uris[fakestore.RELEASE_RUN]
    assert parts.model_dir == storage.join(files["model"], "model")  # the DP model, not the baseline
    assert parts.tokenizer_dir == storage.join(files["model"], "tokenizer")
    assert (parts.tuples_dir, parts.vocabulary_dir) == (files["tuples"], files["vocabulary"])
    assert (parts.fraction, parts.key_id, parts.dataset_id, parts.folder) == (0.0, None, None, str(tmp_path))


def test_after_a_public_start_the_start_is_rebuilt_from_the_configuration(run_folders, tmp_path_factory, capsys):
    from tests.cli.test_export import public_start as build_public_start

    artifact, models, checkpoint, _ = build_public_start.__wrapped__(tmp_path_factory)
    sets, args = _overrides(run_folders, "model.init=minilm", f"model.init_dir={checkpoint}", "model.public_layers=2",
                            "model.max_seq_length=32")
    assert main(["readout", str(artifact), "--tuples", str(run_folders / "tuples"), *args, "--json"]) == exit_codes.OK
    out = json.loads(capsys.readouterr().out)
    assert out["readout"]["start"] == "public start" and _ledger(sets)["entries"]
    # the start is the checkpoint's (with its random head), not the uniform guess, and not the trained model
    signal = out["public_signal"]
    assert signal["start"] != pytest.approx(math.log(len(VOCAB))) and signal["start"] != pytest.approx(signal["model"])
    # a configuration whose public start has another shape is refused before anything is charged
    sets, args = _overrides(run_folders, "model.init=minilm", f"model.init_dir={checkpoint}", "model.public_layers=3",
                            "model.max_seq_length=32")
    assert main(["readout", str(artifact), "--tuples", str(run_folders / "tuples"), *args]) == exit_codes.BAD_INPUT
    assert "its public start is" in capsys.readouterr().err
