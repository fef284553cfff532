"""PrivacyAudit's stage and ``dpbert audit``: the empirical privacy audits of a configuration.

* ``audit_training``: the white-box one-run audit of the configured DP-SGD training
  (``dpbert.evaluate.whitebox``): the configured model (``model.*``), training
  (σ, C, B, steps/epochs, P replicas, T accumulation, δ_T) and plan (q = B / (n·(1 − holdout)),
  n = the public ``training.dataset_size``) run through the real step code with m gradient
  canaries, plus its positive control (the same run's sums read before the noise).
* ``audit_vocabulary``: the distinguishing test of the vocabulary mechanism
  (``dpbert.privacy.vocab_audit``) at the configured (σ, δ, N, threshold mode), plus its positive
  control (the same test of ``threshold_mode: paper``, whose real δ is far above its claim).

Which rows and which tokenizer
------------------------------
The audit is a statement about the MECHANISM (step code, noise placement, sampling, ledger), not
about the data: canaries are inserted already clipped and Poisson-sampled with the plan's q,
so any rows give a valid audit; the real rows only add the interference a real run has.

* The DAG component (``components/audit.py``) audits on the EMBEDDED SYNTHETIC corpus (public
  code, public seed: ``corpus.synthetic``) tokenized with the run's DP vocabulary (released).
  Its outputs are post-processing of public data and released values: a released artifact.
* ``dpbert audit`` audits on the configured corpus (the embedded one when none is configured),
  tokenized with a WordPiece learnt from that corpus's EXACT word counts. On the embedded
  corpus that is public; on a user's corpus the result is computed on private data without the
  vocabulary's noise and is marked ``private`` (operator-only).

Rows beyond the planned n are not used (the first n, a public cut): the audited run's batches
then have the configured expected size q·n, and the audit costs what the training costs.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Dict, Optional

import numpy as np

from dpbert import schema
from dpbert.config import Config, CorpusConfig

log = logging.getLogger(__name__)

#: m, gradient canaries: the reachable bound is 5.51 at δ = 1e-5 (95 %), above the demo's
#: gradient ε_T = 4.97, so the noise-off control can refute the demo's claim (README).
DEFAULT_CANARIES = 10_000
#: Vocabulary test trials on each of D and D′ (seconds on 2 cores at N = 256).
DEFAULT_VOCAB_TRIALS = 100_000
AUDIT_FILE = "audit.json"


def is_embedded_corpus(corpus: CorpusConfig) -> bool:
    """True when the corpus is the embedded synthetic one (public): no path configured."""
    return corpus.path is None


def audit_rows(config: Config, tokenizer=None, *, public_only: bool = False):
    """``(token_ids [n, L] int32, special ids, vocab size, private)`` of the audit's rows.

    ``public_only``: the embedded synthetic corpus whatever ``corpus.path`` says (the DAG
    component). ``tokenizer``: the run's DP vocabulary; None learns a WordPiece of
    ``vocab.size`` from the rows' exact counts (module docstring)."""
    from dpbert.data import corpus, tuples
    from dpbert.vocab import wordpiece

    corpus_config = dataclasses.replace(config.corpus, path=None) if public_only else config.corpus
    docs = list(corpus.iter_documents(corpus_config))
    word_tuples = list(tuples.corpus_tuples(docs, config.privacy.tuple_words))
    if not word_tuples:
        raise ValueError("the audit's corpus has no tuple (corpus.path / corpus.synthetic)")
    if tokenizer is None:
        histogram = collections.Counter(w for t in word_tuples for w in set(t.words))
        tokenizer = wordpiece.train_wordpiece(histogram.items(), vocab_size=config.vocab.size)
    ids = wordpiece.tokenize_tuples(tokenizer, (t.words for t in word_tuples), config.model.max_seq_length)
    private = not is_embedded_corpus(corpus_config)
    return np.asarray(ids, np.int32), wordpiece.special_ids(tokenizer), int(tokenizer.get_vocab_size()), private


