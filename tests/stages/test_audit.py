"""dpbert.stages.audit and `dpbert audit`: the audits of a configuration, their release status,
and the CLI contract (the real entry point is `slow`)."""
import json
import os
import subprocess
import sys

import pytest

from dpbert import exit_codes
from dpbert.config import ConfigError, load_config
from dpbert.ledger.dataset import read_ledger
from dpbert.engine.hooks import Hook
from dpbert.privacy.whitebox_audit import max_reachable_lower_bound, whitebox_k_grid
from dpbert.stages import audit
from tests.tiny import CLASSIC

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The smallest model a training run takes (tests/model/conftest.py tiny_model) and 3 steps: the audits
# below are about the report and the plan, not the model (in process, their steps run eagerly).
TINY = CLASSIC + ["model.preset=custom", "model.hidden_size=16", "model.num_heads=2", "model.intermediate_size=32",
                  "model.max_seq_length=32", "model.num_layers=1", "training.steps=3", "corpus.synthetic.patients=8",
                  "vocab.size=300", "training.batch_size=8", "training.dataset_size=200", "training.warmup_steps=0"]
CLI_KEYS = {"epsilon_lower_bound", "epsilon_upper_bound", "max_reachable_lower_bound", "canaries", "confidence",
            "positive_control_lower_bound"}


def tiny_config(*extra):
    return load_config(None, TINY + list(extra), preset="demo")


def test_audit_of_the_configured_training_on_the_embedded_corpus_is_public(eager_steps):
    res = audit.audit_training(tiny_config(), canaries=256, seed=5)
    assert CLI_KEYS - {"positive_control_lower_bound"} <= set(res) and res["private"] == 0 and "embedded" in res["corpus"]
    # the plan of the configured run: q = B / (n·(1 − holdout)) with the public n = 200
    assert res["q"] == pytest.approx(8 / 140) and res["steps"] == 3 and res["canaries"] == 256
    assert res["consistent"] and 0 <= res["epsilon_lower_bound"] <= res["epsilon_upper_bound"]
    # Steinke–Nasr–Jagielski's power (the report's own key when an f-DP bound is reported beside it)
    power = res.get("max_reachable_lower_bound_snj", res["max_reachable_lower_bound"])
    assert power == pytest.approx(max_reachable_lower_bound(256, 0.05, 1e-5, whitebox_k_grid(256)))
    # no positive control unless asked; what is not the configured run is said
    assert "positive_control_lower_bound" not in res and any("vocabulary" in d for d in res["differs"])


def test_a_per_patient_claim_is_audited_on_the_patient_loop_with_its_trainable_set(eager_steps):
    res = audit.audit_training(tiny_config("privacy.unit=patient", "privacy.max_tuples_per_patient=4",
                                           "training.dataset_patients=100", "training.trainable=[bias,head]"),
                               canaries=64, seed=6, positive_control=True)
    assert res["unit"] == "patient" and res["q"] == pytest.approx(8 / 70) and res["dataset_size"] == 70
    assert res["audited_unit"] == "patient" and res["max_contributions"] == 4
    assert res["trainable"] == ["bias", "head"] and res["probe_variable"].startswith("mlm_")
    assert res["dp_event"]["sampling_unit"] == "patient" and res["dp_event"]["origin"] == "audit"
    assert "positive_control_lower_bound" in res


def _user_corpus(tmp_path):
    corpus = tmp_path / "notes.jsonl"
    corpus.write_text("".join(json.dumps({"patient_id": f"p{i}", "text": "fever cough rash " * 60}) + "\n"
                              for i in range(12)))
    return (f"corpus.path={corpus}", "corpus.dataset_id=notes-test")


def dp_vocabulary_dir(directory, mechanism="dp_histogram"):
    """A DPVocabulary folder: a WordPiece of PUBLIC words and its record (a DP histogram's, or a
    ``non_private`` one: exact counts)."""
    from dpbert.privacy import events, histogram
    from dpbert.vocab import wordpiece

    tokenizer = wordpiece.train_wordpiece([("fever", 40.0), ("cough", 30.0), ("rash", 20.0), ("heart", 10.0)],
                                          vocab_size=60)
    wordpiece.save_vocabulary(tokenizer, directory)
    record = events.histogram_event(histogram.histogram_report(10.0, 1e-9, 32)) if mechanism == "dp_histogram" \
        else events.non_private_event("vocab")
    (directory / "dp_event.json").write_text(events.to_json(record))
    return str(directory)


