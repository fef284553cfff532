r"""The white-box one-run audit of DP-SGD: its training harness, next to the other evaluators. The
canaries, the scores and the power are ``dpbert.privacy.whitebox_audit``; the ε lower bound is
the f-DP one-run test of the claimed DP-SGD curve (``dpbert.privacy.fdp_audit``; ``estimator``),
with SNJ's ``dpbert.privacy.one_run_audit`` next to it (``*_snj``). The report says what the
audit can refute: ``max_reachable_lower_bound`` (every guess right),
``weakest_detected_noise_factor`` and ``detects`` (the weakest noise break it is expected to
catch), ``cannot_detect``.

Contract: ``whitebox_audit`` runs the SHIPPED training loop (``build_training`` with the run's
configuration) with canaries enrolled as units of the run's own sampler (each of norm exactly C,
on an EMPTY row: one unit, no double count) and an ``AuditProbe`` on one trained piece, and
reports how it differs from ``dpbert run`` (``differs``). An audit on PRIVATE rows is a DP
release charged as the run's training record (``origin: audit``); the noiseless positive control
is refused unless the rows are public. What runs, what differs and what it can and cannot
detect: docs/audits.md ("The audit's harness in detail").
"""
from __future__ import annotations

import dataclasses
import functools
import math
import secrets
import time
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from dpbert.engine.hooks import Hook
from dpbert.privacy import one_run_audit as one_run
from dpbert.privacy.whitebox_audit import (canary_projections, canary_sums, fdp_sigma_bound, llr_scores,
                                           max_reachable_lower_bound, probe_dims,
                                           weakest_detected_noise_factor, whitebox_k_grid)

__all__ = [
    "DEFAULT_CANARY_DIMS", "demo_token_rows", "demo_spec", "choose_piece", "canary_rows",
    "CanarySampler", "ProbeHook", "AuditSettings", "whitebox_audit", "AUDIT_RELEASE_NOTE",
]

DEFAULT_CANARY_DIMS = 16384
SPECIAL_IDS = (0, 1, 2, 3, 4)  # [PAD] [UNK] [CLS] [SEP] [MASK] (dpbert.vocab.wordpiece order)
MASK_ID = 4
#: What the report says about its own privacy (docs/audits.md).
AUDIT_RELEASE_NOTE = ("an audit on private rows is a DP release: the audited run is DP-SGD on them, charged as "
                      "dp_event; the positive control (sums before the noise) is refused on them")


# ----------------------------------------------------------------------------- default data
@functools.lru_cache(maxsize=4)
def _demo_rows(max_seq_length: int, vocab_size: int, patients: int, seed: int) -> Tuple[np.ndarray, int]:
    import collections

    from dpbert.data import synthetic, tuples
    from dpbert.vocab import wordpiece

    docs = list(synthetic.generate_notes(patients=patients, seed=seed))
    word_tuples = list(tuples.corpus_tuples(docs, max_seq_length - 2))
    # Public synthetic text: the exact histogram is fine here (no private data).
    histogram = collections.Counter(w for t in word_tuples for w in set(t.words))
    tokenizer = wordpiece.train_wordpiece(histogram.items(), vocab_size=vocab_size)
    ids = wordpiece.tokenize_tuples(tokenizer, word_tuples, max_seq_length)
    ids.setflags(write=False)
    return ids, int(tokenizer.get_vocab_size())


def demo_token_rows(max_seq_length: int = 16, vocab_size: int = 1024, patients: int = 40,
                    seed: int = 1234) -> Tuple[np.ndarray, int]:
    """``(token_ids int32 [n, L], vocab_size)``: the embedded synthetic corpus
    (``dpbert.data.synthetic``) cut into tuples of L − 2 words and tokenized by a WordPiece learnt
    from its own (public) word histogram. 40 patients, L = 16: 3471 rows, 1024 tokens, < 1 s."""
    ids, vocab = _demo_rows(int(max_seq_length), int(vocab_size), int(patients), int(seed))
    return ids.copy(), vocab


