"""One default for every command (the demo preset, said in each command's help; `dpbert budget`
plans it without reading a corpus) and `-v` in any position (no TFX component sees the command
line's arguments). In-process (``dpbert_cli.main.main``); no DAG runs."""
import contextlib
import json
import sys
from pathlib import Path

import pytest
from tfx.dsl.components.base.base_beam_executor import BaseBeamExecutor

from dpbert import exit_codes
from dpbert.config import load_config
from dpbert_cli.main import main
from tests.dashboard import fakestore


def _help(capsys, *argv):
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


# ------------------------------------------------------------------ one default for every command

def test_every_command_without_config_uses_the_demo_preset_and_says_so(capsys):
    for command in ("run", "budget", "audit", "compile"):
        assert "demo preset" in _help(capsys, command), command
    budget = _help(capsys, "budget")
    assert "reads no corpus" in budget and "counted from the corpus" not in budget
    assert "training.dataset_size" in budget


def test_budget_without_config_plans_the_demo_and_reads_no_corpus(capsys, tmp_path):
    """Budget plans from the public sizes alone: a corpus that does not exist changes nothing."""
    code = main(["budget", "--json", "--set", f"corpus.path={tmp_path / 'no-such-corpus'}",
                 "--set", "corpus.dataset_id=notes"])
    data = json.loads(capsys.readouterr().out)
    assert code == exit_codes.OK and data["dataset_size_source"] == "public"
    # the demo's public patient count, 30 % held out for the membership attacks
    demo = load_config(preset="demo")
    expected = round(demo.training.dataset_patients * (1 - demo.membership.holdout_patient_fraction))
    assert data["unit"] == "patient" and data["dataset_size"] == expected


# ------------------------------------------------------------------ -v in every position

#: A small synthetic corpus: the run validates every record of it before the (fake) DAG starts.
SMALL_CORPUS = ["--set", "corpus.synthetic.patients=40"]


class BeamExecutor(BaseBeamExecutor):
    def Do(self, *args):  # noqa: N802
        pass


class _BeamComponent:
    """What TFX's Beam executor does in the vocabulary component: absl parses sys.argv + Beam args."""

    def run(self, metadata_path):
        BeamExecutor(BaseBeamExecutor.Context(beam_pipeline_args=["--runner=DirectRunner"]))
        b = fakestore._Builder(metadata_path, str(Path(metadata_path).parent / "root"))  # the run's store
        b.execute(b.run("r"), "CorpusIngest", "COMPLETE")


@pytest.fixture()
def fake_dag(monkeypatch):
    from types import SimpleNamespace

    from tfx.utils import dependency_utils

    from pipeline import local_runner

    # TFX's sdist of itself for remote Beam workers (a setup.py subprocess) is not what absl parses
    monkeypatch.setattr(dependency_utils, "build_ephemeral_package", lambda: "tfx_ephemeral.tar.gz")
    monkeypatch.setattr(local_runner, "create_pipeline", lambda config, root, metadata_path: metadata_path)
    monkeypatch.setattr(local_runner, "tfx", SimpleNamespace(orchestration=SimpleNamespace(LocalDagRunner=_BeamComponent)))
    return local_runner


def test_verbose_before_the_command_reaches_no_component(fake_dag, monkeypatch, tmp_path, capsys):
    """`dpbert -v run`: no component's absl reads `-v run` as --verbosity=run. The output directory
    has a space: the "inspect with:" hint is shell-quoted."""
    out = tmp_path / "my run"
    argv = ["-v", "run", "--output", str(out), *SMALL_CORPUS]
    monkeypatch.setattr(sys, "argv", ["dpbert", *argv])
    assert main(argv) == exit_codes.OK
    printed = capsys.readouterr().out
    assert f"inspect with:      dpbert report --output '{out}'" in printed
    assert sys.argv == ["dpbert", *argv]  # restored after the DAG


def test_positive_control_a_component_that_sees_the_cli_argv_fails(fake_dag, monkeypatch, tmp_path):
    from absl.flags import IllegalFlagValueError

    monkeypatch.setattr(fake_dag, "components_argv", contextlib.nullcontext)
    argv = ["-v", "run", "--output", str(tmp_path / "out"), *SMALL_CORPUS]
    monkeypatch.setattr(sys, "argv", ["dpbert", *argv])
    with pytest.raises(IllegalFlagValueError, match="verbosity"):
        main(argv)
