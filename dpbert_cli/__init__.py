"""The ``dpbert`` command line, above every layer it drives.

``dpbert_cli`` imports the core (``dpbert``), the DAG (``pipeline``), the Vertex compiler
(``kubeflow``) and the dashboard (``dashboard``); nothing imports it. Modules:

* ``main`` — the argument parser, logging, the error → exit-code mapping (``dpbert.exit_codes``);
* ``commands`` — run, synth, report, release, privacy calculators, budget;
* ``privatize`` — ``dpbert privatize`` (over ``dpbert.local_privacy``);
* ``dashboard`` — ``dpbert dashboard`` (over ``dashboard.app``, imported only when it runs);
* ``args`` — the arguments commands share (``--config``/``--set``; the demo preset without ``--config``);
* ``audit`` — ``dpbert audit`` (over ``dpbert.stages.audit``);
* ``output`` — the one ``--json`` printer (``dpbert.schema.dumps``).

``dpbert compile`` is ``kubeflow.runner.add_compile_parser`` (also ``python -m kubeflow.runner``).
"""
import os

# Before TensorFlow is imported by anything below: tensorflow-privacy needs Keras 2 (tf-keras).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