def demo_spec(vocab_size: int, max_seq_length: int = 16, hidden_size: int = 16, num_layers: int = 1,
              num_heads: int = 2, intermediate_size: int = 32, mask_probability: float = 0.15):
    """A tiny BERT (no dropout) for audits and positive controls: V = 1024, H = 16 gives a
    16384-entry word embedding table, the probe variable."""
    from dpbert.network import bert as bert_lib

    return bert_lib.BertSpec(
        vocab_size=int(vocab_size), hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
        intermediate_size=intermediate_size, max_seq_length=int(max_seq_length),
        max_predictions=bert_lib.max_predictions_for(int(max_seq_length), mask_probability),
        dropout=0.0, attention_dropout=0.0)


# ----------------------------------------------------------------------------- the parts
def choose_piece(pieces: Sequence) -> int:
    """Index of the largest trained piece (first among ties); see docs/audits.md."""
    sizes = [int(np.prod(p.shape)) for p in pieces]
    if not sizes:
        raise ValueError("nothing is trained (training.trainable selects no variable)")
    return int(np.argmax(sizes))


def canary_rows(count: int, length: int) -> np.ndarray:
    """``count`` EMPTY rows ([PAD] only): no token to mask, loss 0, clipped gradient exactly 0, so
    an enrolled canary unit contributes its injected vector and nothing else (docs/audits.md)."""
    return np.zeros((int(count), int(length)), np.int32)


@dataclasses.dataclass
class Canaries:
    """m canaries of norm Δ on d' coordinates (``whitebox_audit.canary_layout(key, m, d')``);
    ``included`` [m]; ``enrolled``: the included canaries' indices, in the order of their units."""

    key: int
    m: int
    dims: int  # set when the probe's piece is chosen (``_probe_factory``)
    #: Δ, a unit's largest clipped contribution: the mechanism's sensitivity (C, or 1 under
    #: normalized clipping), set from the built step (``_run``) before any canary is summed.
    clip_norm: float
    included: np.ndarray

    @property
    def enrolled(self) -> np.ndarray:
        return np.nonzero(self.included)[0]

    def step_sum(self, participation: np.ndarray) -> np.ndarray:
        return canary_sums(self.key, np.asarray(participation, bool)[None, :], self.dims, self.clip_norm)[0]


class CanarySampler:
    """The run's own sampler (whatever ``build_training`` made) with the canary units enrolled:
    after it draws a step's units it hands the stepper the sum of the drawn canaries' vectors
    (``DPSGDTrainStep.next_canary_sum``, added before the noise draw). ``units``: the source's unit
    index of each enrolled canary. Everything else is the wrapped sampler's."""

    def __init__(self, inner, canaries: Canaries, units: np.ndarray):
        self.inner, self.canaries, self.units = inner, canaries, np.asarray(units, np.int64)
        self.stepper = None
        self.last: Optional[Tuple[int, np.ndarray]] = None

    def __getattr__(self, name):
        return getattr(self.__dict__["inner"], name)

    def participation(self, unit_indices) -> np.ndarray:
        """[m] bool: the canaries whose units are among ``unit_indices``."""
        out = np.zeros(self.canaries.m, bool)
        out[self.canaries.enrolled[np.isin(self.units, np.asarray(unit_indices, np.int64))]] = True
        return out

    def sample(self, step: int):
        indices = self.inner.sample(step)
        part = self.participation(indices)
        self.stepper.next_canary_sum = self.canaries.step_sum(part)
        self.last = (int(step), part)
        return indices


def canary_sampler_factory(canaries: Canaries, first_canary_row: int, made: list):
    """A ``build_training`` sampler factory: the default sampler over real + canary units, wrapped
    (``made`` receives the wrapper). Canary j's unit: its row (tuple unit) or its row's patient."""
    from dpbert.engine.source import default_sampler

    def factory(spec):
        if spec.shard is not None or spec.mode == "shuffle":
            raise ValueError("the white-box audit runs one process with Poisson sampling (training.sampling = "
                             "poisson, one worker): canaries are units of the run's Poisson sampler")
        rows = first_canary_row + np.arange(canaries.enrolled.size)
        if spec.mode == "patient":
            unit_of_row = {int(r[0]): g for g, r in enumerate(spec.groups.members) if r[0] >= first_canary_row}
            units = np.asarray([unit_of_row[int(r)] for r in rows], np.int64)
        else:
            units = rows
        wrapper = CanarySampler(default_sampler(spec), canaries, units)
        made.append(wrapper)
        return wrapper

    return factory