def audit_training(config: Config, *, tokenizer=None, public_only: bool = False,
                   canaries: int = DEFAULT_CANARIES, beta: float = 0.05,
                   seed: Optional[int] = None) -> Dict[str, object]:
    """The white-box audit of ``config``'s DP-SGD training with its positive control
    (``whitebox_audit.whitebox_audit_report`` keys) plus ``private`` (1 when computed on a
    user's corpus), ``corpus`` and ``upper_bound_of``.

    ``epsilon_upper_bound`` is the accountant's ε of the GRADIENT release (σ, q, T) at δ_T: with
    ``training.dp_diagnostics`` the ledger's ε_T (which also charges the diagnostics' sums, at
    σ_eff < σ) is larger, so comparing with the gradient's ε is the stricter test."""
    from dpbert.model.bert import spec_from_config
    from dpbert.privacy.plan import plan_training
    from dpbert.evaluate.whitebox import whitebox_audit_report

    tc = config.training
    if tc.non_private:
        raise ValueError("training.non_private = true: there is no DP-SGD claim to audit (ε = ∞)")
    if tc.sampling != "poisson":
        raise ValueError("the white-box audit needs training.sampling = poisson (its canaries are "
                         "Poisson-sampled with the run's q; shuffle sampling is accounted differently)")
    token_ids, specials, vocab_size, private = audit_rows(config, tokenizer, public_only=public_only)
    holdout = config.membership.holdout_patient_fraction
    # privacy.unit = patient: the claim is per patient at q = B/n_patients; a canary stands for one
    # patient's clipped (summed) contribution and each audit row for one patient's tuple, sampled
    # at that q — the same noise draw, normalisation and accounting as the user-level run (its
    # per-group clipping of real rows is not what this audit tests: see dpbert.evaluate.whitebox).
    public_n = tc.dataset_patients if config.privacy.unit == "patient" else tc.dataset_size
    public_n = int(public_n) if public_n is not None else int(token_ids.shape[0])
    plan = plan_training(tc, public_n, holdout)
    token_ids = token_ids[: plan.dataset_size]
    if config.model.init == "minilm":
        # The public checkpoint's architecture (its first public_layers), as the trainer builds
        # it; the audit's weights start random (the audited mechanism does not depend on them).
        from dpbert.model.init_public import spec_for_public

        spec = spec_for_public(config.model, vocab_size, tc.mask_probability, config.model.init_dir)
    else:
        spec = spec_from_config(config.model, vocab_size, tc.mask_probability)
    log.info("audit: %d gradient canaries, %d steps, q = %.4g, σ = %s (the configured run)",
             canaries, plan.steps, plan.sampling_probability, tc.noise_multiplier)
    report = whitebox_audit_report(token_ids=token_ids, spec=spec, training_config=tc, canaries=int(canaries),
                                   dataset_size=public_n,
                                   beta=beta, seed=seed, holdout_fraction=holdout,
                                   special_token_ids=tuple(specials), mask_token_id=specials.mask)
    report["corpus"] = "configured corpus" if private else "embedded synthetic corpus (public)"
    report["upper_bound_of"] = "the gradient release (σ, q, T) at δ_T, PLD accountant"
    report["unit"] = config.privacy.unit
    report[schema.PRIVATE] = int(private)
    return report


