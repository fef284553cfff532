"""PrivacyAudit's stage and ``dpbert audit``: the empirical privacy audits of a configuration.

* ``audit_training``: the white-box one-run audit of the configured DP-SGD training
  (``dpbert.evaluate.whitebox``): the trainer's own loop with m gradient canaries enrolled as extra
  units of the run's sampler; optionally its positive control (the same run's sums read before the
  noise: public rows only).
* ``audit_vocabulary``: the distinguishing test of the vocabulary mechanism
  (``dpbert.privacy.vocab_audit``) at the configured (σ, δ, N, threshold mode), plus its positive
  control (the same test of ``threshold_mode: paper``, whose real δ is far above its claim).

Contract: the audit is a statement about the MECHANISM, not the data, so any rows give a valid
audit. On a user's corpus the audited run is a DP release: its vocabulary is one already released
and charged (or the public one), its n is public, its DP-SGD record is reserved in the dataset's
ledger before the first step (``BudgetRefused`` over the budget; a corpus without
``corpus.dataset_id`` is refused), the report is operator-only and the positive control is
refused. Which rows and which tokenizer each path uses, and what the audit costs: docs/audits.md
("Which rows the audit trains on").
"""
from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Dict, Optional

import numpy as np

from dpbert import schema, storage
from dpbert.config import Config, ConfigError, CorpusConfig

log = logging.getLogger(__name__)

#: m, gradient canaries (≈ q·m/2 = 137 empty canary units per demo step). Measured on the demo
#: (gradient ε_T 2.93, q·T = 1.37, canaries on mlm_transform/kernel): m = 2,000 → noise-off
#: control 2.87 (NOT above the claim), honest 0.74; m = 10,000 → control 2.95 (above, by a thin
#: margin), honest 0.65, 748 s on 2 cores.
DEFAULT_CANARIES = 10_000
#: Vocabulary test trials on each of D and D′ (seconds on 2 cores at N = 256).
DEFAULT_VOCAB_TRIALS = 100_000
AUDIT_FILE = "audit.json"
#: What the report of an audit on a user's corpus says about itself (``release``).
OPERATOR_ONLY = ("operator-only: computed on the configured (private) corpus, never to be released; the "
                 "audited run is a DP-SGD release on those rows, charged to the dataset's ledger")
PUBLIC_ROWS = "public: computed on the embedded synthetic corpus (public rows)"
#: The vocabulary records an audit on a user's corpus accepts (``dp_event.json``'s mechanism).
DP_VOCABULARY_MECHANISMS = ("dp_histogram", "public")


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
    """The audit's rows (docs/audits.md). ``public_only``: the embedded synthetic corpus whatever
    ``corpus.path`` says (the DAG component). ``tokenizer``: the run's DP vocabulary; None learns a
    WordPiece of ``vocab.size`` from the rows' exact counts — public rows only (ConfigError on a
    user's corpus: not DP, docs/audits.md)."""
    from dpbert.data import corpus, splits, tuples
    from dpbert.vocab import wordpiece

    corpus_config = dataclasses.replace(config.corpus, path=None) if public_only else config.corpus
    docs = list(corpus.iter_documents(corpus_config))
    word_tuples = list(tuples.corpus_tuples(docs, config.privacy.tuple_words))
    if not word_tuples:
        raise ValueError("the audit's corpus has no tuple (corpus.path / corpus.synthetic)")
    if tokenizer is None and not is_embedded_corpus(corpus_config):
        raise ConfigError("the audit's vocabulary would be a WordPiece of the user's corpus's exact counts (not DP): "
                          "give a DP vocabulary already released (--vocabulary-dir) or set vocab.source: public")
    if tokenizer is None:
        histogram = collections.Counter(w for t in word_tuples for w in set(t.words))
        tokenizer = wordpiece.train_wordpiece(histogram.items(), vocab_size=config.vocab.size)
    ids = wordpiece.tokenize_tuples(tokenizer, (t.words for t in word_tuples), config.model.max_seq_length)
    size = int(tokenizer.get_vocab_size())
    return AuditRows(np.asarray(ids, np.int32), [splits.patient_key(t) for t in word_tuples],
                     wordpiece.special_ids(tokenizer), size, [tokenizer.id_to_token(i) for i in range(size)],
                     not is_embedded_corpus(corpus_config))


