"""The public proxy a tuner trains on: text that is neither the private corpus nor derived from it.

Sources (``SOURCES``):

* ``synthetic`` — dpbert's synthetic clinical generator (``dpbert.data.synthetic``) at a PUBLIC
  seed (``PROXY_SEED`` by default), never the configured corpus's seed (refused: that corpus could
  be the private one). The best case: the demo corpus's own distribution. Notes are cut into
  tuples of ``privacy.tuple_words`` words as the ingest stage cuts them; a unit is a generated
  patient; held-out rows are further patients of the same seed.
* ``public`` — the shipped BC5CDR abstracts (``dpbert/resources/ner/bc5cdr``, CC BY 4.0): training
  rows from the train split packed as the public warm-up packs them
  (``dpbert.engine.public_warmup.public_rows``), held-out rows from the test split; a unit is k
  consecutive rows (k = ``privacy.max_tuples_per_patient`` for the patient unit, else 1).

Vocabulary: never the run's released one (a DP vocabulary is derived from the private corpus).
``vocab.source`` public / public+dp → the public checkpoint's vocabulary (its public part only);
dp → WordPiece learnt from the proxy's own training text at ``vocab.size`` tokens.

Inputs: :class:`ProxySpec`, public numbers of the configuration only (:func:`spec_for` copies
them; it reads no path of the configuration). The only files opened: the shipped BC5CDR text and
the public checkpoint's ``vocab.txt`` (tests/tuning/test_tune.py audits every open).
"""
from __future__ import annotations

import collections
import dataclasses
from typing import List, Optional, Sequence, Tuple

import numpy as np

from dpbert.config import ConfigError

SOURCES = ("synthetic", "public")
#: The synthetic proxy's public seed: no shipped configuration or command uses it for a corpus.
PROXY_SEED = 271828
#: Synthetic proxy: patients trained on, patients held out (defaults).
PROXY_PATIENTS = 1000
HELDOUT_PATIENTS = 200
#: At most this many held-out rows are scored (the same rows for every grid point).
HELDOUT_ROWS = 512


@dataclasses.dataclass(frozen=True)
class ProxySpec:
    """Public numbers that fix a proxy: ``source``, ``seed``, sizes (``patients`` /
    ``heldout_patients``: synthetic only), the shape of the rows (``tuple_words``,
    ``max_seq_length``), ``k`` rows per unit, the vocabulary choice and the synthetic shape."""

    source: str
    seed: int = PROXY_SEED
    patients: int = PROXY_PATIENTS
    heldout_patients: int = HELDOUT_PATIENTS
    tuple_words: int = 256
    max_seq_length: int = 128
    k: int = 1
    vocab_source: str = "dp"
    vocab_size: int = 30000
    init_dir: Optional[str] = None
    shape: str = "fixed"
    admissions_per_patient: int = 1
    notes_per_admission: int = 1


@dataclasses.dataclass
class Proxy:
    """The proxy's rows: ``train_rows`` ``[n, L]`` with each row's unit (``unit_keys``),
    ``heldout_rows`` ``[m, L]``, the tokenizer and its provenance (``vocabulary``)."""

    spec: ProxySpec
    train_rows: np.ndarray
    unit_keys: List[str]
    heldout_rows: np.ndarray
    tokenizer: object
    vocabulary: str
    description: str

    @property
    def units(self) -> int:
        return len(set(self.unit_keys))

    def provenance(self) -> dict:
        s = self.spec
        return {"source": s.source, "description": self.description, "seed": s.seed if s.source == "synthetic" else None,
                "train_rows": int(self.train_rows.shape[0]), "units": self.units, "rows_per_unit": s.k,
                "heldout_rows": int(self.heldout_rows.shape[0]), "vocabulary": self.vocabulary,
                "max_seq_length": s.max_seq_length}


def spec_for(config, source: str, seed: int = PROXY_SEED, patients: int = PROXY_PATIENTS,
             heldout_patients: int = HELDOUT_PATIENTS) -> ProxySpec:
    """The proxy of ``config`` (a ``dpbert.config.Config``) from its public numbers. ConfigError: an
    unknown source, or a synthetic seed equal to ``corpus.synthetic.seed`` (the run's corpus may be
    that very text)."""
    if source not in SOURCES:
        raise ConfigError(f"--proxy must be one of {', '.join(SOURCES)}, got {source!r}")
    if source == "synthetic" and int(seed) == int(config.corpus.synthetic.seed):
        raise ConfigError(f"the synthetic proxy's seed {seed} is corpus.synthetic.seed: that corpus may be the "
                          f"private one; choose another public seed")
    if patients < 1 or heldout_patients < 1:
        raise ConfigError(f"proxy patients must be >= 1, got {patients} and {heldout_patients}")
    s, privacy = config.corpus.synthetic, config.privacy
    return ProxySpec(source=source, seed=int(seed), patients=int(patients), heldout_patients=int(heldout_patients),
                     tuple_words=privacy.tuple_words, max_seq_length=config.model.max_seq_length,
                     k=privacy.max_tuples_per_patient if privacy.unit == "patient" else 1,
                     vocab_source=config.vocab.source, vocab_size=config.vocab.size, init_dir=config.model.init_dir,
                     shape=s.shape, admissions_per_patient=s.admissions_per_patient,
                     notes_per_admission=s.notes_per_admission)


