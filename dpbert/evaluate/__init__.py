"""Privacy and utility evaluators (plain Python; TensorFlow only where a model is trained).

* ``canary``: secret-sharer canaries (generation, private JSON artifact, insertion) and exposure
  (rank among the candidate set, skew-normal extrapolation) from any MLM ``score_fn``.
* ``whitebox``: the white-box one-run audit's training harness (real DP-SGD steps with gradient
  canaries); its bound and scoring math are ``dpbert.privacy.one_run_audit`` and
  ``dpbert.privacy.whitebox_audit``.
* ``ner``: IOB/CoNLL and i2b2-2010 readers, conlleval entity F1, token-classification
  fine-tuning of a pre-trained encoder.
"""
