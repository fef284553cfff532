"""The exit codes of every dpbert command line (``dpbert ...`` and ``python -m kubeflow.runner``).

Defined once, here, with no imports: the ``dpbert`` command (``dpbert_cli/``) sits above
``pipeline/``, ``kubeflow/`` and ``dashboard/``, but ``kubeflow/runner.py`` (below it) has its
own ``python -m kubeflow.runner compile`` entry point that returns the same codes, so the
constants live at the bottom of the import graph where both can read them.
"""

OK = 0
#: Bad input: configuration, corpus, parameters or files; the message names the field or file.
BAD_INPUT = 2
#: The planned ε exceeds ``privacy.epsilon_budget`` (checked before anything runs or is written).
OVER_BUDGET = 3
#: The environment refused: a port already in use, a missing system dependency.
ENVIRONMENT = 4
#: A privacy audit refuted the accountant: its lower bound exceeds the claimed ε (the run fails).
AUDIT_FAILED = 5
#: Interrupted (SIGINT/SIGTERM): 128 + SIGINT, as a shell reports it; the run is resumable.
INTERRUPTED = 130

__all__ = ["OK", "BAD_INPUT", "OVER_BUDGET", "ENVIRONMENT", "AUDIT_FAILED", "INTERRUPTED"]