def _synthetic_words(spec: ProxySpec) -> Tuple[List[Sequence[str]], List[str], List[Sequence[str]]]:
    """(training tuples' words, each one's patient, held-out tuples' words) of the generator at
    ``spec.seed``: the first ``patients`` patients train, the next ``heldout_patients`` are held out
    (a patient's notes do not depend on how many patients are generated)."""
    from dpbert.config import SyntheticCorpusConfig
    from dpbert.data.synthetic import corpus_notes
    from dpbert.data.tuples import corpus_tuples

    generator = SyntheticCorpusConfig(patients=spec.patients + spec.heldout_patients,
                                      admissions_per_patient=spec.admissions_per_patient,
                                      notes_per_admission=spec.notes_per_admission, seed=spec.seed, shape=spec.shape)
    order: dict = {}
    train, keys, heldout = [], [], []
    for t in corpus_tuples(corpus_notes(generator), spec.tuple_words):
        index = order.setdefault(t.patient_id, len(order))
        if index < spec.patients:
            train.append(t.words)
            keys.append(str(t.patient_id))
        else:
            heldout.append(t.words)
    return train, keys, heldout


def _tokenizer(spec: ProxySpec, words: Sequence[Sequence[str]]) -> Tuple[object, str]:
    """(tokenizer, its provenance): the public checkpoint's vocabulary, or WordPiece of ``words``."""
    if spec.vocab_source in ("public", "public+dp"):
        from dpbert.vocab.public import build_vocabulary

        tokenizer, record = build_vocabulary("public", spec.init_dir)
        return tokenizer, (f"the public checkpoint's vocabulary ({record['public_tokens']} tokens, vocab.txt sha256 "
                           f"{record['public_checkpoint_vocab_sha256']}); no DP-appended token")
    from dpbert.vocab.wordpiece import train_wordpiece

    counts = collections.Counter(w for row in words for w in row)
    tokenizer = train_wordpiece(sorted(counts.items()), spec.vocab_size)
    return tokenizer, (f"WordPiece learnt from the proxy's training text ({tokenizer.get_vocab_size()} tokens, "
                       f"vocab.size {spec.vocab_size})")


def build_proxy(spec: ProxySpec) -> Proxy:
    """The proxy ``spec`` describes (module docstring)."""
    from dpbert.vocab.wordpiece import tokenize_tuples

    if spec.source == "synthetic":
        train, keys, heldout = _synthetic_words(spec)
        tokenizer, vocabulary = _tokenizer(spec, train)
        train_rows = tokenize_tuples(tokenizer, train, spec.max_seq_length)
        heldout_rows = tokenize_tuples(tokenizer, heldout, spec.max_seq_length)
        description = (f"synthetic clinical notes (dpbert.data.synthetic, shape {spec.shape}) at the public seed "
                       f"{spec.seed}: {spec.patients} patients, {spec.heldout_patients} held out")
    else:
        from dpbert.engine.public_warmup import public_rows, public_sentences
        from dpbert.resources.bundled import bundled_bc5cdr_path

        train_sentences = public_sentences(bundled_bc5cdr_path("train"))
        tokenizer, vocabulary = _tokenizer(spec, train_sentences)
        train_rows = public_rows(tokenizer, spec.max_seq_length, train_sentences)
        heldout_rows = public_rows(tokenizer, spec.max_seq_length, public_sentences(bundled_bc5cdr_path("test")))
        keys = [f"bc5cdr-{i // spec.k}" for i in range(train_rows.shape[0])]
        description = ("shipped BC5CDR abstracts (dpbert/resources/ner/bc5cdr, CC BY 4.0): train split to train, "
                       f"test split held out; a unit = {spec.k} consecutive rows")
    if train_rows.shape[0] == 0 or heldout_rows.shape[0] == 0:
        raise ConfigError(f"the {spec.source} proxy has no training or held-out rows: give it more patients")
    return Proxy(spec, train_rows, keys, heldout_rows[:HELDOUT_ROWS], tokenizer, vocabulary, description)
