"""DPVocabularyGen's stage: tuples → DP word histogram (Beam) → WordPiece vocabulary.

The threshold and (ε, δ) come from ``dpbert.privacy.histogram``, the Beam job from
``dpbert.vocab.beam_histogram``, the WordPiece trainer from ``dpbert.vocab.wordpiece``. Only the
noised, thresholded histogram is written (``histogram.jsonl``); the exact counts exist only
inside the Beam job.

``vocab.source`` (``dpbert.vocab.public``): ``dp`` as above; ``public`` writes the public
checkpoint's vocabulary and never reads the tuples (no Beam job, a ``mechanism: public`` record,
ε_V = 0); ``public+dp`` runs the same DP histogram job (same ε_V) and appends released words to
the public vocabulary. Both write ``token_sources.json`` and the ``vocab_source``,
``public_tokens`` and ``dp_tokens`` properties.
"""
from __future__ import annotations

import logging
from typing import Optional

from dpbert import schema, storage
from dpbert.config import PrivacyConfig, VocabConfig
from dpbert.data.readers import CorpusError
from dpbert.stages.result import StageResult

log = logging.getLogger("dpbert.vocabulary")

HISTOGRAM_FILE = "histogram.jsonl"
DP_EVENT_FILE = "dp_event.json"


class NoWordKept(CorpusError):
    """No word of the corpus passed the DP threshold (a corpus too small for the noise, or of
    punctuation only): bad input, exit 2 (``dpbert_cli.main`` maps ``CorpusError``), no traceback."""


def public_vocabulary(vocabulary_dir: str, vocab_config: VocabConfig, privacy_config: PrivacyConfig,
                      checkpoint_dir: Optional[str] = None) -> StageResult:
    """``vocab.source: public``: the public checkpoint's vocabulary; reads no private data."""
    from dpbert.privacy import events
    from dpbert.vocab import public, wordpiece

    tokenizer, sources = public.build_vocabulary("public", checkpoint_dir)
    storage.storage_for(vocabulary_dir).makedirs(vocabulary_dir)
    wordpiece.save_vocabulary(tokenizer, vocabulary_dir)
    public.write_token_sources(sources, vocabulary_dir)
    record = public.public_vocab_event("public", sources["public_checkpoint_vocab_sha256"])
    storage.write_text(storage.join(vocabulary_dir, DP_EVENT_FILE), events.to_json(record))
    log.info("vocabulary: the public checkpoint's %d tokens (vocab.source = public, no ε)", tokenizer.get_vocab_size())
    return StageResult(properties={
        "vocab_size": tokenizer.get_vocab_size(), schema.VOCAB_SOURCE: "public",
        schema.PUBLIC_TOKENS: sources["public_tokens"], schema.DP_TOKENS: 0,
        schema.TUPLE_WORDS: privacy_config.tuple_words, "unit": privacy_config.unit,
        schema.NON_PRIVATE: False, schema.PRIVATE: 0, schema.DP_EVENT: events.to_json(record),
        "epsilon": 0.0, "epsilon_classic": 0.0, "delta": 0.0,
    })


