"""The CLI contracts of issues 3 and 4: `privacy histogram`, `privacy dpsgd`, `budget`, exit 3."""
import os
import json
import math

import pytest
from scipy.stats import norm

from dpbert_cli.main import main

#: The built-in defaults (an empty configuration file): without --config a command uses the demo preset.
DEFAULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "builtin_defaults.yaml")


def run_json(capsys, argv):
    code = main(argv)
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out.strip().startswith("{") else None), out.err


def test_privacy_histogram_contract(capsys):
    code, data, _ = run_json(capsys, ["privacy", "histogram", "--sigma", "200", "--delta", "1e-9",
                                      "--tuple-words", "256", "--json"])
    assert code == 0
    assert data["threshold"] == pytest.approx(1369.389, abs=1e-2)
    assert data["epsilon_classic"] == pytest.approx(0.5178, abs=1e-4)
    assert data["epsilon"] < data["epsilon_classic"]
    assert data["delta"] == 1e-9
    assert data["threshold_tail_per_word"] == pytest.approx(norm.sf((data["threshold"] - 1) / 200), rel=1e-9)
    assert data["threshold_tail_per_word"] * 256 <= 1e-9 * (1 + 1e-9)


def test_privacy_histogram_paper_mode_prints_its_real_delta(capsys):
    code, data, _ = run_json(capsys, ["privacy", "histogram", "--sigma", "200", "--delta", "1e-9",
                                      "--threshold-mode", "paper", "--json"])
    assert code == 0 and data["threshold"] == pytest.approx(982.5, abs=0.1)
    assert data["delta_actual"] == pytest.approx(1.2e-4, rel=0.05) and data["warning"]


def test_privacy_dpsgd_contract(capsys):
    code, data, _ = run_json(capsys, ["privacy", "dpsgd", "--examples", "60000", "--batch-size", "256",
                                      "--noise-multiplier", "1.1", "--epochs", "60", "--delta", "1e-5", "--json"])
    assert code == 0
    assert data["steps"] == math.ceil(60 * 60000 / 256) == 14063
    assert data["sampling_probability"] == pytest.approx(256 / 60000)
    assert data["epsilon_rdp"] == pytest.approx(2.597, abs=2e-3)
    assert data["epsilon_pld"] == pytest.approx(2.382, abs=2e-3)


@pytest.mark.parametrize("argv,name", [
    (["privacy", "histogram", "--sigma", "-1", "--delta", "1e-9"], "sigma"),
    (["privacy", "histogram", "--sigma", "200", "--delta", "1"], "delta"),
    (["privacy", "dpsgd", "--examples", "100", "--batch-size", "10", "--noise-multiplier", "1",
      "--steps", "0", "--delta", "1e-5"], "steps"),
])
def test_invalid_privacy_parameters_exit_2_naming_them(capsys, argv, name):
    code, _, err = run_json(capsys, argv)
    assert code == 2 and name in err


def _tiny(tmp_path, budget):
    """σ_V = 40: ε_V ≈ 1.8 (σ_V = 10: ≈ 8.4) keeps the PLD of the whole run small to build; every
    budget below stays on the same side of the planned ε."""
    from tests.tiny import set_args

    return set_args() + ["--set", "corpus.synthetic.patients=6", "--set", "training.batch_size=8",
            "--set", "training.steps=50", "--set", "vocab.sigma=40", "--set", f"privacy.epsilon_budget={budget}",
            "--set", f"pipeline.output_dir={tmp_path / 'out'}"]


def test_budget_json_and_exit_codes(tmp_path, capsys):
    code, data, _ = run_json(capsys, ["budget", "--config", "dpbert/configs/demo.yaml", "--json"] + _tiny(tmp_path, 1000))
    assert code == 0 and data["within_budget"] is True
    for key in ("epsilon_vocab", "epsilon_train", "epsilon_total_basic", "epsilon_total_pld", "delta"):
        assert key in data
    assert data["epsilon_total_pld"] <= data["epsilon_total_basic"]
    code, data, _ = run_json(capsys, ["budget", "--config", "dpbert/configs/demo.yaml", "--json"] + _tiny(tmp_path, 1))
    assert code == 3 and data["within_budget"] is False


