"""The tiny end-to-end DAG run shared by tests/e2e/test_dag_tiny.py and the dashboard's browser test
(tests/dashboard/test_browser.py): the fixture ``tiny_dag_run`` (tests/conftest.py) runs it once."""
import os
import subprocess
import sys

from tests.tiny import CLASSIC

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY_DAG = CLASSIC + [
    "vocab.size=300",
    "training.steps=4",
    "training.batch_size=8",
    "training.checkpoint_every=2",
    "model.max_seq_length=64",
    "beam.direct_num_workers=2",
    "vocab.sigma=2",
    # Each patient is held out independently (keyed PRF): 24 patients make a split with both
    # sides all but certain (P[one side empty] ≈ 0.7²⁴ ≈ 2e-4).
    "corpus.synthetic.patients=24",
    "canary.enabled=true",
    "canary.audit_canaries=40",
    "ner.enabled=true",
    "ner.epochs=1",
    "ner.max_train_sentences=64",
    "ner.synthetic_column=false",
    "training.train_non_private_baseline=true",
    "privacy.epsilon_budget=null",
    "audit.enabled=true",
    "audit.canaries=200",
    # Both audit gates fail an honest run with probability <= beta (by design: a 0.146 lower bound
    # over the ledger's 0.104 once failed this run at 0.05); their catches are tested with controls.
    "canary.audit_beta=0.001",
    "audit.beta=0.001",
]


def run_cli(args, cwd=REPO, timeout=900):
    """``python -m dpbert_cli ARGS`` in a subprocess (the real entry point, its own TensorFlow)."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "dpbert_cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_tiny_dag(out):
    """``dpbert run --output OUT`` with ``TINY_DAG``: the CompletedProcess (not asserted)."""
    args = ["run", "--output", str(out)]
    for o in TINY_DAG:
        args += ["--set", o]
    return run_cli(args)
