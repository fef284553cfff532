"""Privacy and utility evaluators (plain Python; TensorFlow only where a model is trained).

* ``canary``: secret-sharer canaries (generation, private JSON artifact, insertion) and exposure
  (rank among the candidate set, skew-normal extrapolation) from any MLM ``score_fn``.
* ``audit``: one-run privacy audit (Steinke, Nasr & Jagielski 2023): ε lower bounds from canary
  scores, checked against the accountant's upper bound.
* ``ner``: IOB/CoNLL and i2b2-2010 readers, conlleval entity F1, token-classification
  fine-tuning of a pre-trained encoder.
"""