class ProbeHook(Hook):
    """Per step: which canaries took part (from the loop's ``sampled`` units), the noisy sum g̃_t
    read back on the probe (and, for the public positive control only, the sum before the noise),
    the real units drawn. Checks that the injected canary sum is the one of the units that ran."""

    def __init__(self, sampler_box: list, steps: int, m: int, noiseless: bool):
        self.box, self.steps_planned, self.want_noiseless = sampler_box, int(steps), bool(noiseless)
        self.participation = np.zeros((self.steps_planned, int(m)), bool)
        self.real_units = np.zeros(self.steps_planned, np.int64)
        self.observed = self.noiseless = None
        self.steps = 0

    def on_start(self, loop):
        dims = int(np.asarray(loop.stepper.audit_probe.coordinates).size)
        self.observed = np.zeros((self.steps_planned, dims), np.float32)
        self.noiseless = np.zeros((self.steps_planned, dims), np.float32) if self.want_noiseless else None

    def needs_read(self, loop, step):
        return True  # the probe variables hold this step's values only until the next step

    def on_step(self, loop, step, rounds, stats, sampled):
        sampler = self.box[0]
        part = sampler.participation(sampled)
        if sampler.last is None or sampler.last[0] != step - 1 or not np.array_equal(sampler.last[1], part):
            raise RuntimeError("the canary sum injected at this step is not that of the canary units that ran")
        t = step - 1 - loop.start_step
        self.participation[t] = part
        self.real_units[t] = len(sampled) - int(part.sum())
        self.observed[t] = loop.stepper.observed.numpy()
        if self.noiseless is not None:
            self.noiseless[t] = loop.stepper.observed_noiseless.numpy()
        self.steps += 1


def enrol(token_ids: np.ndarray, example_ids, patient_keys, enrolled: int, tag: str):
    """(rows, example ids, patient keys) with ``enrolled`` empty canary rows appended, each its own
    patient (a fresh key no real patient has) under the patient unit."""
    n, length = token_ids.shape
    rows = np.concatenate([np.asarray(token_ids, np.int32), canary_rows(enrolled, length)])
    ids = np.arange(n, dtype=np.int64) if example_ids is None else np.asarray(example_ids, np.int64)
    ids = np.concatenate([ids, (ids.max() if n else 0) + 1 + np.arange(enrolled, dtype=np.int64)])
    keys = None
    if patient_keys is not None:
        keys = [str(k) for k in patient_keys] + [f"audit-canary:{tag}:{j}" for j in range(enrolled)]
        if len(set(keys[n:]) & set(keys[:n])):
            raise ValueError("a canary patient key collides with a real patient's")
    return rows, ids, keys


def _probe_factory(canaries: Canaries, canary_dims: int, rng: np.random.Generator, info: dict):
    """``NoiseSpec(audit_probe=)``: the probe on d' random coordinates of the largest trained piece."""
    from dpbert.mechanism import step as step_lib

    def factory(selection):
        index = choose_piece(selection.pieces)
        piece = selection.pieces[index]
        dims = probe_dims(int(piece.size), canary_dims)
        if canaries.m > dims:
            raise ValueError(f"canaries ({canaries.m}) must be <= the probe's d' = {dims} (orthogonal canaries) on "
                             f"the largest trained piece {piece.name} ({piece.size} coordinates): use fewer")
        canaries.dims = dims
        info.update(probe_variable=piece.name, probe_piece_index=index, probe_variable_size=int(piece.size),
                    canary_dims=dims, trainable=list(selection.names),
                    trained_parameters=int(selection.size))
        coords = np.sort(rng.choice(int(piece.size), size=dims, replace=False)).astype(np.int64)
        return step_lib.AuditProbe(variable_index=index, coordinates=coords)

    return factory


