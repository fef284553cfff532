"""`dpbert audit` on a user's corpus charges the dataset's ledger: the refusals come before any
training (in-process, fast); the whole command's charged run is in the slow tier."""
import json

import pytest

from dpbert import exit_codes
from dpbert.config import load_config
from dpbert_cli.main import main
from tests.stages.test_audit import TINY, dp_vocabulary_dir


def _user(tmp_path, *extra):
    corpus = tmp_path / "notes.jsonl"
    corpus.write_text("".join(json.dumps({"patient_id": f"p{i}", "text": "fever cough rash " * 60}) + "\n"
                              for i in range(12)))
    overrides = TINY + [f"corpus.path={corpus}", "corpus.dataset_id=notes-cli", "training.steps=2", *extra]
    return [a for o in overrides for a in ("--set", o)], overrides


def _ledger_uri(overrides):
    from dpbert.accounting.target import ledger_target

    return ledger_target(load_config(None, overrides, preset="demo")).uri()


def _read(uri):
    from dpbert import storage

    store = storage.storage_for(uri)
    return store.read_bytes(uri) if store.exists(uri) else b""


def test_no_charge_on_a_user_corpus_is_refused_naming_the_flag(tmp_path, capsys):
    args, overrides = _user(tmp_path)
    code = main(["audit", *args, "--no-charge", "--vocabulary-dir", dp_vocabulary_dir(tmp_path / "v")])
    assert code == exit_codes.BAD_INPUT and "--no-charge" in capsys.readouterr().err
    assert _read(_ledger_uri(overrides)) == b""


def test_a_user_corpus_without_a_dp_vocabulary_is_refused(tmp_path, capsys):
    args, _ = _user(tmp_path)
    assert main(["audit", *args]) == exit_codes.BAD_INPUT
    assert "--vocabulary-dir" in capsys.readouterr().err
    exact = dp_vocabulary_dir(tmp_path / "exact", "non_private")
    assert main(["audit", *args, "--vocabulary-dir", exact]) == exit_codes.BAD_INPUT
    assert "non_private" in capsys.readouterr().err


def test_over_the_budget_the_audit_is_refused_before_it_trains(tmp_path, capsys):
    args, overrides = _user(tmp_path, "privacy.epsilon_budget=0.5")
    code = main(["audit", *args, "--canaries", "16", "--vocabulary-dir", dp_vocabulary_dir(tmp_path / "v")])
    assert code == exit_codes.OVER_BUDGET and "notes-cli" in capsys.readouterr().err
    assert _read(_ledger_uri(overrides)) == b""


@pytest.mark.slow  # the whole command trains the tiny audited loop (≈ 30 s on 2 busy cores)
def test_the_whole_command_charges_the_dataset_ledger_and_says_the_report_is_operator_only(tmp_path, capsys):
    args, overrides = _user(tmp_path)
    uri = _ledger_uri(overrides)
    before = _read(uri)
    code = main(["audit", *args, "--canaries", "16", "--json", "--vocabulary-dir", dp_vocabulary_dir(tmp_path / "v")])
    report = json.loads(capsys.readouterr().out)
    assert code in (exit_codes.OK, exit_codes.AUDIT_FAILED) and _read(uri) != before
    [entry] = json.loads(_read(uri))["entries"].values()
    assert entry["mechanism"] == "dp_sgd" and entry["status"] == "finalized" and entry["id"] == report["ledger_entry"]
    assert entry["executed"][0]["steps"] == report["steps"] == 2
    assert report["private"] == 1 and report["charged"] and "operator-only" in report["release"]
    assert main(["audit", *args, "--canaries", "16", "--vocabulary-dir", dp_vocabulary_dir(tmp_path / "v2")]) in (
        exit_codes.OK, exit_codes.AUDIT_FAILED)
    text = capsys.readouterr().out
    assert "PRIVATE operator-only" in text and "ledger: charged" in text
    assert len(json.loads(_read(uri))["entries"]) == 2  # a second audit is a second charge
