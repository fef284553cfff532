"""Overrides that turn the demo preset back into the small random-init, per-tuple configuration
the end-to-end tests run in seconds: the demo itself (public MiniLM start, public+dp vocabulary,
the patient unit) costs minutes per trainer."""

CLASSIC = [
    "model.init=random",
    "model.public_layers=null",
    "model.public_warmup_steps=0",
    "vocab.source=dp",
    "privacy.unit=tuple",
    "training.dataset_patients=null",
    "training.dataset_size=2000",
    "training.learning_rate=0.003",
    "ner.mode=finetune",
    "ner.task=bc5cdr",
    "ner.seeds=1",
    "ner.learning_rate=0.001",
    "ner.epochs=3",
    # the previous demo's sizes (tests override what they shrink further)
    "training.trainable=[all]",
    "corpus.synthetic.shape=fixed",
    "corpus.synthetic.patients=250",
    "corpus.synthetic.admissions_per_patient=2",
    "corpus.synthetic.notes_per_admission=2",
    "privacy.max_tuples_per_patient=4",
    "training.checkpoint_every=20",
    "vocab.sigma=10",
    "vocab.size=2000",
    "model.max_seq_length=128",
    "training.batch_size=64",
    "training.noise_multiplier=1.15",
    "training.steps=450",
    "training.warmup_steps=20",
    "membership.max_samples=2000",
]


def set_args(overrides=()):
    """``--set`` arguments for CLASSIC + ``overrides``."""
    out = []
    for o in list(CLASSIC) + list(overrides):
        out += ["--set", o]
    return out
