"""Where the command line sits and what it shares: `dpbert_cli` above the layers, exit codes and
JSON output defined once, no reserved stubs, `dpbert budget` planning through the TrainingPlan."""
import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpbert import exit_codes
from dpbert_cli.main import build_parser, main

REPO = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("dpbert", "dpbert_cli", "pipeline", "kubeflow", "dashboard", "components", "beam_jobs")


def _sources(*packages):
    for package in packages:
        yield from sorted((REPO / package).rglob("*.py"))


@functools.lru_cache(maxsize=None)
def _nodes(path: Path) -> tuple:
    """Every node of ``path``'s syntax tree, parsed once for all the layout tests."""
    return tuple(ast.walk(ast.parse(path.read_text(encoding="utf-8"))))


def _imported_top_levels(path: Path):
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]


def test_nothing_below_imports_the_cli_and_the_core_imports_no_layer_above_it():
    for path in _sources("dpbert", "pipeline", "kubeflow", "dashboard", "components", "beam_jobs"):
        assert "dpbert_cli" not in set(_imported_top_levels(path)), path
    above_core = {"pipeline", "kubeflow", "dashboard", "components", "beam_jobs", "dpbert_cli"}
    for path in _sources("dpbert"):
        assert not above_core & set(_imported_top_levels(path)), path


def test_exit_codes_are_defined_once():
    assert (exit_codes.OK, exit_codes.BAD_INPUT, exit_codes.OVER_BUDGET) == (0, 2, 3)
    definitions = []
    for path in _sources(*FIRST_PARTY):
        for node in _nodes(path):
            if isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                definitions += [(path.relative_to(REPO), n) for n in names
                                if n.startswith("EXIT_") or n in ("BAD_INPUT", "OVER_BUDGET")]
    assert sorted(definitions) == [(Path("dpbert/exit_codes.py"), "BAD_INPUT"),
                                   (Path("dpbert/exit_codes.py"), "OVER_BUDGET")]


def test_the_cli_writes_json_only_through_the_schema_codec():
    for path in _sources("dpbert_cli"):
        text = path.read_text(encoding="utf-8")
        assert "json.dumps" not in text and "import json" not in text, path
    assert "schema.dumps" in (REPO / "dpbert_cli" / "output.py").read_text(encoding="utf-8")


def test_json_output_is_strict(capsys):
    from dpbert_cli.output import print_json
    import numpy as np

    print_json({"b": float("inf"), "a": np.float32(0.5), "c": (1, float("nan"))})
    assert json.loads(capsys.readouterr().out) == {"a": 0.5, "b": "inf", "c": [1, "nan"]}


def test_no_reserved_subcommands():
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")  # noqa: SLF001
    assert set(sub.choices) == {"run", "synth", "report", "release", "privacy", "budget", "compile", "privatize", "audit",
                                "dashboard", "export", "ledger", "predict", "readout", "tune"}
    assert not [c.help for c in sub._choices_actions if "reserved" in (c.help or "")]  # noqa: SLF001


def test_python_m_dpbert_cli():
    proc = subprocess.run([sys.executable, "-m", "dpbert_cli", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "usage: dpbert" in proc.stdout and "evaluate" not in proc.stdout


#: The built-in defaults (an empty configuration file): without --config a command uses the demo preset.
DEFAULTS = str(REPO / "tests" / "cli" / "builtin_defaults.yaml")
EPOCHS_1_1 = ["--config", DEFAULTS, "--examples", "50", "--set", "training.batch_size=5", "--set", "training.steps=null",
              "--set", "training.epochs=1.1", "--set", "training.replicas=1",
              "--set", "training.accumulation_steps=1", "--json"]


@pytest.mark.parametrize("extra", [[], pytest.param(["--target-epsilon", "8"], marks=pytest.mark.slow)])
def test_budget_plans_through_the_training_plan(capsys, extra):
    """epochs = 1.1, n = 50, B = 5: ceil(1.1·50/5) would be 12 (float rounding); the plan says 11,
    and so does `dpbert budget` in both modes."""
    from dpbert.config import load_config
    from dpbert.privacy.plan import plan_training

    code = main(["budget", *extra, *EPOCHS_1_1])
    data = json.loads(capsys.readouterr().out)
    assert code in (exit_codes.OK, exit_codes.OVER_BUDGET)
    config = load_config(None, ["training.batch_size=5", "training.steps=null", "training.epochs=1.1",
                                "training.replicas=1", "training.accumulation_steps=1"])
    plan = plan_training(config.training, 50)
    assert data["steps"] == plan.steps == 11
    assert data["sampling_probability"] == plan.sampling_probability == 0.1
    if not extra:
        assert data["plan"] == json.loads(json.dumps(plan.to_dict()))
