"""The δ a configuration's run spends: its total (the histogram's δ_V + training.delta) and the
histogram's threshold δ₂ (what the dataset's pinned pool pays for)."""
from __future__ import annotations

from dpbert.config import Config


def _histogram(config: Config):
    from dpbert.privacy import histogram

    vocab, privacy = config.vocab, config.privacy
    if vocab.source == "public" or vocab.non_private:
        return None
    k = privacy.max_tuples_per_patient if privacy.unit == "patient" else 1
    return histogram.histogram_report(vocab.sigma, vocab.delta, privacy.tuple_words, vocab.threshold_mode, k,
                                      unit=privacy.unit)


def dataset_delta(config: Config) -> float:
    """The total δ of a run of ``config``: the histogram's δ (the real one for threshold_mode
    paper) when the vocabulary reads private data, plus training.delta."""
    report = _histogram(config)
    return (0.0 if report is None else report["delta"]) + config.training.delta


def threshold_delta(config: Config) -> float:
    """δ₂ of the configuration's DP histogram (0 when no vocabulary is built from private data)."""
    from dpbert.privacy.numbers import round_up

    report = _histogram(config)  # 12 digits, rounded up: a compiled spec's parameters stay short
    return 0.0 if report is None else round_up(float(report["delta_threshold"]), 12)