def dp_vocabulary(beam_pipeline, tuples_dir: str, vocabulary_dir: str, vocab_config: VocabConfig,
                  privacy_config: PrivacyConfig, tuple_words: Optional[int] = None,
                  checkpoint_dir: Optional[str] = None, ledger_target=None) -> StageResult:
    """Count each distinct word once per tuple, add N(0, σ²), keep counts ≥ C, learn WordPiece
    (``vocab.source: dp``) or append the released words to the public vocabulary (``public+dp``);
    ``public``: :func:`public_vocabulary` (the tuples are not read).

    ``beam_pipeline``: the Beam pipeline the histogram job runs on (TFX's
    ``BeamComponentParameter``). ``tuple_words``: N recorded on the tuples (must equal
    ``privacy.tuple_words``; None = not recorded). ``checkpoint_dir``: the public checkpoint
    (``model.init_dir``; None = ``$DPBERT_MINILM_DIR`` or the installed package).
    ``ledger_target``: the dataset ledger (``dpbert.accounting.target.LedgerTarget`` or its JSON; empty = none):
    the histogram is reserved there before the tuples are read (``BudgetRefused`` over the
    dataset's budget) and finalized once the vocabulary is written.
    """
    if vocab_config.source == "public":
        return public_vocabulary(vocabulary_dir, vocab_config, privacy_config, checkpoint_dir)
    from dpbert.privacy import events, histogram
    from dpbert.vocab import histogram_file, wordpiece
    from dpbert.vocab.beam_histogram import run_histogram_job

    vocab_cfg, privacy_cfg = vocab_config, privacy_config
    n_words = privacy_cfg.tuple_words
    if tuple_words not in (None, n_words):
        raise ValueError(f"privacy.tuple_words = {n_words} but the tuples artifact was cut with N = {tuple_words}")
    k = privacy_cfg.max_tuples_per_patient if privacy_cfg.unit == "patient" else None
    storage.storage_for(vocabulary_dir).makedirs(vocabulary_dir)
    histogram_path = storage.join(vocabulary_dir, HISTOGRAM_FILE)

    seeded = vocab_cfg.noise_seed is not None and not vocab_cfg.non_private
    if vocab_cfg.non_private:
        report = None
        record = events.non_private_event("vocab")
        log.warning("vocabulary: NON-PRIVATE baseline from exact counts (ε = ∞), as configured")
    else:
        report = histogram.histogram_report(vocab_cfg.sigma, vocab_cfg.delta, n_words, vocab_cfg.threshold_mode,
                                            k or 1, unit=privacy_cfg.unit)
        record = events.histogram_event(report)
        if seeded:
            # Tests only (refused with a budget): every word's noise can be recomputed from the
            # seed, giving its exact count: not DP. The seed itself is never recorded.
            record = events.non_private_event("vocab")
            record["reason"] = "vocab.noise_seed is set: the noise is predictable"
        if report.get("warning"):
            log.warning("vocabulary: %s", report["warning"])
        log.info("vocabulary: σ = %g, C = %.1f, ε = %.4g at δ = %.3g", vocab_cfg.sigma, report["threshold"],
                 report["epsilon"], report["delta"])

    from dpbert.accounting import target as ledger

    reservation = ledger.reserve_vocabulary(ledger_target, record, vocabulary_dir)  # before the tuples are read
    run_histogram_job(beam_pipeline, tuples_dir, histogram_path,
                      sigma=None if report is None else vocab_cfg.sigma,
                      threshold=None if report is None else report["threshold"],
                      noise_seed=vocab_cfg.noise_seed, max_tuples_per_patient=k)
    kept = histogram_file.read_histogram(histogram_path)
    if not kept:
        if report is None:
            raise NoWordKept("vocabulary: the corpus has no word (vocab.non_private = true, no threshold)")
        raise NoWordKept(f"vocabulary: no word passed the threshold C = {report['threshold']:.1f} "
                         f"(vocab.sigma = {vocab_cfg.sigma}, vocab.delta = {vocab_cfg.delta}); the "
                         f"corpus is too small for this noise: lower vocab.sigma or add data")
    sources = None
    if vocab_cfg.source == "public+dp":
        from dpbert.vocab import public

        tokenizer, sources = public.build_vocabulary("public+dp", checkpoint_dir, kept, vocab_cfg.max_new_tokens)
        log.info("vocabulary: %d words released; %d public tokens + %d appended DP words",
                 len(kept), sources["public_tokens"], sources["dp_tokens"])
    else:
        log.info("vocabulary: %d words released; training WordPiece (target size %d)", len(kept), vocab_cfg.size)
        tokenizer = wordpiece.train_wordpiece(kept, vocab_size=vocab_cfg.size, min_frequency=vocab_cfg.min_frequency)
    wordpiece.save_vocabulary(tokenizer, vocabulary_dir)
    if sources is not None:
        public.write_token_sources(sources, vocabulary_dir)
    storage.write_text(storage.join(vocabulary_dir, DP_EVENT_FILE), events.to_json(record))
    ledger.finalize_vocabulary(reservation, record)

    props = {
        "vocab_size": tokenizer.get_vocab_size(),
        "words_kept": len(kept),
        schema.VOCAB_SOURCE: vocab_cfg.source,
        schema.PUBLIC_TOKENS: sources["public_tokens"] if sources else 0,
        schema.DP_TOKENS: sources["dp_tokens"] if sources else tokenizer.get_vocab_size(),
        schema.TUPLE_WORDS: n_words,
        "unit": privacy_cfg.unit,
        schema.NON_PRIVATE: vocab_cfg.non_private or seeded,
        # Exact counts (non-private) or predictable noise (a test seed): operator-only.
        schema.PRIVATE: int(vocab_cfg.non_private or seeded),
        schema.DP_EVENT: events.to_json(record),
    }
    if report is None:
        props.update({"epsilon": float("inf"), "epsilon_classic": float("inf")})
    else:
        props.update({
            "epsilon": report["epsilon"], "epsilon_classic": report["epsilon_classic"],
            "delta": report["delta"], "delta_threshold": report["delta_threshold"],
            "sigma": vocab_cfg.sigma, "threshold": report["threshold"],
            "threshold_mode": vocab_cfg.threshold_mode, "max_contributions": report["max_contributions"],
        })
        if seeded:  # the mechanism ran, but its noise is predictable
            props.update({"epsilon": float("inf"), "epsilon_classic": float("inf")})
    return StageResult(properties=props)