def audit_vocabulary(config: Config, *, trials: int = DEFAULT_VOCAB_TRIALS, beta: float = 0.05,
                     seed: Optional[int] = None) -> Dict[str, object]:
    """The distinguishing test of the configured vocabulary mechanism (``vocab_audit`` keys),
    with ``epsilon_upper_bound`` = the claimed ε_V and the positive control: the same test of
    ``threshold_mode: paper`` at the same σ, δ, N (``positive_control_flagged``,
    ``positive_control_delta_lower_bound``). Public: the test draws its own histograms."""
    from dpbert.privacy.vocab_audit import vocab_distinguishing_test

    vc, n_words = config.vocab, config.privacy.tuple_words
    rng = np.random.default_rng(seed)
    honest = vocab_distinguishing_test(vc.sigma, vc.delta, n_words, vc.threshold_mode, trials=trials,
                                       beta=beta, seed=None if seed is None else int(rng.integers(2 ** 62)))
    control = vocab_distinguishing_test(vc.sigma, vc.delta, n_words, "paper", trials=trials, beta=beta,
                                        seed=None if seed is None else int(rng.integers(2 ** 62)))
    honest["epsilon_upper_bound"] = honest["claimed_epsilon"]
    honest["positive_control"] = "threshold_mode = paper at the same σ, δ, N"
    honest["positive_control_flagged"] = bool(control["flagged"])
    honest["positive_control_epsilon_lower_bound"] = control["epsilon_lower_bound"]
    honest["positive_control_delta_lower_bound"] = control["delta_lower_bound"]
    honest["positive_control_fresh_release_rate"] = control["fresh_release"]["rate"]
    return honest


#: The audit's keys recorded as the AuditReport's properties (released: every one is a
#: function of public rows, the DP vocabulary, public parameters and secret canaries).
REPORT_FIELDS = ("epsilon_lower_bound", "epsilon_upper_bound", "max_reachable_lower_bound", "consistent",
                 "canaries", "confidence", "delta", "steps", "q", "sigma_claimed", "clip_norm",
                 "positive_control_lower_bound", "positive_control_exceeds_upper_bound", "accuracy",
                 "guesses", "correct", "probe_variable", "canary_dims")


def run_audit(vocabulary_dir: str, report_dir: str, config: Config, *,
              epsilon_train_ledger: Optional[float] = None, seed: Optional[int] = None):
    """The DAG component's stage: ``audit_training`` on the embedded PUBLIC corpus with the run's
    DP vocabulary (``vocabulary_dir``), written to ``report_dir/whitebox_audit.json``; the
    properties are ``REPORT_FIELDS`` plus the ledger's ε_T (``epsilon_train_ledger``, shown next
    to the audit). ``failure``: ``AuditInconsistencyError`` when the lower bound exceeds the
    accountant's ε (recorded first, then raised by the adapter: the run fails)."""
    import json
    import os

    from dpbert.privacy.one_run_audit import AuditInconsistencyError, assert_audit_consistent
    from dpbert.stages.result import StageResult
    from dpbert.vocab.wordpiece import load_tokenizer

    report = audit_training(config, tokenizer=load_tokenizer(vocabulary_dir), public_only=True,
                            canaries=config.audit.canaries, beta=config.audit.beta, seed=seed)
    os.makedirs(report_dir, exist_ok=True)
    with open(os.path.join(report_dir, schema.WHITEBOX_AUDIT_FILE), "w", encoding="utf-8") as f:
        f.write(schema.dumps(report))
    failure = None
    try:
        assert_audit_consistent(report["epsilon_lower_bound"], report["epsilon_upper_bound"])
    except AuditInconsistencyError as err:
        failure = err
    log.info("audit: ε ≥ %.3f (audit, %d canaries, %.0f%%) vs ε ≤ %.3f (accountant, gradient release); "
             "power %.3f; positive control %.3f", report["epsilon_lower_bound"], report["canaries"],
             100 * report["confidence"], report["epsilon_upper_bound"], report["max_reachable_lower_bound"],
             report["positive_control_lower_bound"])
    properties = {k: report[k] for k in REPORT_FIELDS}
    properties["epsilon_train_ledger"] = epsilon_train_ledger
    properties["seconds"] = round(float(report["seconds"]["total"]), 1)
    properties[schema.PRIVATE] = 0
    return StageResult(properties=properties, failure=failure)