def _dp_event(training, rows: int) -> dict:
    """The audited run's DP-SGD record (what a ledger charges for an audit on private rows)."""
    from dpbert.engine.charges import training_record

    record = training_record(training.accounted_sigma, training.plan, rows, int(training.loop.step_log.count))
    return dict(record, origin="audit")


@dataclasses.dataclass(frozen=True)
class _Harness:
    """The configured run the audit trains, as ``build_training`` takes it for the real run: the
    model start (``model_config``, ``vocab_size``), the special ids, the training configuration and
    plan, extra loop hooks and the rest of ``build_training``'s keywords (``whitebox_audit``'s)."""
    model_config: Any
    vocab_size: int
    special_token_ids: Any
    training: Any
    plan: Any
    hooks: tuple
    build_kwargs: Mapping[str, Any]


def _run(harness: _Harness, enrolled: tuple, first_canary_row: int, canaries: Canaries, settings: "AuditSettings",
         rng: np.random.Generator):
    """Build the configured loop on the ``enrolled`` (rows, example ids, patient keys) with the
    canaries and the probe, run it; (hook, info, event)."""
    from dpbert import storage
    from dpbert.engine.build import (ChainOutputs, ModelStart, NoiseSpec, RunHooks, TrainingRows,
                                           build_training)

    rows, ids, keys = enrolled
    plan, build_kwargs = harness.plan, dict(harness.build_kwargs)
    box: list = []
    info: dict = {}
    probe = ProbeHook(box, plan.steps, canaries.m, settings.positive_control)
    output_dir = build_kwargs.pop("output_dir", None) or f"ram://dpbert-whitebox-audit/{secrets.token_hex(8)}"
    outputs = ChainOutputs(output_dir, resume=False, export_saved_model=False,
                           progress=build_kwargs.pop("progress", True))
    strategy = build_kwargs.pop("strategy", None)
    train_rows = TrainingRows(rows, harness.special_token_ids, build_kwargs.pop("mask_token_id", None), ids, keys)
    start = ModelStart(harness.model_config, harness.vocab_size, **build_kwargs)  # the model's start keywords only
    try:
        with build_training(train_rows, start, harness.training, outputs, plan,
                            NoiseSpec(audit_probe=_probe_factory(canaries, settings.canary_dims, rng, info)),
                            RunHooks([probe] + list(harness.hooks),
                                     canary_sampler_factory(canaries, first_canary_row, box)),
                            strategy) as training:
            box[0].stepper = training.stepper
            canaries.clip_norm = float(training.stepper.mechanism.sensitivity)  # Δ, as the mechanism clips
            training.loop.run()
            info.update(noise_multiplier_applied=float(training.stepper.config.effective_noise_multiplier),
                        steps_executed=int(training.loop.step_log.count), clipping_path=training.stepper.clipping_path,
                        integrity_checks_passed=all(r.get("passed") is not False
                                                    for r in training.loop.integrity_results.values()))
            event = _dp_event(training, first_canary_row)
    finally:
        if str(output_dir).startswith("ram://"):
            store = storage.storage_for(output_dir)
            if store.exists(output_dir):
                store.rmtree(output_dir)
    return probe, info, event


def _score(canaries: Canaries, observed: np.ndarray, plan, sigma: float, grid, beta: float, delta: float):
    """(scores, result): the f-DP bound (``epsilon_lower_bound``, ``sigma_upper_bound``, the chosen
    guess set) and, for reference, Steinke–Nasr–Jagielski's (``epsilon_lower_bound_snj``)."""
    from dpbert.accounting.accountant import dpsgd_epsilon
    from dpbert.privacy import fdp_audit

    q, steps = plan.sampling_probability, plan.steps
    scores = llr_scores(canary_projections(canaries.key, observed, canaries.m, canaries.clip_norm), q, sigma)
    snj = one_run.audit_best_of(scores, canaries.included, grid, beta=beta, delta=delta)
    sigma_hat, counts = fdp_sigma_bound(scores, canaries.included, grid, beta, q, steps, sigma)
    best = None if sigma_hat is None else fdp_audit.rejecting_set(
        fdp_audit.dpsgd_blow_up_inverse(sigma_hat, q, steps), canaries.m, counts, beta)
    if best is None:  # no evidence: report the most accurate guess set
        best = max(range(len(counts)), key=lambda j: counts[j][1] / max(1, counts[j][0]))
    lower = 0.0 if sigma_hat is None else float(dpsgd_epsilon(sigma_hat, q, steps, delta))
    return scores, dict(epsilon_lower_bound=lower, sigma_upper_bound=sigma_hat, r=counts[best][0],
                        v=counts[best][1], k_plus=grid[best][0], k_minus=grid[best][1],
                        accuracy=counts[best][1] / counts[best][0] if counts[best][0] else float("nan"),
                        epsilon_lower_bound_snj=float(snj["epsilon_lower_bound"]))