def test_audit_of_a_user_corpus_never_learns_its_exact_vocabulary(tmp_path):
    user = _user_corpus(tmp_path)
    with pytest.raises(ConfigError, match="exact counts"):
        audit.audit_rows(tiny_config(*user))
    with pytest.raises(ConfigError, match="--vocabulary-dir"):
        audit.audit_vocabulary_source(tiny_config(*user))
    tokenizer, what = audit.audit_vocabulary_source(tiny_config(*user), dp_vocabulary_dir(tmp_path / "v"))
    rows = audit.audit_rows(tiny_config(*user), tokenizer)
    assert rows.private and rows.token_ids.shape[1] == 32 and rows.vocab_size == tokenizer.get_vocab_size()
    assert len(rows.patient_keys) == rows.token_ids.shape[0] and set(rows.patient_keys) <= {f"p{i}" for i in range(12)}
    assert "--vocabulary-dir" in what
    # the DAG component's rows ignore the configured path: the embedded public corpus
    assert not audit.audit_rows(tiny_config(*user), public_only=True).private
    # positive control: a vocabulary of exact counts, or one without a record, is refused
    with pytest.raises(ConfigError, match="non_private"):
        audit.audit_vocabulary_source(tiny_config(*user), dp_vocabulary_dir(tmp_path / "exact", "non_private"))
    os.remove(tmp_path / "v" / "dp_event.json")
    with pytest.raises(ConfigError, match="nothing shows"):
        audit.audit_vocabulary_source(tiny_config(*user), str(tmp_path / "v"))


def test_audit_of_a_user_corpus_is_refused_before_training_without_what_its_charge_needs(tmp_path):
    user = _user_corpus(tmp_path)
    tokenizer = audit.audit_vocabulary_source(tiny_config(*user), dp_vocabulary_dir(tmp_path / "v"))[0]
    # the noise-off control is not private
    with pytest.raises(ValueError, match="not private"):
        audit.audit_training(tiny_config(*user), tokenizer=tokenizer, canaries=16, positive_control=True)
    with pytest.raises(ConfigError, match="no --no-charge"):
        audit.audit_training(tiny_config(*user), tokenizer=tokenizer, canaries=16, charge=False)
    with pytest.raises(ConfigError, match="corpus.dataset_id"):
        audit.audit_training(tiny_config(user[0], "privacy.epsilon_budget=null"), tokenizer=tokenizer, canaries=16)
    with pytest.raises(ConfigError, match="training.dataset_size is not set"):
        audit.audit_training(tiny_config(*user, "training.dataset_size=null", "privacy.epsilon_budget=null"),
                             tokenizer=tokenizer, canaries=16)


class LedgerAtStart(Hook):
    """Reads the dataset ledger when the audited loop starts (before its first step)."""

    def __init__(self, uri):
        self.uri, self.seen = uri, None

    def on_start(self, loop):
        self.seen = read_ledger(self.uri)


def new_entries(before: dict, after: dict) -> list:
    return [e for k, e in after.get("entries", {}).items() if k not in before.get("entries", {})]


def _charged_audit(tmp_path, user, **kwargs):
    """(ledger before, at the first step, after, report) of an audit on the user corpus (2 steps)."""
    from dpbert.accounting.target import ledger_target

    config = tiny_config(*user, "training.steps=2")
    uri = ledger_target(config).uri()
    tokenizer = audit.audit_vocabulary_source(config, dp_vocabulary_dir(tmp_path / "v"))[0]
    before = read_ledger(uri)
    hook = LedgerAtStart(uri)
    report = audit.audit_training(config, tokenizer=tokenizer, canaries=16, seed=4, watch=audit.Watch((hook,)), **kwargs)
    return before, hook.seen, read_ledger(uri), report


