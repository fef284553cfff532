"""Measurements of a run's mechanism, outside the training run itself.

* ``noise_check``: measures the per-update noise through the real step (CLI: ``python -m
  dpbert.diagnostics.noise_check``).
* ``loss_curve``: the step log's loss curve, smoothed for people to read.
"""
