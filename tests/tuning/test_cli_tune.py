"""``dpbert tune`` writes a choice that ``dpbert run --tuned FILE`` applies; bad files are exit 2.

The make-test checks stub the grid search (``dpbert.tuning.tune.tune``; its real run is audited in
test_tune.py); the slow one runs the command end to end on the public proxy.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpbert.config import TrainingConfig, load_config
from dpbert.tuning import tune as tune_lib
from dpbert_cli.main import build_parser, main
from dpbert_cli.tune import apply_tuned

#: The built-in defaults (an empty configuration file).
DEFAULTS = str(Path(__file__).resolve().parents[1] / "cli" / "builtin_defaults.yaml")


def _result(lr=3e-3, clip=1.0) -> tune_lib.TuningResult:
    rows = [{"learning_rate": lr, "clip_norm": clip, "heldout_loss": 4.25, "heldout_losses": [4.25]},
            {"learning_rate": 1e-2, "clip_norm": 10.0, "heldout_loss": float("inf"), "heldout_losses": [float("inf")]}]
    provenance = {"plan": {"epsilon_train": 2.5, "delta": 1e-5, "batch_size": 64, "steps": 30, "noise_multiplier": 1.2,
                           "unit": "tuple", "max_contributions": 1, "sampling": "poisson"},
                  "proxy": {"source": "public"}, "proxy_batch": 8, "proxy_noise_multiplier": 0.15, "steps": 30,
                  "seed": 7, "grid": {"learning_rates": [lr, 1e-2], "clip_norms": [clip, 10.0]}}
    return tune_lib.TuningResult({"learning_rate": lr, "clip_norm": clip}, rows, provenance)


def test_run_tuned_applies_the_choice_where_it_stands_among_the_set_options(tmp_path):
    path = tune_lib.write_tuned(_result(), tmp_path / "tuned.json")
    args = build_parser().parse_args(["run", "--set", "training.learning_rate=1", "--tuned", path,
                                      "--set", "training.clip_norm=5"])
    assert args.overrides == ["training.learning_rate=1", "training.clip_norm=5"]  # nothing read while parsing
    apply_tuned(args)
    applied = [o for o in args.overrides if not o.startswith("training.tuned_from=")]
    assert applied == ["training.learning_rate=1", "training.learning_rate=0.003", "training.clip_norm=1.0",
                       "training.clip_norm=5"]
    tc = load_config(None, args.overrides).training
    assert (tc.learning_rate, tc.clip_norm) == (0.003, 5.0)
    if "tuned_from" in TrainingConfig.__dataclass_fields__:  # the run records where its values came from
        assert path in tc.tuned_from and "public proxy" in tc.tuned_from
    assert build_parser().parse_args(["run"]).overrides == []  # the parser's default list is untouched


def test_the_provenance_line_survives_the_override_parser(tmp_path):
    from dpbert.config import parse_override

    path = tune_lib.write_tuned(_result(), tmp_path / "tuned.json")
    key, line = parse_override(tune_lib.tuned_overrides(path, ["tuned_from"])[-1])
    assert key == "training.tuned_from" and line.startswith(f"{path} (sha256 ")
    assert "public proxy, seed 7, b=8, sigma_b=0.15, T=30, grid 2x2; for B=64, sigma=1.2, epsilon_T=2.5" in line
    assert len(tune_lib.tuned_overrides(path, [])) == 2  # a configuration without the field: the values only


@pytest.mark.parametrize("text, named", [
    (None, "--tuned"),
    ("not json", "not a tuning result"),
    (json.dumps({"schema": "other"}), "schema"),
    (json.dumps({**_result().to_dict(), "choice": {"learning_rate": 1e-3, "clip_norm": -1}}), "choice.clip_norm"),
])
def test_a_bad_tuned_file_is_exit_2_naming_the_file(tmp_path, capsys, text, named):
    bad = tmp_path / "bad.json"
    if text is not None:  # None: no such file
        bad.write_text(text)
    code = main(["run", "--output", str(tmp_path / "out"), "--tuned", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and str(bad) in err and named in err
    assert not (tmp_path / "out").exists()  # refused before the run started


def test_dpbert_tune_writes_the_choice_and_prints_the_rows(tmp_path, capsys, monkeypatch):
    seen = {}

    def fake_tune(config, source, **kwargs):
        seen.update(source=source, batch=config.training.batch_size, **kwargs)
        return _result()

    monkeypatch.setattr(tune_lib, "tune", fake_tune)
    out = tmp_path / "t.json"
    code = main(["tune", "--set", "training.batch_size=64", "--proxy", "public", "--out", str(out),
                 "--learning-rates", "3e-3,1e-2", "--clip-norms", "1,10", "--proxy-batch", "8"])
    printed = capsys.readouterr().out
    assert code == 0 and "← chosen" in printed and f"dpbert run --tuned {out}" in printed
    assert seen["source"] == "public" and seen["batch"] == 64 and seen["proxy_batch"] == 8
    assert seen["grid"] == tune_lib.Grid((3e-3, 1e-2), (1.0, 10.0))
    doc, _ = tune_lib.read_tuned(out)
    assert doc["choice"] == {"learning_rate": 3e-3, "clip_norm": 1.0} and doc["rows"][1]["heldout_loss"] == float("inf")


def test_dpbert_tune_without_a_public_n_is_exit_2_before_anything_trains(tmp_path, capsys):
    code = main(["tune", "--config", DEFAULTS, "--out", str(tmp_path / "t.json")])  # tuple unit, no dataset_size
    assert code == 2 and "training.dataset_size is not set" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


def test_a_bad_grid_is_exit_2(tmp_path, capsys):
    code = main(["tune", "--clip-norms", "0,1", "--out", str(tmp_path / "t.json")])
    assert code == 2 and "clip norms must be finite numbers > 0" in capsys.readouterr().err


@pytest.mark.slow
def test_dpbert_tune_end_to_end_on_the_public_proxy(tmp_path, capsys):
    out = tmp_path / "tuned.json"
    sets = ["model.preset=custom", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
            "model.intermediate_size=32", "model.max_seq_length=16", "model.init=random", "model.public_layers=null", "model.public_warmup_steps=0",
            "vocab.source=dp", "vocab.size=120", "training.trainable=[head]", "training.steps=3",
            "training.warmup_steps=1", "training.batch_size=16"]
    code = main(["tune", "--proxy", "public", "--out", str(out), "--learning-rates", "1e-3,1e-2",
                 "--clip-norms", "1", "--proxy-batch", "4", *[a for s in sets for a in ("--set", s)]])
    assert code == 0, capsys.readouterr()
    doc, _ = tune_lib.read_tuned(out)
    p = doc["provenance"]
    assert p["proxy"]["source"] == "public" and p["proxy_batch"] == 4 and len(doc["rows"]) == 2
    assert p["proxy_noise_multiplier"] == pytest.approx(p["plan"]["noise_multiplier"] * 4 / 16, rel=1e-12)
