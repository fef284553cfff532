"""dpbert.stages.audit and `dpbert audit`: the audits of a configuration, their release status,
and the CLI contract (the real entry point is `slow`)."""
import json
import os
import subprocess
import sys

import pytest

from dpbert import exit_codes
from dpbert.config import load_config
from dpbert.privacy.whitebox_audit import max_reachable_lower_bound, whitebox_k_grid
from dpbert.stages import audit
from tests.tiny import CLASSIC

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = CLASSIC + ["model.max_seq_length=32", "model.num_layers=1", "training.steps=8", "corpus.synthetic.patients=8",
        "vocab.size=300", "training.batch_size=8", "training.dataset_size=200", "training.warmup_steps=0"]
CLI_KEYS = {"epsilon_lower_bound", "epsilon_upper_bound", "max_reachable_lower_bound", "canaries", "confidence",
            "positive_control_lower_bound"}


def tiny_config(*extra):
    return load_config(None, TINY + list(extra), preset="demo")


def test_audit_of_the_configured_training_on_the_embedded_corpus_is_public():
    res = audit.audit_training(tiny_config(), canaries=256, seed=5)
    assert CLI_KEYS - {"positive_control_lower_bound"} <= set(res) and res["private"] == 0 and "embedded" in res["corpus"]
    # the plan of the configured run: q = B / (n·(1 − holdout)) with the public n = 200
    assert res["q"] == pytest.approx(8 / 140) and res["steps"] == 8 and res["canaries"] == 256
    assert res["consistent"] and 0 <= res["epsilon_lower_bound"] <= res["epsilon_upper_bound"]
    assert res["max_reachable_lower_bound"] == pytest.approx(max_reachable_lower_bound(256, 0.05, 1e-5,
                                                                                       whitebox_k_grid(256)))
    # no positive control unless asked; what is not the configured run is said
    assert "positive_control_lower_bound" not in res and any("vocabulary" in d for d in res["differs"])


def test_a_per_patient_claim_is_audited_on_the_patient_loop_with_its_trainable_set():
    res = audit.audit_training(tiny_config("privacy.unit=patient", "privacy.max_tuples_per_patient=4",
                                           "training.dataset_patients=100", "training.trainable=[bias,head]"),
                               canaries=64, seed=6, positive_control=True)
    assert res["unit"] == "patient" and res["q"] == pytest.approx(8 / 70) and res["dataset_size"] == 70
    assert res["audited_unit"] == "patient" and res["max_contributions"] == 4
    assert res["trainable"] == ["bias", "head"] and res["probe_variable"].startswith("mlm_")
    assert res["dp_event"]["sampling_unit"] == "patient" and res["dp_event"]["origin"] == "audit"
    assert "positive_control_lower_bound" in res


def test_audit_of_a_user_corpus_is_operator_only_and_refuses_the_positive_control(tmp_path):
    corpus = tmp_path / "notes.jsonl"
    corpus.write_text("".join(json.dumps({"patient_id": f"p{i}", "text": "fever cough rash " * 60}) + "\n"
                              for i in range(12)))
    user = (f"corpus.path={corpus}", "privacy.epsilon_budget=null")
    rows = audit.audit_rows(tiny_config(*user))
    assert rows.private and rows.token_ids.shape[1] == 32 and rows.specials.mask < rows.vocab_size
    assert len(rows.patient_keys) == rows.token_ids.shape[0] and set(rows.patient_keys) <= {f"p{i}" for i in range(12)}
    # the DAG component's rows ignore the configured path: the embedded public corpus
    assert not audit.audit_rows(tiny_config(*user), public_only=True).private
    # the noise-off control is not private: refused on a user's corpus, before any training
    with pytest.raises(ValueError, match="not private"):
        audit.audit_training(tiny_config(*user), canaries=16, positive_control=True)


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