def _power(m: int, plan, sigma: float, beta: float, grid, delta: float, upper: float) -> dict:
    """What the audit can refute at these (m, q, T, σ, guesses): the f-DP bound with every guess
    right, and the weakest noise break it is expected to detect (ideal scores, no cross-talk)."""
    from dpbert.accounting.accountant import dpsgd_epsilon

    q, steps = plan.sampling_probability, plan.steps
    from dpbert.privacy.fdp_audit import dpsgd_sigma_bound

    perfect = [(kp + km, kp + km) for kp, km in grid]
    sigma_all_right = dpsgd_sigma_bound(m, perfect, beta, q, steps, sigma)
    factor = weakest_detected_noise_factor(m, q, steps, sigma, beta, grid)
    return dict(
        max_reachable_lower_bound=0.0 if sigma_all_right is None else float(dpsgd_epsilon(sigma_all_right, q, steps,
                                                                                            delta)),
        max_reachable_lower_bound_snj=float(max_reachable_lower_bound(m, beta, delta, grid)),
        weakest_detected_noise_factor=factor,
        detects=(f"noise σ × {factor:g} (or less) on the audited piece would be detected: the expected f-DP bound "
                 f"exceeds ε = {upper:.3f} (median of 5 simulated ideal runs)") if factor is not None else
                "no noise reduction down to σ × 0.0 is expected to be detected at these (m, q, T, σ)",
        cannot_detect=CANNOT_DETECT)


#: The bound ``epsilon_lower_bound`` reports (docs/audits.md).
ESTIMATOR = ("f-DP one-run audit (Mahloujifar, Melis & Chaudhuri 2025) of the claimed DP-SGD trade-off curve "
             "(σ, q, T): ε of the weakest rejected noise multiplier, Bonferroni over the pre-declared guesses")
#: What the white-box audit cannot see (docs/audits.md).
CANNOT_DETECT = (
    "noise between the detectable factor and the claimed σ",
    "per-unit clipping of real rows and their patient grouping (canaries enter already of norm C)",
    "the division by B, the masks, frozen pieces and trained pieces other than the audited one",
    "the DP diagnostics and the vocabulary (not observed)",
)


# ----------------------------------------------------------------------------- the audit
@dataclasses.dataclass(frozen=True)
class AuditSettings:
    """The audit's own choices (docs/audits.md).

    Canaries: ``canaries`` (m), ``canary_dims`` (the cap on d'), ``seed`` (fixes the canaries,
    their inclusion and, unless the configuration has one, ``training.noise_seed``; None: fresh).
    Test: ``beta`` (1 − confidence), ``candidates`` (the pre-declared (k₊, k₋) grid; None:
    ``whitebox_k_grid(m)``). Rows: ``public`` (the embedded corpus); only then is
    ``positive_control`` (score the same run's sums read before the noise) allowed. Report:
    ``report_power`` (the power fields: a few seconds of simulation and bisection),
    ``return_arrays`` (the per-step arrays: private counts)."""
    canaries: int = 1000
    beta: float = 0.05
    canary_dims: int = DEFAULT_CANARY_DIMS
    seed: Optional[int] = None
    candidates: Optional[Sequence[Tuple[int, int]]] = None
    public: bool = False
    positive_control: bool = False
    report_power: bool = True
    return_arrays: bool = False


