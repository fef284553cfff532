"""Differential privacy of the pipeline, in plain Python (numpy, scipy, dp-accounting; no TFX, no
TensorFlow): ``histogram`` (the vocabulary mechanism: threshold, (ε, δ), noise),
``events`` (DP events recorded on artifacts, JSON), ``accountant`` (DP-SGD ε and the ledger),
``one_run_audit`` (the one-run audit's ε lower bound), ``whitebox_audit`` (the white-box audit's
gradient canaries and scores; its training harness is ``dpbert.evaluate.whitebox``).

The math layer: nothing here imports ``dpbert.network``, ``dpbert.mechanism``, ``dpbert.engine``, ``evaluate``, ``stages``, ``data`` or
``vocab`` (tests/test_layout.py)."""
