"""``dpbert privacy noise-check`` run from the folder that holds the clone.

The child processes it starts (``--replicas 2``: one process with two logical CPUs;
``--workers 2``: two loopback worker processes) must import the ``dpbert`` package the command
itself imported — not ``./dpbert``, a folder with no ``__init__.py`` (the clone, seen from its
parent folder), which ``python -m`` imported as a namespace package because it puts the current
folder first on ``sys.path`` (the workers then failed at their first import).

These are the suite's one two-replica and one honest two-worker run of the noise check (its
broken placements: tests/model/test_multi_worker.py). In one process, a positive control: no
noise on ONE trained piece fails it (the check measures every coordinate of the shipped loop's
update)."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.xdist_group("multi_worker")

#: What the ``dpbert`` console script does: sys.path[0] is the script's folder, not the current one.
LAUNCHER = "import sys\nfrom dpbert_cli.main import main\nsys.exit(main())\n"


# Slow tier (CI): the child command's import path from such a folder is covered by
# tests/model/test_worker_supervisor.py, the command itself in process by tests/model/test_dpsgd.py.
@pytest.mark.slow
@pytest.mark.parametrize("layout", [["--replicas", "2", "--accumulation", "4"], ["--workers", "2"]],
                         ids=["two_replicas", "two_workers"])
def test_noise_check_cli_runs_from_a_folder_holding_a_dpbert_folder(tmp_path, layout):
    parent = tmp_path / "parent"
    (parent / "dpbert").mkdir(parents=True)  # like the clone's folder: no __init__.py
    (parent / "dpbert" / "README.md").write_text("not the package\n")
    launcher = tmp_path / "bin" / "dpbert_cli_launcher.py"
    launcher.parent.mkdir()
    launcher.write_text(LAUNCHER)
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, str(launcher), "privacy", "noise-check", *layout, "--noise-multiplier",
                           "1", "--clip", "0.01", "--batch-size", "8", "--steps", "30", "--json"],
                          cwd=str(parent), capture_output=True, text=True, env=env, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    results = results if isinstance(results, list) else [results]
    assert [r["accumulation"] for r in results] == ([4] if "--replicas" in layout else [1])
    for result in results:
        assert result["passed"] and result["replicas"] == 2, result
        assert abs(result["ratio"] - 1) <= result["tolerance"]
        if "--workers" in layout:
            assert result["strategy"] == "MultiWorkerMirroredStrategy" and result["workers_in_sync"]
        else:
            assert result["strategy"] == "MirroredStrategy"
            # One draw per logical batch: far from the √(P·T) per-shard noise.
            assert abs(result["measured_std"] / result["paper_std"] - 1) > 10 * result["tolerance"]


def test_no_noise_on_one_piece_fails_the_noise_check(eager_steps):
    """Test fixture, not a flag: the shipped step's draw zeroed on the word embeddings (640 of the
    4008 trained coordinates), so the pooled std is √(1 − 640/4008) ≈ 0.917 × σC/B; the run-time
    noise check names the piece, and the noise check still reports what it measured. Three eager
    steps: m = 12,024, tolerance 4/√(2m) ≈ 0.026, the break 0.083 off."""
    from dpbert.diagnostics.noise_check import noise_check
    from tests.model.broken_mechanisms import no_noise_on

    with no_noise_on(lambda name: name.startswith("word_embeddings")):
        result = noise_check(1, 2, noise_multiplier=1.0, clip=0.01, batch_size=8, steps=3, seed=3)
    assert not result["passed"] and not result["checks"]["std"], result
    assert abs(result["ratio"] - (1 - 640 / 4008) ** 0.5) < result["tolerance"], result
    assert result["integrity_checks"]["noise"] is False and "word_embeddings" in result["integrity_failure"]
    assert result["checks"]["every_step_measured"] and result["samples"] == 3 * 4008