def audit_vocabulary_source(config: Config, vocabulary_dir: Optional[str] = None):
    """(tokenizer or None, what it is) for ``audit_training`` (docs/audits.md): the DPVocabulary
    folder ``vocabulary_dir`` (its record checked), else on a user's corpus the public checkpoint's
    vocabulary (``vocab.source: public``), else None (the embedded corpus's exact WordPiece: public).
    ConfigError on a user's corpus without either."""
    from dpbert.vocab import wordpiece

    if vocabulary_dir is not None:
        check_vocabulary_record(vocabulary_dir)
        return wordpiece.load_tokenizer(vocabulary_dir), "the DP vocabulary given (--vocabulary-dir)"
    if is_embedded_corpus(config.corpus):
        return None, "a WordPiece of the embedded corpus's exact counts (public text)"
    if config.vocab.source == "public":
        from dpbert.vocab import public

        return public.build_vocabulary("public", config.model.init_dir)[0], \
            "the public checkpoint's vocabulary (vocab.source: public)"
    raise ConfigError("dpbert audit on a user's corpus (corpus.path) needs a vocabulary that is not learnt from "
                      "its exact counts: --vocabulary-dir DIR (a DP vocabulary a run on this dataset released) "
                      f"or vocab.source: public (got vocab.source: {config.vocab.source})")


def check_vocabulary_record(vocabulary_dir: str) -> dict:
    """The vocabulary's ``dp_event.json`` record when it is a DP histogram's or a public one;
    ConfigError naming the file otherwise (missing, exact counts, a predictable noise seed)."""
    from dpbert.privacy import events

    path = storage.join(vocabulary_dir, "dp_event.json")
    if not storage.storage_for(path).exists(path):
        raise ConfigError(f"{path} does not exist: nothing shows that vocabulary {vocabulary_dir} is DP")
    try:
        record = events.from_json(storage.read_text(path))
    except ValueError as err:
        raise ConfigError(f"{path}: not a DP event record ({err})") from None
    mechanism = record.get("mechanism") if isinstance(record, dict) else None
    if mechanism not in DP_VOCABULARY_MECHANISMS or record.get("stage") != "vocab":
        raise ConfigError(f"{path} records mechanism {mechanism!r}, not a DP or public vocabulary "
                          f"({', '.join(DP_VOCABULARY_MECHANISMS)}): refused")
    return record


def _output_uri(config: Config) -> str:
    """Where the ledger entry says the audit ran (``<output_dir>/audit``, never a pipeline's root:
    ``dpbert.accounting.target.run_of``); the audit writes nothing there."""
    import uuid

    return storage.join(config.pipeline.output_dir, "audit", "dpbert-audit", "whitebox", uuid.uuid4().hex[:12])


def _reserve(config: Config, plan, rows: int, charge: bool, private: bool):
    """Reserve the audited run's DP-SGD record (σ accounted as the trainer's, the plan's steps) in
    the dataset's ledger BEFORE the first step; BudgetRefused over the budget. None when not charged
    (``charge`` False: public rows only)."""
    from dpbert.accounting.sigma import configured_sigma
    from dpbert.accounting.target import ledger_target, reserve_event
    from dpbert.engine.charges import training_record

    if not charge:
        if private:
            raise ConfigError("an audit on a user's corpus (corpus.path) is a DP-SGD release on its rows: it is "
                              "always charged to the dataset's ledger (no --no-charge)")
        return None
    target = ledger_target(config)
    if target is None:
        raise ConfigError("corpus.dataset_id is not set: an audit on a user's corpus is charged to the dataset's "
                          "ledger, which needs the dataset's identity")
    record = dict(training_record(configured_sigma(config.training), plan, rows, plan.steps), origin="audit")
    return reserve_event(target, "dp_sgd", [record], _output_uri(config))


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


