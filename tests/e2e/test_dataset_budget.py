"""One privacy budget per dataset (dpbert.ledger, pipeline.guard): every run that spent from the
dataset counts — a lowered budget after an interrupt, a second output folder, a new learning rate
are refused (exit 3, nothing written) when the composed ε exceeds the budget.

The trainer's entries are made here with ``dpbert.ledger.reserve_training`` as the trainer stage
will make them; the vocabulary stage's are made by a real ``dpbert run``."""
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from dpbert.config import load_config
from dpbert.ledger import composition, dataset, identity
from dpbert.accounting import compose as acompose, target
from dpbert_cli.main import main
from pipeline import guard
from tests.tiny import CLASSIC, set_args

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OVERRIDES = ["corpus.synthetic.patients=6", "vocab.sigma=2", "vocab.size=300", "training.steps=4",
             "training.batch_size=8", "training.checkpoint_every=100", "model.max_seq_length=64",
             "canary.enabled=false", "ner.enabled=false", "training.train_non_private_baseline=false",
             "membership.holdout_patient_fraction=0", "beam.direct_running_mode=in_memory", "audit.enabled=false"]


def config_of(out, *extra):
    return load_config(None, list(CLASSIC) + OVERRIDES + [f"pipeline.output_dir={out}", *extra], preset="demo")


def charge_like_a_run(config, finalize_training=True, chain="state-1"):
    """The entries a run of ``config`` leaves: the vocabulary stage's (reserve + finalize) and
    the trainer's (reserve; finalize unless interrupted)."""
    tgt = target.ledger_target(config)
    root = os.path.join(os.path.abspath(str(config.pipeline.output_dir)), "pipeline_root")
    plan = guard.planned(config)
    vocab = plan["vocab_event"]
    res = target.reserve_vocabulary(tgt, vocab, os.path.join(root, "DPVocabularyGen", "vocabulary", "2"))
    target.finalize_vocabulary(res, vocab)
    train = target.reserve_training(tgt, os.path.join(root, "Trainer", "model", "3"),
                                    os.path.join(root, "_trainer_state", chain), "key", plan["train_events"])
    if finalize_training:
        target.finalize_training(train, plan["steps"])
    return plan


def _pld_of_one_run(config):
    return guard.planned(dataclasses.replace(config, privacy=dataclasses.replace(config.privacy,
                                                                                   epsilon_budget=None)))


@pytest.mark.slow  # make test-all; the in-process tests cover the same code (docs/development.md)
def test_a_budget_lowered_after_an_interrupt_counts_the_reserved_run(tmp_path):
    first = config_of(tmp_path / "out", "privacy.epsilon_budget=1000")
    charge_like_a_run(first, finalize_training=False)  # interrupted: the trainer's entry stays reserved
    own = _pld_of_one_run(first)["epsilon_total_pld"]
    lowered = config_of(tmp_path / "out", f"privacy.epsilon_budget={own * 1.2}")
    ledger = guard.check_budget(lowered)
    assert ledger["epsilon_total_pld"] <= own * 1.2          # the run alone fits: the old guard ran it
    assert not ledger["within_budget"] and not ledger["dataset"]["within_budget"]
    message = guard.over_budget_message(ledger)
    # The dataset's budget is pinned at its first reservation: another budget is refused, not re-checked.
    assert "pinned" in message and "--raise-budget" in message and "nothing was run or written" in message
    assert main(["ledger", "--json", "--set", f"pipeline.output_dir={tmp_path / 'out'}", *set_args(OVERRIDES)]) == 0


@pytest.mark.slow  # make test-all; the in-process tests cover the same code (docs/development.md)
def test_a_new_learning_rate_is_a_second_charge_not_a_fresh_budget(tmp_path):
    plan = _pld_of_one_run(config_of(tmp_path / "out"))
    vocab = {"mechanism": "dp_histogram", "planned": [composition.ledger_record(plan["vocab_event"])]}
    train = {"mechanism": "dp_sgd", "planned": [composition.ledger_record(r) for r in plan["train_events"]]}
    one = acompose.compose([vocab, train], plan["delta"])["epsilon_rdp"]
    two = acompose.compose([vocab, train, train], plan["delta"])["epsilon_rdp"]
    budget = (one + two) / 2
    first = config_of(tmp_path / "out", f"privacy.epsilon_budget={budget}")
    charge_like_a_run(first)
    same = guard.check_budget(first)
    assert same["dataset"]["vocab_cached"]  # TFX answers the vocabulary from its cache: not charged again
    changed = guard.check_budget(config_of(tmp_path / "out", f"privacy.epsilon_budget={budget}",
                                           "training.learning_rate=0.01"))
    assert not changed["within_budget"] and changed["dataset"]["rule"] == "rdp_filter"
    assert changed["epsilon_total_pld"] < budget  # alone it fits: the old guard ran it on a fresh chain


def test_a_budget_on_a_user_corpus_without_a_dataset_id_is_exit_2(tmp_path, capsys):
    corpus = tmp_path / "notes.jsonl"
    corpus.write_text('{"text": "a note", "patient_id": "p1"}\n', encoding="utf-8")
    code = main(["run", "--corpus", str(corpus), "--output", str(tmp_path / "out"), "--set",
                 "privacy.epsilon_budget=5", "--set", "training.dataset_patients=100"])
    assert code == 2 and "corpus.dataset_id" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _run(out, budget):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "dpbert_cli", "run", "--output", str(out),
                           *set_args(OVERRIDES + [f"privacy.epsilon_budget={budget!r}"])],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow  # make test-all; the in-process tests cover the same code (docs/development.md)
@pytest.mark.e2e
def test_a_second_output_folder_is_refused_and_the_ledger_lists_the_first(tmp_path, capsys):
    config = config_of(tmp_path / "a")
    budget = _pld_of_one_run(config)["epsilon_total_pld"] * 1.1
    first = _run(tmp_path / "a", budget)
    assert first.returncode == 0, first.stderr[-3000:]
    uri = target.ledger_target(config).uri()
    entries = dataset.entries_of(dataset.read_ledger(uri))  # the vocabulary stage's and the trainer's
    assert sorted(e["mechanism"] for e in entries) == sorted(["dp_histogram", "dp_sgd"]), entries
    assert all(e["status"] == "finalized" and e["pipeline_root"] == str(tmp_path / "a" / "pipeline_root")
               for e in entries)
    second = _run(tmp_path / "b", budget)
    assert second.returncode == 3, second.stderr[-3000:]
    assert "every run that spent from it" in second.stderr and not (tmp_path / "b").exists()
    assert main(["ledger", "--json", *set_args(OVERRIDES)]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["dataset_id"] == identity.dataset_id_for(config.corpus) and len(view["entries"]) == 2
    assert sorted(e["run_id"].split("/")[0] for e in view["entries"]) == ["DPVocabularyGen", "MLMPretrainer"]
    assert view["totals"]["epsilon_rdp"] > 0 and view["budget"]["epsilon"] == pytest.approx(budget)  # pinned by the first
