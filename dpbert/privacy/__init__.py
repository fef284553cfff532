"""Differential privacy of the pipeline, in plain Python (numpy, scipy, dp-accounting; no TFX, no
TensorFlow): ``histogram`` (the vocabulary mechanism: threshold, (ε, δ), noise),
``events`` (DP events recorded on artifacts, JSON), ``accountant`` (DP-SGD ε and the ledger)."""
