"""PrivacyAudit's stage and ``dpbert audit``: the empirical privacy audits of a configuration.

* ``audit_training``: the white-box one-run audit of the configured DP-SGD training
  (``dpbert.evaluate.whitebox``): the trainer's own loop (``build_training``: the configured model,
  trainable set, unit and sampler, σ, C, B, steps, P, T, δ_T, plan over the public n with the
  holdout) with m gradient canaries enrolled as extra units of the run's sampler; optionally its
  positive control (the same run's sums read before the noise: public rows only).
* ``audit_vocabulary``: the distinguishing test of the vocabulary mechanism
  (``dpbert.privacy.vocab_audit``) at the configured (σ, δ, N, threshold mode), plus its positive
  control (the same test of ``threshold_mode: paper``, whose real δ is far above its claim).

Which rows and which tokenizer
------------------------------
The audit is a statement about the MECHANISM (loop, sampler, noise placement, step count), not
about the data: canaries are units of their own whose whole contribution is a vector of norm C,
so any rows give a valid audit; the real rows add the interference a real run has.

* The DAG component (``components/audit.py``) audits on the EMBEDDED SYNTHETIC corpus (public
  code, public seed: ``corpus.synthetic``) tokenized with the run's DP vocabulary (released).
  Its outputs are post-processing of public data and released values: a released artifact.
* ``dpbert audit`` audits on the configured corpus (the embedded one when none is configured),
  tokenized with a WordPiece learnt from that corpus's EXACT word counts. On the embedded
  corpus that is public; on a user's corpus the audited run is a DP-SGD run on private rows —
  a DP release whose record (``dp_event``) is returned for the ledger — and the report is marked
  ``private`` (operator-only: its vocabulary is not DP); ``--positive-control`` is refused there.

Units beyond the planned n are not used (the first n, a public cut): the audited run's batches
then have the configured expected size q·n, and the audit costs what the training costs plus the
canary units (≈ q·m/2 empty units per step).
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

#: m, gradient canaries (≈ q·m/2 = 137 empty canary units per demo step). Measured on the demo
#: (gradient ε_T 2.93, q·T = 1.37, canaries on mlm_transform/kernel): m = 2,000 → noise-off
#: control 2.87 (NOT above the claim), honest 0.74; m = 10,000 → control 2.95 (above, by a thin
#: margin), honest 0.65, 748 s on 2 cores.
DEFAULT_CANARIES = 10_000
#: Vocabulary test trials on each of D and D′ (seconds on 2 cores at N = 256).
DEFAULT_VOCAB_TRIALS = 100_000
AUDIT_FILE = "audit.json"


def is_embedded_corpus(corpus: CorpusConfig) -> bool:
    """True when the corpus is the embedded synthetic one (public): no path configured."""
    return corpus.path is None


@dataclasses.dataclass
class AuditRows:
    """The audit's rows: ``token_ids`` [n, L] int32, each row's patient key, the special ids, the
    vocabulary size, its tokens, and whether the rows are private (a user's corpus)."""

    token_ids: np.ndarray
    patient_keys: list
    specials: object
    vocab_size: int
    vocab_tokens: list
    private: bool


def audit_rows(config: Config, tokenizer=None, *, public_only: bool = False) -> AuditRows:
    """The audit's rows (module docstring). ``public_only``: the embedded synthetic corpus whatever
    ``corpus.path`` says (the DAG component). ``tokenizer``: the run's DP vocabulary; None learns a
    WordPiece of ``vocab.size`` from the rows' exact counts."""
    from dpbert.data import corpus, splits, tuples
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
    size = int(tokenizer.get_vocab_size())
    return AuditRows(np.asarray(ids, np.int32), [splits.patient_key(t) for t in word_tuples],
                     wordpiece.special_ids(tokenizer), size, [tokenizer.id_to_token(i) for i in range(size)],
                     not is_embedded_corpus(corpus_config))


def _first_units(rows: AuditRows, n_units: int, patient_unit: bool):
    """(token ids, patient keys) of the first ``n_units`` units (a public cut: the plan's n)."""
    if not patient_unit:
        return rows.token_ids[:n_units], rows.patient_keys[:n_units]
    kept, keep = set(), []
    for i, key in enumerate(rows.patient_keys):
        if key not in kept and len(kept) < n_units:
            kept.add(key)
        keep.append(key in kept)
    keep = np.asarray(keep, bool)
    return rows.token_ids[keep], [k for k, x in zip(rows.patient_keys, keep) if x]


def audit_training(config: Config, *, tokenizer=None, public_only: bool = False,
                   canaries: int = DEFAULT_CANARIES, beta: float = 0.05, positive_control: bool = False,
                   seed: Optional[int] = None, hooks=(), progress: bool = False) -> Dict[str, object]:
    """The white-box audit of ``config``'s DP-SGD training through the trainer's own loop
    (``dpbert.evaluate.whitebox.whitebox_audit`` keys) plus ``private`` (1 on a user's corpus),
    ``corpus``, ``upper_bound_of`` and ``differs`` (what is not the configured run).

    ``positive_control``: also score the same run's sums before the noise — refused on a user's
    corpus (not private). ``progress``: the trainer's progress line (DP estimates only).
    ``epsilon_upper_bound`` is the accountant's ε of the GRADIENT release
    (σ, q, T) at δ_T: with ``training.dp_diagnostics`` the ledger's ε_T is larger, so comparing
    with the gradient's ε is the stricter test."""
    from dpbert.evaluate.whitebox import whitebox_audit
    from dpbert.privacy.plan import plan_for_config

    tc = config.training
    if tc.non_private:
        raise ValueError("training.non_private = true: there is no DP-SGD claim to audit (ε = ∞)")
    if tc.sampling != "poisson":
        raise ValueError("the white-box audit needs training.sampling = poisson (its canaries are units of "
                         "the run's Poisson sampler; shuffle sampling is accounted differently)")
    rows = audit_rows(config, tokenizer, public_only=public_only)
    if positive_control and rows.private:
        raise ValueError("--positive-control reads the sums before the noise (not private): refused on a "
                         "user's corpus (corpus.path); run it on the embedded public corpus")
    patient_unit = config.privacy.unit == "patient"
    public_n = tc.dataset_patients if patient_unit else tc.dataset_size
    units = len(set(rows.patient_keys)) if patient_unit else int(rows.token_ids.shape[0])
    plan = plan_for_config(config, int(public_n) if public_n is not None else units)
    token_ids, keys = _first_units(rows, plan.dataset_size, patient_unit)
    mc = config.model
    minilm = mc.init == "minilm"
    log.info("audit: %d gradient canaries, %d steps, q = %.4g, σ = %s, unit %s, trainable %s (the configured loop)",
             canaries, plan.steps, plan.sampling_probability, tc.noise_multiplier, config.privacy.unit,
             ",".join(tc.trainable))
    report = whitebox_audit(token_ids, rows.specials, rows.vocab_size, mc, tc, plan=plan,
                            patient_keys=keys if patient_unit else None, public=not rows.private,
                            canaries=int(canaries), beta=beta, seed=seed, positive_control=positive_control,
                            hooks=hooks, mask_token_id=rows.specials.mask,
                            vocab_tokens=rows.vocab_tokens if minilm else None,
                            public_checkpoint_dir=mc.init_dir if minilm else None, progress=progress)
    report["differs"] = _differs(config, tokenizer is not None)
    report["corpus"] = "configured corpus" if rows.private else "embedded synthetic corpus (public)"
    report["upper_bound_of"] = "the gradient release (σ, q, T) at δ_T, PLD accountant"
    report["unit"] = config.privacy.unit
    report[schema.PRIVATE] = int(rows.private)
    return report


def _differs(config: Config, run_vocabulary: bool) -> list:
    """What the audited loop does not share with ``dpbert run`` (public, fixed statements)."""
    out = ["units: the plan's first n units of the audit's rows plus the enrolled canary units (empty rows)",
           "nothing is saved: a throw-away ram:// chain"]
    if not run_vocabulary:
        out.append("vocabulary: a WordPiece learnt from the audit's corpus, not the run's released vocabulary")
    if config.model.init == "minilm" and (config.model.public_warmup_steps or 0) > 0:
        out.append("public start: the checkpoint's layers without the MLM-head public warm-up")
    return out


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
                 "guesses", "correct", "probe_variable", "canary_dims", "audited_unit", "max_contributions")


