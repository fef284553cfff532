"""The DP-SGD step, split by role (as tensorflow-privacy's DPQuery and Opacus's DPOptimizer separate
the mechanism from its execution). Plain TensorFlow; nothing here imports ``dpbert.engine``: the
engine hands in its per-unit clipping (``dpbert.mechanism.ghost``) as a ``clipping.ClippingPath``.

* ``gaussian``: THE MECHANISM — clip-and-sum, one Gaussian draw N(0, σ²Δ²I) per logical batch,
  ÷ the public B; its ``sensitivity`` (Δ: C, or 1 under normalized clipping), ``noise_multiplier``
  and ``noise_std`` are what the accountant and the checks read. ``DPSGDConfig`` is its
  specification.
* ``clipping``: per-unit clipping paths (the ghost-norm path's protocol, tensorflow-privacy's
  registry with two backward passes), per-example losses and plain gradients.
* ``replicas``: THE REPLICA EXECUTOR — strategy, all-reduce SUM, the noise seed shared across
  workers, padding rounds and ``sync_step``, XLA staging, the next draw made ahead.
* ``step``: ``DPSGDTrainStep``, which composes the two with the optimizer (``run_step``), and the
  run-time probes (``AuditProbe``, ``NoiseProbe``).
* ``adam_bc``: DP-AdamBC, the AdamW whose second moment is corrected by the mechanism's noise
  variance Φ (``training.optimizer: adamw_bc``; the step hands it Φ).
* ``ghost``: per-unit clipped gradient sums (ghost norms + book-keeping, one backward pass).
* ``sampling``: which units take part — Poisson / shuffle batches packed into fixed-shape rounds.
* ``integrity``: the run-time checks that the mechanism that ran is the accounted one.

Derivation of the noise placement: docs/privacy.md, "Where the noise goes".
"""