def test_run_over_budget_exits_3_and_writes_nothing(tmp_path, capsys):
    code = main(["run", "--output", str(tmp_path / "out")] + _tiny(tmp_path, 0.5))
    err = capsys.readouterr().err
    assert code == 3 and "exceeds privacy.epsilon_budget" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # make test-all; the planner's search is in make test at a smaller plan (the next ε-target test)
def test_budget_planner_meets_the_target(capsys):
    code, data, _ = run_json(capsys, ["budget", "--config", DEFAULTS, "--target-epsilon", "3", "--target", "training",
                                      "--examples", "60000",
                                      "--set", "training.batch_size=256", "--set", "training.steps=2000",
                                      "--set", "training.delta=1e-5", "--json"])
    assert code == 0
    assert data["epsilon_pld"] <= 3.0 and data["epsilon_pld"] == pytest.approx(3.0, abs=0.05)


@pytest.mark.parametrize("field", ["training.noise_seed", "vocab.noise_seed"])
def test_run_with_a_noise_seed_and_a_budget_exits_2_naming_the_field_and_writes_nothing(tmp_path, capsys, field):
    """A fixed seed makes the noise predictable (ε = ∞): refused with a budget, before anything is
    written (in-process: an exception escaping ``main`` fails the test; the real entry point's
    `run` refusal is tests/cli/test_user_errors.py's subprocess test)."""
    code = main(["run", "--output", str(tmp_path / "out"), "--set", f"{field}=7"] + _tiny(tmp_path, 1000))
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert field in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_run_with_a_budget_needs_a_public_dataset_size(tmp_path, capsys):
    # (after _tiny: its CLASSIC overrides set training.dataset_size)
    code = main(["run", "--output", str(tmp_path / "out")] + _tiny(tmp_path, 1000) + ["--set", "training.dataset_size=null"])
    assert code == 2 and "training.dataset_size must be set" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_budget_target_epsilon_is_the_epsilon_the_planned_ledger_records(capsys):
    """Issue 22 item 5 (fails on the previous main: its σ met the bare DP-SGD event, and the ledger,
    which charges the DP diagnostics' σ_eff and the DP count, recorded more than the target).
    No public n configured (n from --examples): the run plans from a DP count, charged in ε_T."""
    import dataclasses

    from dpbert.config import load_config
    from dpbert.accounting.accountant import planned_ledger

    sets = ["training.batch_size=100", "training.steps=10", "training.delta=1e-5"]
    argv = ["budget", "--config", DEFAULTS, "--examples", "1000", *[a for s in sets for a in ("--set", s)], "--json"]
    code, data, _ = run_json(capsys, argv[:1] + ["--target-epsilon", "0.5", "--target", "training"] + argv[1:])
    assert code == 0 and data["target"] == "epsilon_train" and data["dataset_size_source"] == "dp_count"
    sigma = data["noise_multiplier"]
    assert data["epsilon_train"] <= 0.5 and data["epsilon_pld"] == data["epsilon_train"]
    # configure the returned σ: `dpbert budget` prints that ε_T, within the target
    code, planned, _ = run_json(capsys, argv + ["--set", f"training.noise_multiplier={sigma}"])
    assert code == 0 and planned["epsilon_train"] == pytest.approx(data["epsilon_train"], rel=1e-12)
    assert planned["epsilon_train"] <= 0.5 and planned["dataset_size_source"] == "dp_count"
    # and a slightly smaller σ would exceed it (the search is tight)
    config = load_config(None, sets)
    smaller = dataclasses.replace(config, training=dataclasses.replace(config.training, noise_multiplier=sigma - 1e-3))
    over = planned_ledger(smaller, 1000, dp_count=True)
    assert over["epsilon_train"] > 0.5
    assert [r["mechanism"] for r in over["train_events"]] == ["dp_count", "dp_sgd"]
    # a target the DP count alone exceeds: exit 2 naming the count's parameter
    code, _, err = run_json(capsys, argv[:1] + ["--target-epsilon", "0.5", "--target", "training"] + argv[1:]
                            + ["--set", "training.count_noise_multiplier=0.5"])
    assert code == 2 and "DP count alone" in err and "training.count_noise_multiplier" in err
