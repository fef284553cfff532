"""``dpbert privacy noise-check`` run from the folder that holds the clone.

The child processes it starts (``--replicas 2``: one process with two logical CPUs;
``--workers 2``: two loopback worker processes) must import the ``dpbert`` package the command
itself imported — not ``./dpbert``, a folder with no ``__init__.py`` (the clone, seen from its
parent folder), which ``python -m`` imported as a namespace package because it puts the current
folder first on ``sys.path`` (the workers then failed at their first import).

These are the suite's one two-replica and one honest two-worker run of the noise check (its
broken placements: tests/model/test_multi_worker.py)."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.xdist_group("multi_worker")

#: What the ``dpbert`` console script does: sys.path[0] is the script's folder, not the current one.
LAUNCHER = "import sys\nfrom dpbert_cli.main import main\nsys.exit(main())\n"


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
