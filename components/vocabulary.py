"""DPVocabulary: tuples → DP word histogram (Beam) → WordPiece vocabulary.

A thin adapter: the threshold and (ε, δ) come from ``dpbert.privacy.histogram``, the Beam job
from ``beam_jobs.dp_histogram``, the WordPiece trainer from ``dpbert.vocab.wordpiece``. Only the
noised, thresholded histogram is written (``histogram.jsonl``); the exact counts exist only
inside the Beam job.
"""
import json
import logging
import os
from typing import Optional

import apache_beam as beam
from tfx.dsl.component.experimental.annotations import (BeamComponentParameter, InputArtifact,
                                                        OutputArtifact, Parameter)
from tfx.dsl.component.experimental.decorators import component

from components.artifacts import DPVocabulary, WordTuples
from components.common import get_property, section_from_json, set_properties
from dpbert.config import PrivacyConfig, VocabConfig

log = logging.getLogger("dpbert.vocabulary")

HISTOGRAM_FILE = "histogram.jsonl"
DP_EVENT_FILE = "dp_event.json"


@component(use_beam=True)
def DPVocabularyGen(
    tuples: InputArtifact[WordTuples],
    vocabulary: OutputArtifact[DPVocabulary],
    vocab_config: Parameter[str],
    privacy_config: Parameter[str],
    code_version: Parameter[str],
    beam_pipeline: BeamComponentParameter[beam.Pipeline] = None,
):
    """Count each distinct word once per tuple, add N(0, σ²), keep counts ≥ C, learn WordPiece."""
    from beam_jobs.dp_histogram import run_histogram_job
    from dpbert.privacy import events, histogram
    from dpbert.vocab import histogram_file, wordpiece

    vocab_cfg = section_from_json(VocabConfig, vocab_config)
    privacy_cfg = section_from_json(PrivacyConfig, privacy_config)
    n_words = privacy_cfg.tuple_words
    if get_property(tuples, "tuple_words") not in (None, n_words):
        raise ValueError(f"privacy.tuple_words = {n_words} but the tuples artifact was cut with "
                         f"N = {get_property(tuples, 'tuple_words')}")
    k = privacy_cfg.max_tuples_per_patient if privacy_cfg.unit == "patient" else None
    out_dir = vocabulary.uri
    os.makedirs(out_dir, exist_ok=True)
    histogram_path = os.path.join(out_dir, HISTOGRAM_FILE)

    if vocab_cfg.non_private:
        report = None
        record = events.non_private_event("vocab")
        log.warning("vocabulary: NON-PRIVATE baseline from exact counts (ε = ∞), as configured")
    else:
        report = histogram.histogram_report(vocab_cfg.sigma, vocab_cfg.delta, n_words, vocab_cfg.threshold_mode,
                                            k or 1, unit=privacy_cfg.unit)
        record = events.histogram_event(report)
        if report.get("warning"):
            log.warning("vocabulary: %s", report["warning"])
        log.info("vocabulary: σ = %g, C = %.1f, ε = %.4g at δ = %.3g", vocab_cfg.sigma, report["threshold"],
                 report["epsilon"], report["delta"])

    run_histogram_job(beam_pipeline, tuples.uri, histogram_path,
                      sigma=None if report is None else vocab_cfg.sigma,
                      threshold=None if report is None else report["threshold"],
                      noise_seed=vocab_cfg.noise_seed, max_tuples_per_patient=k)
    kept = histogram_file.read_histogram(histogram_path)
    if not kept:
        raise ValueError(f"vocabulary: no word passed the threshold C = {report['threshold']:.1f} "
                         f"(vocab.sigma = {vocab_cfg.sigma}, vocab.delta = {vocab_cfg.delta}); the "
                         f"corpus is too small for this noise: lower vocab.sigma or add data")
    log.info("vocabulary: %d words released; training WordPiece (target size %d)", len(kept), vocab_cfg.size)
    tokenizer = wordpiece.train_wordpiece(kept, vocab_size=vocab_cfg.size, min_frequency=vocab_cfg.min_frequency)
    wordpiece.save_vocabulary(tokenizer, out_dir)
    with open(os.path.join(out_dir, DP_EVENT_FILE), "w", encoding="utf-8") as f:
        f.write(events.to_json(record))

    props = {
        "vocab_size": tokenizer.get_vocab_size(),
        "words_kept": len(kept),
        "tuple_words": n_words,
        "unit": privacy_cfg.unit,
        "non_private": vocab_cfg.non_private,
        "noise_seed": vocab_cfg.noise_seed,  # recorded: a fixed seed is for tests only
        "dp_event": events.to_json(record),
        "code_version": code_version,
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
    set_properties(vocabulary, props)