def _check_inputs(token_ids: np.ndarray, settings: AuditSettings, tc):
    if token_ids.ndim != 2 or not np.issubdtype(token_ids.dtype, np.integer) or token_ids.shape[0] < 1:
        raise ValueError(f"token_ids must be a non-empty integer array [n, L], got {token_ids.shape}")
    if int(settings.canaries) < 2:
        raise ValueError(f"canaries must be >= 2, got {settings.canaries}")
    if not 0 < settings.beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {settings.beta}")
    if tc.sampling != "poisson" or tc.non_private:
        raise ValueError("the white-box audit audits Poisson-sampled DP-SGD (training.sampling = poisson, "
                         "not non_private): canaries are units of the run's Poisson sampler")
    if settings.positive_control and not settings.public:
        raise ValueError("the positive control reads the sums BEFORE the noise: not private, refused on "
                         "non-public rows (run it on the embedded public corpus)")


def _draw_canaries(seed: Optional[int], m: int, tc):
    """(canaries, the probe's choice seed, ``tc`` with ``noise_seed`` fixed by ``seed`` unless it has one)."""
    root = np.random.SeedSequence(seed if seed is not None else secrets.randbits(128))
    canary_key, inclusion_seed, choice_seed, noise_seed = [int(s.generate_state(1, np.uint64)[0]) >> 2
                                                           for s in root.spawn(4)]
    if seed is not None and tc.noise_seed is None:
        tc = dataclasses.replace(tc, noise_seed=noise_seed % (2 ** 31))
    cans = Canaries(canary_key, m, 0, math.nan,  # Δ: the mechanism's sensitivity, set once it is built
                    one_run.draw_inclusion(m, np.random.default_rng(inclusion_seed)))
    return cans, choice_seed, tc


def _report(cans: Canaries, probe: ProbeHook, harness: _Harness, settings: AuditSettings, info: dict, event: dict):
    """(the report's fields but ``seconds``, the per-step arrays when ``settings.return_arrays``)."""
    from dpbert.accounting.accountant import dpsgd_epsilon

    plan, tc, m, beta = harness.plan, harness.training, int(settings.canaries), settings.beta
    q, T, sigma, delta = plan.sampling_probability, plan.steps, float(tc.noise_multiplier), float(tc.delta)
    grid = whitebox_k_grid(m) if settings.candidates is None else [tuple(c) for c in settings.candidates]
    scores, result = _score(cans, probe.observed, plan, sigma, grid, beta, delta)
    upper = float(dpsgd_epsilon(sigma, q, T, delta))
    lower = float(result["epsilon_lower_bound"])
    power = _power(m, plan, sigma, beta, grid, delta, upper) if settings.report_power else {}
    unit, public = plan.unit, settings.public
    included = int(cans.included.sum())
    out: Dict[str, object] = dict(
        epsilon_lower_bound=lower, epsilon_upper_bound=upper, estimator=ESTIMATOR,
        sigma_upper_bound=result["sigma_upper_bound"], epsilon_lower_bound_snj=result["epsilon_lower_bound_snj"],
        **power, consistent=bool(lower <= upper + 1e-9), canaries=m, confidence=1.0 - float(beta), beta=float(beta),
        delta=delta, steps=int(T), q=float(q), expected_batch_size=float(plan.expected_batch_size),
        dataset_size=int(plan.dataset_size), sigma_claimed=sigma, clip_norm=float(tc.clip_norm),
        sensitivity=float(cans.clip_norm), clipping=tc.clipping,
        audited_unit=unit, max_contributions=int(plan.max_contributions) if unit == "patient" else 1,
        canary_units=f"each canary one {unit} of its own (one empty row), Poisson-sampled by the run's sampler at q",
        loop="dpbert.engine.build.build_training → TrainLoop (the trainer's loop)",
        k_plus=int(result["k_plus"]), k_minus=int(result["k_minus"]), guesses=int(result["r"]),
        correct=int(result["v"]), accuracy=float(result["accuracy"]), canaries_included=included,
        canary_participations=float(probe.participation.sum() / max(1, included)),
        dp_event=event, dp_event_chargeable=not public, dp_release=AUDIT_RELEASE_NOTE, public_rows=bool(public),
        **info)
    arrays: Dict[str, object] = {}
    if settings.return_arrays:
        arrays.update(scores=scores, included=cans.included, observed=probe.observed, participation=probe.participation,
                      canary_sums=canary_sums(cans.key, probe.participation, cans.dims, cans.clip_norm),
                      real_units=probe.real_units)
    if settings.positive_control:
        control_scores, control = _score(cans, probe.noiseless, plan, sigma, grid, beta, delta)
        out.update(positive_control="the same run's sums read before the noise draw (noise off)",
                   positive_control_lower_bound=float(control["epsilon_lower_bound"]),
                   positive_control_ratio=float(control["epsilon_lower_bound"]) / upper,
                   positive_control_lower_bound_snj=control["epsilon_lower_bound_snj"],
                   positive_control_correct=int(control["v"]), positive_control_guesses=int(control["r"]),
                   positive_control_exceeds_upper_bound=bool(control["epsilon_lower_bound"] > upper))
        if settings.return_arrays:
            arrays.update(noiseless=probe.noiseless, control_scores=control_scores)
    return out, arrays


