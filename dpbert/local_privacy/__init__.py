"""Local privacy: dχ-privacy (metric local DP) for text, after Qu et al. 2021 (CIKM).

The rest of dpbert is CENTRAL differential privacy (the curator holds the raw notes; the DP
vocabulary and DP-SGD protect what is released). This package privatizes each token on the
user's side before anyone else sees it:

* ``dchi``        — the mechanism: φ(x) + z, density ∝ exp(−η‖z‖), nearest public token; the
  ηd(x, x')-privacy derivation and how it differs from the central (ε, δ) guarantee;
* ``embeddings``  — the public token-embedding table and tokenizer (public checkpoint);
* ``text``        — ``privatize_text`` / ``privatize_file`` / word lists for the pipeline;
* ``deniability`` — plausible-deniability statistics N_w, S_w and the inversion attack, plots;
* ``pretrain``    — privacy-adaptive pre-training objectives (vanilla / prob / denoising MLM);
* ``finetune``    — fine-tuning on privatized input, original vs privatized accuracy tables;
* ``experiments`` — ``python -m dpbert.local_privacy.experiments`` writes the figures and tables.

``dpbert privatize`` (``dpbert_cli/privatize.py``) drives ``text``.

TensorFlow is imported only by ``pretrain``/``finetune`` training functions and by
``embeddings.from_dpbert_model``.
"""