@dataclasses.dataclass(frozen=True)
class Watch:
    """What watches the audit's training loop: extra loop ``hooks`` and the trainer's
    ``progress`` line (DP estimates only)."""
    hooks: tuple = ()
    progress: bool = False


def audit_training(config: Config, *, tokenizer=None, public_only: bool = False,
                   canaries: int = DEFAULT_CANARIES, beta: float = 0.05, positive_control: bool = False,
                   seed: Optional[int] = None, watch: Watch = Watch(), charge: bool = True,
                   vocabulary: Optional[str] = None) -> Dict[str, object]:
    """The white-box audit of ``config``'s DP-SGD training through the trainer's own loop
    (``dpbert.evaluate.whitebox.whitebox_audit`` keys) plus ``private`` (1 on a user's corpus),
    ``release`` (operator-only or public), ``charged`` and ``ledger_entry``, ``corpus``,
    ``vocabulary`` (what ``tokenizer`` is), ``upper_bound_of`` and ``differs``.

    ``charge``: reserve the run in the dataset's ledger before it trains and finalize it after
    (docs/audits.md); False only for public rows. ``positive_control``: also score the same run's sums before the noise — refused on a user's
    corpus (not private). ``watch``: loop hooks and the progress line (:class:`Watch`).
    ``epsilon_upper_bound`` is the accountant's ε of the GRADIENT release
    (σ, q, T) at δ_T: with ``training.dp_diagnostics`` the ledger's ε_T is larger, so comparing
    with the gradient's ε is the stricter test."""
    from dpbert.evaluate.whitebox import AuditSettings, whitebox_audit
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
    if rows.private and public_n is None:
        raise ConfigError(f"training.{'dataset_patients' if patient_unit else 'dataset_size'} is not set: an audit "
                          "on a user's corpus needs a public n (its charged q = B/n would reveal the exact count)")
    units = len(set(rows.patient_keys)) if patient_unit else int(rows.token_ids.shape[0])
    plan = plan_for_config(config, int(public_n) if public_n is not None else units)
    token_ids, keys = _first_units(rows, plan.dataset_size, patient_unit)
    mc = config.model
    minilm = mc.init == "minilm"
    log.info("audit: %d gradient canaries, %d steps, q = %.4g, σ = %s, unit %s, trainable %s (the configured loop)",
             canaries, plan.steps, plan.sampling_probability, tc.noise_multiplier, config.privacy.unit,
             ",".join(tc.trainable))
    reservation = _reserve(config, plan, int(token_ids.shape[0]), charge, rows.private)
    settings = AuditSettings(canaries=int(canaries), beta=beta, seed=seed, public=not rows.private,
                             positive_control=positive_control)
    report = whitebox_audit(token_ids, rows.specials, rows.vocab_size, mc, tc, settings=settings, plan=plan,
                            patient_keys=keys if patient_unit else None,
                            hooks=tuple(watch.hooks), mask_token_id=rows.specials.mask,
                            vocab_tokens=rows.vocab_tokens if minilm else None,
                            public_checkpoint_dir=mc.init_dir if minilm else None, progress=watch.progress)
    if reservation is not None:
        from dpbert.accounting.target import finalize_event

        finalize_event(reservation, [report["dp_event"]])
    report.update(charged=reservation is not None, ledger_entry=None if reservation is None else str(reservation),
                  release=OPERATOR_ONLY if rows.private else PUBLIC_ROWS, vocabulary=vocabulary)
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
                 "guesses", "correct", "probe_variable", "canary_dims", "audited_unit", "max_contributions",
                 "positive_control_ratio", "sigma_upper_bound", "epsilon_lower_bound_snj",
                 "weakest_detected_noise_factor")


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
                            seed=seed, charge=False, vocabulary="the run's DP vocabulary")
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