def stub_loop(token_ids, specials, vocab_size, model_config, training_config, *, plan, hooks=(), **kwargs):
    """The audited loop without training (cheap): it starts its hooks, as the trainer's loop does,
    and reports the record of the plan's steps. The real loop: tests/cli/test_audit_charge.py (slow)."""
    from dpbert.accounting.sigma import configured_sigma
    from dpbert.engine.charges import training_record

    for hook in hooks:
        hook.on_start(None)
    record = training_record(configured_sigma(training_config), plan, int(token_ids.shape[0]), plan.steps)
    return {"dp_event": dict(record, origin="audit"), "steps": plan.steps}


@pytest.fixture
def no_training(monkeypatch):
    from dpbert.evaluate import whitebox

    monkeypatch.setattr(whitebox, "whitebox_audit", stub_loop)


def test_audit_of_a_user_corpus_is_reserved_before_it_trains_and_finalized_after(tmp_path, no_training):
    before, at_start, after, report = _charged_audit(tmp_path, _user_corpus(tmp_path))
    [reserved] = new_entries(before, at_start)
    assert reserved["status"] == "reserved" and reserved["mechanism"] == "dp_sgd"
    [entry] = new_entries(before, after)
    assert entry["id"] == reserved["id"] == report["ledger_entry"] and entry["status"] == "finalized"
    assert entry["executed"] == entry["planned"] and entry["executed"][0]["steps"] == report["steps"] == 2
    assert report["charged"] and report["private"] == 1 and report["release"] == audit.OPERATOR_ONLY
    assert "operator-only" in report["release"]


def test_the_charge_check_catches_an_audit_that_does_not_charge(tmp_path, monkeypatch, no_training):
    # positive control: a broken audit that trains without reserving leaves the ledger as it was
    monkeypatch.setattr(audit, "_reserve", lambda *a, **k: None)
    before, at_start, after, report = _charged_audit(tmp_path, _user_corpus(tmp_path))
    assert new_entries(before, at_start) == [] and new_entries(before, after) == [] and not report["charged"]


def test_audit_over_the_dataset_budget_is_refused_before_it_trains(tmp_path, monkeypatch, no_training):
    from dpbert.accounting.gate import BudgetRefused

    started = []
    monkeypatch.setattr(LedgerAtStart, "on_start", lambda self, loop: started.append(loop))
    user = _user_corpus(tmp_path) + ("privacy.epsilon_budget=0.5",)
    with pytest.raises(BudgetRefused):
        _charged_audit(tmp_path, user)
    assert started == []  # the loop never started


def test_no_claim_to_audit_is_refused():
    with pytest.raises(ValueError, match="non_private"):
        audit.audit_training(tiny_config("training.non_private=true", "privacy.epsilon_budget=null"))
    with pytest.raises(ValueError, match="poisson"):
        audit.audit_training(tiny_config("training.sampling=shuffle"))


def test_vocabulary_audit_flags_the_paper_threshold_and_not_the_correct_one():
    # σ = 4, δ = 1e-3, N = 16: the paper threshold releases a fresh word far more often than δ.
    config = load_config(None, ["vocab.sigma=4", "vocab.delta=0.001", "privacy.tuple_words=16"], preset="demo")
    res = audit.audit_vocabulary(config, trials=20_000, seed=3)
    assert not res["flagged"] and res["epsilon_upper_bound"] == res["claimed_epsilon"]
    assert res["positive_control_flagged"] and res["positive_control_delta_lower_bound"] > 1e-3


def test_cli_refuses_too_few_canaries_before_auditing(capsys):
    from dpbert_cli.main import main

    assert main(["audit", "--canaries", "1"]) == exit_codes.BAD_INPUT
    assert "--canaries must be >= 2" in capsys.readouterr().err


@pytest.mark.slow  # a real audit in a subprocess (31 s on 2 busy cores) for little more than the in-process ones
def test_cli_contract_real_entry_point():
    args = [sys.executable, "-m", "dpbert_cli", "audit", "--json", "--canaries", "300", "--positive-control"]
    for o in TINY:
        args += ["--set", o]
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    res = json.loads(result.stdout)
    assert CLI_KEYS <= set(res) and res["canaries"] == 300 and res["confidence"] == pytest.approx(0.95)
    assert res["epsilon_lower_bound"] <= res["epsilon_upper_bound"]
    assert res["consistent"] is True and res["private"] == 0  # exit 0 means consistent; the embedded corpus
    assert res["audited_unit"] == "tuple" and res["trainable"] == ["all"] and "dp_event" in res
