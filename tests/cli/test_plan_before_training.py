"""Before anything trains: `dpbert budget` says the ε per part, the vocabulary threshold, the
declared size against the corpus and what the dataset's gate still admits; `--target-epsilon`
targets the whole run; `dpbert run` refuses a threshold no word can pass and canary groups beyond
the declared corpus, writing nothing; the model's resolved preset. In-process; nothing trains."""
import json
import re

import pytest

from dpbert import exit_codes
from tests.cli.test_user_errors import assert_user_error, in_process  # noqa: F401 (fixture)


def _json(result):
    return json.loads(result.stdout)


SMALL = ("--set", "training.dataset_patients=120", "--set", "training.batch_size=16")


def test_budget_says_everything_before_anything_trains(tmp_path, in_process):
    """The ε per patient by part, the vocabulary threshold, the declared size against --corpus
    (operator-only), a labelled training-time estimate and what the dataset's gate still admits."""
    from dpbert.config import load_config
    from pipeline import guard

    corpus = tmp_path / "notes.jsonl"
    corpus.write_text("".join(json.dumps({"patient_id": f"p{i}", "text": "fever and cough " * 20}) + "\n"
                              for i in range(30)), encoding="utf-8")
    result = in_process("budget", "--corpus", corpus)
    assert result.returncode == exit_codes.OK, result.stderr
    lines = result.stdout.splitlines()
    parts = next(x for x in lines if x.startswith("planned ε per patient:"))
    for word in ("vocabulary", "count 0", "training", "whole run"):
        assert word in parts
    size = next(x for x in lines if x.startswith("corpus:"))
    assert size.endswith("(operator-only: exact count)") and "30 patients" in size and "does NOT match" in size
    steps = load_config(preset="demo").training.steps
    estimate = next(x for x in lines if x.startswith("training time on this machine"))
    assert "ESTIMATE" in estimate and f"{steps} steps" in estimate
    # the demo's dataset has spent nothing in this test's ledger: the gate admits the whole plan and more
    admits = re.search(r"the dataset's budget gate still admits: at least (\d+) DP-SGD steps of this plan "
                       rf"\({steps} planned", result.stdout)
    assert admits and int(admits.group(1)) > steps and guard.remaining_budget(None) is None
    data = _json(in_process("budget", "--json"))
    assert data["epsilon_parts"]["whole"] == data["epsilon_total_pld"] and "corpus_sizes" not in data
    assert data["vocabulary_threshold"]["passable"] is True and data["training_time_estimate"]["seconds"] > 0


@pytest.mark.slow  # make test-all (≈ 30 s); docs/development.md
def test_target_epsilon_targets_the_whole_run_and_budget_exits_3_over_the_budget(in_process):
    """`budget --target-epsilon 0.5 --target training` over a budget of 3 exits 3; the default
    target is the whole run."""
    training = in_process("budget", "--target-epsilon", "0.5", "--target", "training",
                          "--set", "privacy.epsilon_budget=3", "--json")
    data = _json(training)
    assert training.returncode == exit_codes.OVER_BUDGET and data["target"] == "epsilon_train"
    assert data["epsilon_train"] <= 0.5 < 3 < data["epsilon_total_pld"] and data["within_budget"] is False
    # the default target is the whole run: the vocabulary alone spends more than 0.5 here
    assert_user_error(in_process("budget", "--target-epsilon", "0.5"), exit_codes.BAD_INPUT, "vocab.sigma",
                      "--target training")
    whole = in_process("budget", "--target-epsilon", "4", "--set", "training.steps=10", "--json")
    data = _json(whole)
    assert whole.returncode == exit_codes.OK and data["target"] == "epsilon_total_pld"
    assert 3.9 < data["epsilon_total_pld"] <= 4 and data["epsilon_pld"] == data["epsilon_total_pld"]


def test_run_refuses_a_vocabulary_threshold_no_word_can_pass_before_anything_is_written(tmp_path, in_process):
    """A vocabulary threshold no word can pass is refused before anything is written (exit 2)."""
    out = tmp_path / "out"
    args = ("--set", "vocab.sigma=200", *SMALL, "--output", out)
    line = assert_user_error(in_process("run", *args), exit_codes.BAD_INPUT, "vocab.sigma", "vocab.delta",
                             "training.dataset_patients = 120", "no word can pass")
    assert "at most 240 times" in line and not out.exists()
    # The vocabulary line reads no budget; without one, budget skips the gate's search (seconds of accounting).
    plan = (*SMALL, "--set", "privacy.epsilon_budget=null")
    budget = in_process("budget", "--set", "vocab.sigma=200", *plan)
    assert "no word can pass the vocabulary threshold C" in budget.stdout
    passable = in_process("budget", *plan)  # σ_V = 40: C = 237.5 ≤ 240
    assert "threshold C = 237.5 can be passed" in passable.stdout
    public = in_process("budget", "--set", "vocab.source=public", "--set", "vocab.sigma=200", *plan)
    assert "no DP vocabulary" in public.stdout


def test_canary_groups_scale_to_the_declared_corpus_or_the_run_is_refused(tmp_path, in_process):
    """Canary groups scale to the declared corpus: 1,000 occurrences on a 120-patient corpus are refused."""
    from dpbert.config import load_config
    from dpbert.stages.canary import canary_rows, planned_occurrences

    config = load_config(None, ["training.dataset_patients=120", "training.batch_size=16"], preset="demo")
    assert canary_rows(config) == 84 * 2  # 30 % held out, ≤ 2 tuples each
    assert planned_occurrences(config.canary, canary_rows(config)) == [1, 10, 16]
    demo = load_config(preset="demo")
    assert planned_occurrences(demo.canary, canary_rows(demo)) == [1, 10, 100, 420]  # 2,100 × 2 rows
    out = tmp_path / "out"
    result = in_process("run", *SMALL, "--set", "canary.occurrences=[1, 1000]", "--output", out)
    assert_user_error(result, exit_codes.BAD_INPUT, "canary.occurrences", "canary.max_occurrence_fraction",
                      "training.dataset_patients = 120")
    assert not out.exists()


def test_the_resolved_preset_is_the_one_model_config_json_records():
    """model.init = minilm takes the checkpoint's sizes: the resolved preset is minilm, as the
    model_config.json says, whatever the unused model.preset."""
    from dpbert.config import load_config
    from dpbert.network.init_public import spec_for_public

    demo = load_config(preset="demo").model
    assert demo.preset == "tiny" and demo.resolved_preset == "minilm"
    assert spec_for_public(demo, vocab_size=100).preset == demo.resolved_preset
    assert load_config(None, ["model.preset=small"]).model.resolved_preset == "small"
