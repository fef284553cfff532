"""``python -m beam_jobs.dp_histogram``: the vocabulary stage on a Beam runner, from a configuration.

The stage itself (σ, threshold, ledger, the Beam job) is tested in tests/stages/ and
tests/beam/test_dp_histogram.py; here: what the entry hands it, and its exit codes.
"""
from pathlib import Path

import pytest

from beam_jobs import dp_histogram as entry
from dpbert import exit_codes
from dpbert.stages.result import StageResult

CONFIG = str(Path(__file__).resolve().parents[2] / "dpbert" / "configs" / "demo.yaml")


@pytest.fixture
def calls(monkeypatch):
    from dpbert.stages import vocabulary

    seen = []

    def fake_stage(pipeline, tuples, vocabulary_dir, vocab, privacy, checkpoint_dir=None, ledger_target=None):
        seen.append({"options": pipeline.options.get_all_options(), "tuples": tuples, "vocab": vocab,
                     "privacy": privacy, "ledger_target": ledger_target, "out": vocabulary_dir})
        return StageResult(properties={"vocab_size": 7, "words_kept": 3, "epsilon": 0.5, "delta": 1e-9})

    monkeypatch.setattr(vocabulary, "dp_vocabulary", fake_stage)
    return seen


def test_the_entry_runs_the_stage_with_the_configured_sections_ledger_and_beam_options(calls, capsys, tmp_path):
    from dpbert.accounting.target import ledger_target_json
    from dpbert.config import load_config

    code = entry.main(["--config", CONFIG, "--set", "vocab.sigma=7", "--tuples", "t", "--vocabulary",
                       str(tmp_path / "v"), "--", "--direct_num_workers=3"])
    config = load_config(CONFIG, ["vocab.sigma=7"])
    assert code == exit_codes.OK and len(calls) == 1
    call = calls[0]
    assert call["vocab"] == config.vocab and call["vocab"].sigma == 7 and call["privacy"] == config.privacy
    assert call["ledger_target"] == ledger_target_json(config, with_plan=False)
    assert call["options"]["runner"] == config.beam.runner and call["options"]["direct_num_workers"] == 3
    assert "7 tokens, 3 DP words" in capsys.readouterr().out


def test_bad_configuration_is_exit_2_before_the_stage_runs(calls, capsys, tmp_path):
    code = entry.main(["--config", CONFIG, "--set", "vocab.sigma=-1", "--tuples", "t", "--vocabulary",
                       str(tmp_path / "v")])
    assert code == exit_codes.BAD_INPUT and calls == [] and "vocab.sigma" in capsys.readouterr().err
    assert not (tmp_path / "v").exists()


def test_a_refused_histogram_is_exit_3(monkeypatch, capsys, tmp_path):
    from dpbert.accounting import gate
    from dpbert.stages import vocabulary

    class Refused(gate.BudgetRefused):
        def __init__(self):
            RuntimeError.__init__(self, "over the budget of dataset d")

    def refuse(*args, **kwargs):
        raise Refused()

    monkeypatch.setattr(vocabulary, "dp_vocabulary", refuse)
    code = entry.main(["--config", CONFIG, "--tuples", "t", "--vocabulary", str(tmp_path / "v")])
    assert code == exit_codes.OVER_BUDGET and "over the budget" in capsys.readouterr().err