def run_audit(vocabulary_dir: str, report_dir: str, config: Config, *,
              epsilon_train_ledger: Optional[float] = None, seed: Optional[int] = None):
    """The DAG component's stage: ``audit_training`` on the embedded PUBLIC corpus with the run's
    DP vocabulary (``vocabulary_dir``) and its positive control (public rows), written to
    ``report_dir/whitebox_audit.json`` (any storage); the properties are ``REPORT_FIELDS`` plus the
    ledger's ε_T (``epsilon_train_ledger``, shown next to the audit). ``failure``:
    ``AuditInconsistencyError`` when the lower bound exceeds the accountant's ε (recorded first,
    then raised by the adapter: the run fails)."""
    from dpbert import storage
    from dpbert.privacy.one_run_audit import AuditInconsistencyError, assert_audit_consistent
    from dpbert.stages.result import StageResult
    from dpbert.vocab.wordpiece import load_tokenizer

    report = audit_training(config, tokenizer=load_tokenizer(vocabulary_dir), public_only=True,
                            canaries=config.audit.canaries, beta=config.audit.beta, positive_control=True,
                            seed=seed)
    storage.write_text(storage.join(report_dir, schema.WHITEBOX_AUDIT_FILE), schema.dumps(report))
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
    properties["trainable"] = ",".join(report["trainable"])
    properties["epsilon_train_ledger"] = epsilon_train_ledger
    properties["seconds"] = round(float(report["seconds"]["total"]), 1)
    properties[schema.PRIVATE] = 0
    return StageResult(properties=properties, failure=failure)
