"""The DAG's stages as plain Python: what each TFX component does, without TFX.

One module per DAG node that holds logic. Each stage function takes typed configuration
sections (``dpbert.config``), directories (the artifact URIs) and the plain values the adapter
read from its input artifacts' properties, writes its output files, and returns a result
dataclass whose ``properties`` the adapter (``components/<name>.py``) stores on the output
artifact. Nothing here imports TFX, so every stage is unit-tested in ``tests/stages/``.

* ``ingest``     — CorpusIngest: corpus → N-word tuples.
* ``privatize``  — TextPrivatizer: dχ-privatized tuples.
* ``vocabulary`` — DPVocabularyGen: DP histogram (Beam) → WordPiece vocabulary.
* ``canary``     — CanaryGen (canaries), their insertion, CanaryExposure (exposure, audit).
* ``pretrain``   — MLMPretrainer: holdout, canaries, tokenization, the plan, DP-SGD, DP event.
* ``accountant`` — PrivacyAccountant: the ε ledger from the recorded DP events.
* ``ner``        — NerEvaluator: NER F1 and held-out MLM loss.
* ``membership`` — MembershipInference: the attacks on the held-out split.

This ``__init__`` imports none of the modules: a component's ``code_version`` (a hash of what it
imports, ``pipeline/code_version.py``) then covers only the stage it calls.
"""
