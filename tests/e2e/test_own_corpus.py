"""The README's "Your own corpus" steps, run as written on a generated corpus of 250 notes.

1. ``cp dpbert/configs/own-data.yaml my-data.yaml`` and write the dataset's name
   (``corpus.dataset_id``) and public size (``training.dataset_patients``) in the copy, then the σ
   that ``dpbert budget --target-epsilon 3`` prints (``training.noise_multiplier``) — the edits
   the README asks for;
2. ``dpbert budget --config my-data.yaml``: the ε per patient, printed before anything is trained;
3. ``dpbert run --config my-data.yaml --corpus notes.jsonl --output my_run``.

The corpus is the embedded synthetic generator's (``dpbert.data.synthetic``): 250 patients, one
note each, with patient ids, as JSONL. Steps 1-2 run in-process (``dpbert_cli.main.main``); the run
is one subprocess (its own TensorFlow and Beam workers). The dataset ledger goes to the test's
folder (``$DPBERT_LEDGER``). ≈ 2 min on 2 cores, hence ``slow``.
"""
import contextlib
import io
import json
import re
import time
from pathlib import Path

import pytest

from tests.e2e.tiny_dag import REPO, run_cli

PATIENTS = 250
TARGET_EPSILON = 3.0


def dpbert(*argv):
    """``dpbert ARGV`` in-process: (exit code, stdout)."""
    from dpbert_cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()


def write_field(config: Path, field: str, value) -> None:
    """Replace ``field: …`` (one line, uncommented) in the YAML file, as a user editing it would."""
    text = config.read_text(encoding="utf-8")
    new, count = re.subn(rf"(?m)^(\s+{field}:)\s*\S+", rf"\g<1> {value}", text)
    assert count == 1, f"{config.name}: expected one '{field}:' line, found {count}"
    config.write_text(new, encoding="utf-8")


@pytest.fixture
def notes(tmp_path):
    from dpbert.data.synthetic import generate_notes, write_jsonl

    path = tmp_path / "notes.jsonl"
    assert write_jsonl(generate_notes(PATIENTS, 1, 1, seed=7), str(path)) == PATIENTS
    first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert first["patient_id"] and first["text"]
    return path


@pytest.mark.slow
@pytest.mark.e2e
def test_own_corpus_in_three_commands(tmp_path, notes, monkeypatch):
    started = time.monotonic()
    # The dataset ledger (every run's ε on corpus.dataset_id) in this test's folder, not the user's.
    monkeypatch.setenv("DPBERT_LEDGER", str(tmp_path / "ledgers"))
    config = tmp_path / "my-data.yaml"
    # cp dpbert/configs/own-data.yaml my-data.yaml
    config.write_text((Path(REPO) / "dpbert" / "configs" / "own-data.yaml").read_text(encoding="utf-8"),
                      encoding="utf-8")
    write_field(config, "dataset_id", "own-corpus-e2e")
    write_field(config, "dataset_patients", PATIENTS)
    code, out = dpbert("budget", "--config", str(config), "--target-epsilon", str(TARGET_EPSILON), "--json")
    assert code == 0, out
    sigma = json.loads(out)["noise_multiplier"]
    write_field(config, "noise_multiplier", f"{sigma:.4f}")

    # ε per patient before training: from the public sizes alone, nothing written yet.
    output = tmp_path / "my_run"
    code, out = dpbert("budget", "--config", str(config))
    assert code == 0, out
    assert f"n = {PATIENTS} patients" in out, out
    epsilon = float(re.search(r"ε_total \(PLD\)\s*=\s*([0-9.]+)", out).group(1))
    assert 0 < epsilon <= TARGET_EPSILON + 1e-3, out  # ε_V = 0: the public vocabulary
    assert re.search(r"ε_vocab\s*=\s*0\b", out), out
    assert "within budget" in out and not output.exists(), out

    run = run_cli(["run", "--config", str(config), "--corpus", str(notes), "--output", str(output)])
    assert run.returncode == 0, run.stderr[-4000:]
    assert re.search(r"ε = [0-9.]+ \(PLD\) per patient", run.stdout), run.stdout
    assert "within" in run.stdout, run.stdout

    code, out = dpbert("report", "--output", str(output), "--json")
    assert code == 0, out
    report = json.loads(out)
    vocab = report["vocab"]
    # The public MiniLM vocabulary (30,522 WordPiece tokens), no ε spent on it.
    assert vocab["size"] >= 30000 and float(vocab["epsilon"] or 0) == 0, vocab
    assert report["status"] == "COMPLETE", report.get("status")
    print(f"own corpus, {PATIENTS} notes: budget + run + report in {time.monotonic() - started:.0f} s")
