"""``dpbert budget --target-epsilon E --compute N [--min-steps T]``: the shape table and the chosen
plan (``dpbert.accounting.shape``), its bad inputs (exit 2), and ``dpbert run``'s refusal of a
corpus whose patients are far from ``training.dataset_patients`` (``pipeline.guard``).

Cost: the demo preset's n = 7,000 patients, two candidates in the σ ≳ 2 regime (the grid is
limited here), then the chosen shape's planned ledger: a few seconds once, memoised after.
"""
import json

import pytest

from dpbert import exit_codes
from dpbert.accounting import shape
from dpbert_cli.main import main

#: Two candidates (T = 50, 71) at 1,400 and 985 patients of 7,000, k = 2.
SHAPE = ["budget", "--target-epsilon", "1", "--compute", "140000", "--min-steps", "50", "--tuples-per-second", "40"]


@pytest.fixture
def two_candidates(monkeypatch):
    monkeypatch.setattr(shape, "MAX_CANDIDATES", 2)


def test_budget_compute_chooses_the_smallest_noise_batch_ratio_and_its_ledger_meets_the_target(two_candidates, capsys):
    assert main(SHAPE + ["--json"]) == exit_codes.OK
    out = json.loads(capsys.readouterr().out)
    chosen, rows = out["chosen"], out["alternatives"]
    assert [(r["batch_size"], r["steps"]) for r in rows] == [(1400, 50), (985, 71)]
    assert (chosen["batch_size"], chosen["steps"], chosen["k"]) == (1400, 50, 2)
    assert chosen["noise_batch_ratio"] == min(r["noise_batch_ratio"] for r in rows)
    assert all(r["tuple_steps"] <= 140_000 and r["epsilon"] <= 1.0 for r in rows)
    assert chosen["seconds"] == pytest.approx(140_000 / 40)
    # The configured σ (gradient; the diagnostics make σ_eff smaller) planned as a run: ε_T meets 1.
    assert chosen["noise_multiplier"] > chosen["sigma_accounted"]
    assert 1.0 - 2e-3 <= out["epsilon_train"] <= 1.0 and out["epsilon_total_pld"] > out["epsilon_train"]
    assert main(SHAPE) == exit_codes.OK  # the table (ε memoised: cheap now)
    text = capsys.readouterr().out
    assert "→    1400     50   2" in text
    assert f"chosen: --set training.batch_size=1400 --set training.steps=50 --set training.noise_multiplier=" \
           f"{chosen['noise_multiplier']:.4f}" in text
    assert "at 40 tuples/s (--tuples-per-second)" in text and "budget 10: within" in text


@pytest.mark.parametrize("argv, message", [
    (["budget", "--compute", "1000"], "--target-epsilon"),
    (["budget", "--target-epsilon", "1", "--min-steps", "10"], "--compute"),
    (["budget", "--target-epsilon", "1", "--compute", "lots"], "--compute lots"),
    (["budget", "--target-epsilon", "1", "--compute", "2.5"], "--compute 2.5"),
    (["budget", "--target-epsilon", "1", "--compute", "99", "--min-steps", "50"], "no shape fits"),
    (["budget", "--target-epsilon", "1", "--compute", "1h", "--tuples-per-second", "0"], "--tuples-per-second"),
    (["budget", "--target-epsilon", "1", "--compute", "1000", "--set", "training.dataset_patients=null",
      "--set", "privacy.epsilon_budget=null", "--examples", "7000"], "PUBLIC n"),
])
def test_budget_compute_bad_input_exits_2_before_any_search(argv, message, capsys):
    assert main(argv) == exit_codes.BAD_INPUT
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_compute_as_a_time_is_tuple_steps_at_the_rate():
    from dpbert_cli.commands import UserError, _compute_budget

    assert _compute_budget("2h", 10.0) == 72_000
    assert _compute_budget("90min", 2.0) == 10_800
    assert _compute_budget("600s", 2.5) == 1_500
    assert _compute_budget("250000", None) == 250_000
    with pytest.raises(UserError):
        _compute_budget("-5", None)


def _corpus(tmp_path, patients):
    path = tmp_path / "notes.jsonl"
    path.write_text("".join(json.dumps({"text": f"fever and cough day {i}", "patient_id": f"p{i % patients}",
                                        "note_id": str(i)}) + "\n" for i in range(2 * patients)), encoding="utf-8")
    return str(path)


def test_run_warns_before_anything_trains_about_a_corpus_far_from_the_declared_patients(tmp_path, capsys):
    # A budget the plan cannot meet stops the run (exit 3) right after the pre-pass: the warning
    # must already be on stderr, nothing written.
    code = main(["run", "--corpus", _corpus(tmp_path, 3), "--output", str(tmp_path / "out"),
                 "--set", "corpus.dataset_id=ward3", "--set", "training.dataset_patients=100",
                 "--set", "vocab.source=public", "--set", "training.batch_size=8",
                 "--set", "privacy.epsilon_budget=0.01"])
    err = capsys.readouterr().err
    assert code == exit_codes.OVER_BUDGET, err
    assert "warning (operator-only, not released): the corpus holds about 0.03× the patients declared" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_the_patients_check_is_the_reports_factor_two_and_patient_unit_only(tmp_path, capsys):
    from dpbert.config import ConfigError, load_config
    from pipeline import guard

    config = load_config(None, ["training.dataset_patients=100"], preset="demo")
    assert guard.patients_mismatch(config, 50) is None and guard.patients_mismatch(config, 200) is None
    assert "about 0.49×" in guard.patients_mismatch(config, 49)
    assert "about 2×" in guard.patients_mismatch(config, 201)
    tuples = load_config(None, ["privacy.unit=tuple", "training.dataset_patients=100"], preset="demo")
    assert guard.patients_mismatch(tuples, 3) is None  # the tuple unit plans on dataset_size
    # The pre-pass counts the corpus's patients (positive control: a matching corpus passes).
    matching = load_config(None, [f"corpus.path={_corpus(tmp_path, 100)}", "training.dataset_patients=100",
                                  "corpus.dataset_id=ward100"], preset="demo")
    guard.preflight_corpus(matching)
    far = load_config(None, [f"corpus.path={_corpus(tmp_path, 30)}", "training.dataset_patients=100",
                             "corpus.dataset_id=ward30"], preset="demo")
    guard.preflight_corpus(far)  # a warning, never a refusal (the run's existence must not depend on the count)
    assert "about 0.3×" in capsys.readouterr().err