def whitebox_audit(token_ids, special_token_ids, vocab_size: int, model_config, training_config, *,
                   settings: AuditSettings = AuditSettings(), plan=None, patient_keys=None, example_ids=None,
                   hooks=(), **build_kwargs) -> Dict[str, object]:
    """Run the white-box one-run audit of the configured training (docs/audits.md).

    ``token_ids`` ``[n, L]``, ``special_token_ids``, ``vocab_size``, ``model_config``,
    ``training_config``, ``plan``, ``patient_keys``, ``example_ids``: as ``build_training`` takes
    them for the real run (``plan``: the run's; default ``plan_training`` over
    ``training.dataset_size`` or n). ``settings``: the canaries, the test, whether the rows are
    public (only then is the positive control allowed) and what the report holds
    (:class:`AuditSettings`). ``hooks``: extra loop hooks; ``build_kwargs``: the rest of
    ``build_training``'s keywords (``vocab_tokens``, ``public_checkpoint_dir``,
    ``initial_weights``, ``new_token_ids``, ``mask_token_id``, ``strategy``, ``progress``,
    ``output_dir``: default a throw-away ``ram://`` chain).

    Returns epsilon_lower_bound (f-DP, ``estimator``), sigma_upper_bound, epsilon_lower_bound_snj,
    epsilon_upper_bound (accountant, gradient σ, same q/T/δ), with ``report_power``
    max_reachable_lower_bound(_snj), weakest_detected_noise_factor, detects, cannot_detect;
    consistent, the audited unit and k, the trainable set, the probe piece, the guesses,
    ``dp_event`` (chargeable — ``dp_event_chargeable`` — unless the rows are public) and
    ``dp_release``, seconds; with ``positive_control`` the ``positive_control_*`` keys; with
    ``return_arrays`` the per-step arrays (private counts)."""
    from dpbert.privacy.plan import plan_training

    t_start = time.perf_counter()
    tc = training_config
    token_ids = np.asarray(token_ids)
    _check_inputs(token_ids, settings, tc)
    n = int(token_ids.shape[0])
    if plan is None:
        plan = plan_training(tc, tc.dataset_size if tc.dataset_size is not None else n)
    cans, choice_seed, tc = _draw_canaries(settings.seed, int(settings.canaries), tc)
    enrolled = enrol(token_ids, example_ids, patient_keys, int(cans.enrolled.size), secrets.token_hex(6))
    harness = _Harness(model_config, vocab_size, special_token_ids, tc, plan, tuple(hooks), dict(build_kwargs))
    t0 = time.perf_counter()
    probe, info, event = _run(harness, enrolled, n, cans, settings, np.random.default_rng(choice_seed))
    t_train = time.perf_counter() - t0
    out, arrays = _report(cans, probe, harness, settings, info, event)
    out["seconds"] = {"train": t_train, "total": time.perf_counter() - t_start}
    out.update(arrays)
    return out
