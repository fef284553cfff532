r"""The white-box one-run audit of DP-SGD (issue 15): its training harness, next to the other
evaluators. The canaries, the scores and the power are ``dpbert.privacy.whitebox_audit`` (module
docstring there); the ε lower bound ``dpbert.privacy.one_run_audit``.

What runs
---------
REAL DP-SGD steps: ``dpbert.model.dpsgd.DPSGDTrainStep`` (ghost clipping, the one noise draw, the
division by the public B, AdamW) on the MLM functions of ``dpbert.model.train``, on token rows
Poisson-sampled with the run's q (``sampling.PoissonSampler``, masks keyed by (key, step, row id),
rounds packed by ``train.mlm_rounds``). The stepper gets an ``AuditProbe``: on d' flat coordinates
of one trainable variable the auditor adds, at every step t, the sum of the canaries sampled in
that step to the all-reduced CLIPPED SUM (before the single noise draw N(0, σ²C²) and the
division by B) and reads back the noisy sum g̃_t on those coordinates (before the optimizer).

Which variable: the largest trainable variable (ties: the first; for the MLM that is the word
embedding table, V × H). Any variable is a valid audit (a canary of norm C is a valid clipped
gradient wherever it lies, so the accountant's guarantee covers it); the largest keeps the real
clipped sum's share on the probe small (≤ (B·C)²/d' per step after normalisation, spread over
dense canaries). d' = the largest power of two ≤ min(size of that variable, ``canary_dims`` =
16384), on random coordinates; m ≤ d'.

What it can and cannot detect
-----------------------------
* It tests the released noisy sums g̃_t against the claimed (σ, q, T). Measured on the tiny
  model (tests/privacy/test_whitebox_audit.py; q = 0.1, T = 60, δ = 1e-5, 95 %; orthogonal
  canaries, white-box grid): noise off (``noise_scale = 0``) at a claimed ε = 2.76 with
  m = 2000 → lower bound 4.96 (detected; reachable 5.50); noise too small by 3 (a √(P·T)
  normalisation bug at P·T = 9) at a claimed ε = 1.07 with m = 10⁴ → 1.50 (detected); the
  honest runs → 0.80–0.94 at ε = 2.76 (m = 2000) and 0.37 at ε = 1.07 (m = 10⁴). Honest ratios
  lower / claimed at ε_T ≈ 2, 4, 8: 0.14–0.21 at m = 10³, 0.26–0.32 at m = 10⁴
  (``benchmarks/audit_power.py``). On the demo configuration (450 steps, q = 64/1400): honest
  1.81, noise-off control 5.51 against the accountant's 4.97 (README).
* It cannot see a factor-2 noise bug at ε ≈ 1 (measured: 0.94 < 1.07 at m = 10⁴; the direct
  noise-std check ``dpbert.model.noise_check`` is the test for small factors), nor any violation
  above ``max_reachable_lower_bound`` (≈ 5.5 whatever m): a one-run audit only refutes claims
  below that, and an honest run's bound is far from tight.
* It audits the gradient canary neighbour: add/remove one clipped gradient of norm C under the
  step code's accumulation, all-reduce and single noise draw, Poisson-sampled with q, for T
  steps. It does NOT audit the division by B (g̃_t is read before it; a wrong divisor scales
  signal and noise alike and costs no privacy), the trainer's ledger step count, the
  per-example clipping of real examples (a bug that lets a real example's gradient exceed C is
  invisible to canaries that are inserted already clipped), nor the data pipeline, the masks,
  or anything released outside the gradients (vocabulary: ``vocab_audit``; DP diagnostics: the
  loss/accuracy sums are not observed; σ here is the GRADIENT's σ — with DP diagnostics the
  ledger charges a smaller σ_eff, whose ε is larger, so this audit's comparison is the stricter
  one).
* Privacy of the audit itself: the audit is a second DP-SGD run on the rows it is given; its
  outputs are post-processing of that run (ε_upper_bound). ``noise_scale != 1`` is NOT private:
  positive controls belong on public data (the embedded synthetic corpus, the default).

``noise_scale`` (fault injection for positive controls only): the noise actually applied is
``noise_scale · noise_multiplier`` while scores, the accountant and the report use the claimed
σ. ``noise_scale = 0`` runs with σ = ``NOISE_OFF`` (1e-12): ``DPSGDConfig`` refuses σ = 0 for a
private run, and 1e-12·C is far below float32 resolution of the sums.
"""
from __future__ import annotations

import functools
import math
import secrets
import time
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from dpbert.privacy import one_run_audit as one_run
from dpbert.privacy.whitebox_audit import (canary_projections, canary_sums, llr_scores,
                                           max_reachable_lower_bound, probe_dims, whitebox_k_grid)

__all__ = [
    "NOISE_OFF", "DEFAULT_CANARY_DIMS", "demo_token_rows", "demo_spec", "choose_variable",
    "whitebox_audit", "whitebox_audit_report",
]

#: σ used for ``noise_scale = 0`` (DPSGDConfig refuses 0 for a private run).
NOISE_OFF = 1e-12
DEFAULT_CANARY_DIMS = 16384
SPECIAL_IDS = (0, 1, 2, 3, 4)  # [PAD] [UNK] [CLS] [SEP] [MASK] (dpbert.vocab.wordpiece order)
MASK_ID = 4


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
    from dpbert.model import bert as bert_lib

    return bert_lib.BertSpec(
        vocab_size=int(vocab_size), hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
        intermediate_size=intermediate_size, max_seq_length=int(max_seq_length),
        max_predictions=bert_lib.max_predictions_for(int(max_seq_length), mask_probability),
        dropout=0.0, attention_dropout=0.0)


def choose_variable(variables: Sequence) -> int:
    """Index of the largest trainable variable (first among ties); see the module docstring."""
    sizes = [int(np.prod(v.shape)) for v in variables]
    if not sizes:
        raise ValueError("the model has no trainable variable")
    return int(np.argmax(sizes))


# ----------------------------------------------------------------------------- the audit
def whitebox_audit(token_ids: Optional[np.ndarray] = None, spec=None, *, training_config=None,
                   batch_size: int = 16, steps: int = 60, noise_multiplier: float = 1.0,
                   clip_norm: float = 1.0, delta: float = 1e-5, dataset_size: Optional[int] = None,
                   learning_rate: float = 1e-3, warmup_steps: int = 0, accumulation_steps: int = 1,
                   canaries: int = 1000, beta: float = 0.05, canary_dims: int = DEFAULT_CANARY_DIMS,
                   variable_index: Optional[int] = None, noise_scale: float = 1.0,
                   special_token_ids: Sequence[int] = SPECIAL_IDS, mask_token_id: int = MASK_ID,
                   strategy=None, seed: Optional[int] = None, candidates=None,
                   holdout_fraction: float = 0.0, positive_control: bool = False,
                   return_arrays: bool = False) -> Dict[str, object]:
    """Run the white-box one-run audit (module docstring) and return its result.

    Args:
      token_ids: int ``[n, L]`` rows (pad 0); default ``demo_token_rows()``.
      spec: ``BertSpec``; default ``demo_spec(vocab, L)``.
      training_config: a ``dpbert.config.TrainingConfig`` (Poisson sampling): its batch size,
        steps, σ (the CLAIMED σ), C, δ, P, T, dataset_size, learning rate are used and the
        keyword arguments below are ignored (except an explicit ``dataset_size``, which overrides
        the configuration's); default: built from them.
      batch_size, steps, noise_multiplier (σ claimed), clip_norm (C), delta, dataset_size (the
        public n that fixes q = B/n, default the number of rows), learning_rate, warmup_steps,
        accumulation_steps: the run audited (``privacy.plan.plan_training``).
      canaries: m. beta: 1 − confidence. canary_dims: d' cap. variable_index: probe variable
        (default: the largest, ``choose_variable``).
      noise_scale: fault injection (tests / positive control only): noise applied =
        noise_scale · σ claimed (0: noise off).
      seed: fixes everything (noise, sampling, masks, canaries, inclusion); None = OS entropy.
      candidates: the pre-declared (k₊, k₋) grid; default ``whitebox_k_grid(m)``.
      holdout_fraction: the membership holdout of the audited run (its plan trains on
        n·(1 − f) rows, so q = B/(n·(1 − f)); ``privacy.plan.plan_training``).
      positive_control: also score the SAME run's sums read before the noise draw
        (``AuditProbe.observed_noiseless``: the release of a DP-SGD whose noise is off, on this
        run's trajectory) with the same canaries, claimed σ, grid and δ, and return
        ``positive_control_lower_bound`` (and its correct/guesses): one training run for both.
      return_arrays: also return the arrays ``scores`` [m], ``included`` [m], ``observed``
        [T, d'] (the noisy sums g̃_t read from the probe), ``canary_sums`` [T, d'] and
        ``batch_sizes`` [T] (real rows sampled per step).

    Returns a dict: epsilon_lower_bound, epsilon_upper_bound (accountant, same σ/q/T/δ),
    max_reachable_lower_bound, consistent (lower ≤ upper), canaries, confidence, beta, delta,
    steps, q, expected_batch_size, dataset_size, sigma_claimed, noise_multiplier_applied,
    noise_scale, clip_norm, canary_dims, probe_variable, probe_variable_size, k_plus, k_minus,
    guesses (r), correct (v), accuracy, canaries_included, canary_participations (mean steps an
    included canary was sampled), seconds {train, canaries, score, bound, total}.
    """
    from dpbert.model import bert as bert_lib
    from dpbert.model import dpsgd, sampling
    from dpbert.model import train as train_lib
    from dpbert.privacy.accountant import dpsgd_epsilon
    from dpbert.privacy.plan import plan_training

    t_start = time.perf_counter()
    if token_ids is None:
        token_ids, vocab = demo_token_rows()
        spec = spec or demo_spec(vocab, token_ids.shape[1])
    token_ids = np.asarray(token_ids)
    if token_ids.ndim != 2 or not np.issubdtype(token_ids.dtype, np.integer) or token_ids.shape[0] < 1:
        raise ValueError(f"token_ids must be a non-empty integer array [n, L], got {token_ids.shape}")
    if spec is None:
        spec = demo_spec(int(token_ids.max()) + 1, token_ids.shape[1])
    n, length = token_ids.shape
    if length < spec.max_seq_length:
        token_ids = np.pad(token_ids, [(0, 0), (0, spec.max_seq_length - length)])
    elif length > spec.max_seq_length:
        raise ValueError(f"rows of length {length} exceed the model's max_seq_length {spec.max_seq_length}")
    token_ids = token_ids.astype(np.int32)
    m = int(canaries)
    if m < 2:
        raise ValueError(f"canaries must be >= 2, got {canaries}")
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    if not (noise_scale >= 0 and math.isfinite(noise_scale)):
        raise ValueError(f"noise_scale must be finite and >= 0, got {noise_scale}")

    if training_config is None:
        from dpbert.config import TrainingConfig

        tc = TrainingConfig(batch_size=batch_size, steps=steps, noise_multiplier=noise_multiplier,
                            clip_norm=clip_norm, delta=delta, dataset_size=dataset_size,
                            learning_rate=learning_rate, warmup_steps=warmup_steps,
                            accumulation_steps=accumulation_steps, sampling="poisson")
    else:
        tc = training_config
    if tc.sampling != "poisson" or tc.non_private:
        raise ValueError("the white-box audit audits Poisson-sampled DP-SGD (training.sampling = poisson, "
                         "not non_private): canaries are Poisson-sampled with the run's q")
    # An explicit dataset_size (the public n of the audited unit: patients for a per-patient claim)
    # overrides the configuration's tuple count.
    public_n = dataset_size if dataset_size is not None else tc.dataset_size
    plan = plan_training(tc, public_n if public_n is not None else n, holdout_fraction)
    q, T, B = plan.sampling_probability, plan.steps, plan.expected_batch_size
    sigma, C, delta = float(tc.noise_multiplier), float(tc.clip_norm), float(tc.delta)
    applied = noise_scale * sigma if noise_scale > 0 else NOISE_OFF

    root = np.random.SeedSequence(seed if seed is not None else secrets.randbits(128))
    seeds = [int(s.generate_state(1, np.uint64)[0]) >> 2 for s in root.spawn(7)]
    noise_seed, sample_seed, mask_key, canary_key, inclusion_seed, choice_seed, participation_seed = seeds

    # The run: the real step code, a probe on d' coordinates of one variable.
    models = bert_lib.build_bert(spec, seed=int(tc.seed))
    variables = models.mlm.trainable_variables
    index = choose_variable(variables) if variable_index is None else int(variable_index)
    size = int(np.prod(variables[index].shape))
    dims = probe_dims(size, canary_dims)
    if m > dims:
        raise ValueError(f"canaries ({m}) must be <= the probe's d' = {dims} (orthogonal canaries): raise "
                         f"canary_dims (a power of two up to the variable's size {size}) or use fewer")
    coords = np.sort(np.random.default_rng(choice_seed).choice(size, size=dims, replace=False))
    probe = dpsgd.AuditProbe(variable_index=index, coordinates=coords)
    config = dpsgd.DPSGDConfig(clip_norm=C, noise_multiplier=applied, expected_batch_size=B,
                               noise_seed=noise_seed, replicas=plan.replicas,
                               accumulation_steps=plan.accumulation_steps)
    optimizer = train_lib.make_optimizer(tc, T)
    specials = sorted(set(int(s) for s in special_token_ids) | {int(mask_token_id), 0})
    mask_fn, prepare_fn, loss_fn, metrics_fn = train_lib.make_mlm_functions(
        spec, specials, int(mask_token_id), tc.mask_probability)
    stepper = dpsgd.DPSGDTrainStep(models.mlm, optimizer, config, prepare_fn=prepare_fn, loss_fn=loss_fn,
                                   metrics_fn=metrics_fn, strategy=strategy, audit_probe=probe)

    # Canaries: inclusion (½), then Poisson participation with q at every step when included.
    t0 = time.perf_counter()
    included = one_run.draw_inclusion(m, np.random.default_rng(inclusion_seed))
    participation = (np.random.default_rng(participation_seed).random((T, m)) < q) & included[None, :]
    sums = canary_sums(canary_key, participation, dims, C)
    t_canaries = time.perf_counter() - t0

    t0 = time.perf_counter()
    sampler = sampling.PoissonSampler(n, q, seed=sample_seed)
    example_ids = np.arange(n, dtype=np.int64)
    observed = np.empty((T, dims), np.float32)
    noiseless = np.empty((T, dims), np.float32) if positive_control else None
    batch_sizes = np.empty(T, np.int64)
    for step in range(T):
        indices = sampler.sample(step)
        batch_sizes[step] = indices.size
        rounds = train_lib.mlm_rounds(mask_fn, token_ids, example_ids, indices, mask_key, step,
                                      plan.micro_batch, plan.replicas)
        stepper.run_step(rounds, canary_sum=sums[step])
        observed[step] = stepper.observed.numpy()
        if noiseless is not None:
            noiseless[step] = stepper.observed_noiseless.numpy()
    t_train = time.perf_counter() - t0

    t0 = time.perf_counter()
    scores = llr_scores(canary_projections(canary_key, observed, m, C), q, sigma)
    t_score = time.perf_counter() - t0

    t0 = time.perf_counter()
    grid = whitebox_k_grid(m) if candidates is None else [tuple(c) for c in candidates]
    result = one_run.audit_best_of(scores, included, grid, beta=beta, delta=delta)
    reachable = max_reachable_lower_bound(m, beta, delta, grid)
    upper = float(dpsgd_epsilon(sigma, q, T, delta))
    t_bound = time.perf_counter() - t0

    lower = float(result["epsilon_lower_bound"])
    out: Dict[str, object] = {
        "epsilon_lower_bound": lower,
        "epsilon_upper_bound": upper,
        "max_reachable_lower_bound": float(reachable),
        "consistent": bool(lower <= upper + 1e-9),
        "canaries": m,
        "confidence": 1.0 - float(beta),
        "beta": float(beta),
        "delta": delta,
        "steps": int(T),
        "q": float(q),
        "expected_batch_size": float(B),
        "dataset_size": int(plan.dataset_size),
        "sigma_claimed": sigma,
        "noise_multiplier_applied": float(applied),
        "noise_scale": float(noise_scale),
        "clip_norm": C,
        "canary_dims": int(dims),
        "probe_variable": variables[index].name,
        "probe_variable_size": size,
        "k_plus": int(result["k_plus"]),
        "k_minus": int(result["k_minus"]),
        "guesses": int(result["r"]),
        "correct": int(result["v"]),
        "accuracy": float(result["accuracy"]),
        "canaries_included": int(included.sum()),
        "canary_participations": float(participation.sum() / max(1, included.sum())),
        "seconds": {"train": t_train, "canaries": t_canaries, "score": t_score, "bound": t_bound,
                    "total": time.perf_counter() - t_start},
    }
    if noiseless is not None:
        t0 = time.perf_counter()
        control_scores = llr_scores(canary_projections(canary_key, noiseless, m, C), q, sigma)
        control = one_run.audit_best_of(control_scores, included, grid, beta=beta, delta=delta)
        out["positive_control_lower_bound"] = float(control["epsilon_lower_bound"])
        out["positive_control_correct"] = int(control["v"])
        out["positive_control_guesses"] = int(control["r"])
        out["positive_control_exceeds_upper_bound"] = bool(control["epsilon_lower_bound"] > upper)
        out["seconds"]["positive_control"] = time.perf_counter() - t0
        out["seconds"]["total"] = time.perf_counter() - t_start
    if return_arrays:
        out.update(scores=scores, included=included, observed=observed, canary_sums=sums,
                   batch_sizes=batch_sizes, participation=participation)
        if noiseless is not None:
            out.update(noiseless=noiseless, control_scores=control_scores)
    return out


def whitebox_audit_report(**kwargs) -> Dict[str, object]:
    """The honest audit plus its positive control, for the CLI and the DAG component:
    ``whitebox_audit(positive_control=True, **kwargs)`` — ONE training run; the control scores
    the same run's sums read before the noise draw (noise off, on this trajectory) with the same
    canaries, claimed σ, grid and δ. The control's release is not private: it belongs to public
    rows (the default and the DAG component's input) or to the operator."""
    kwargs = dict(kwargs)
    kwargs.pop("return_arrays", None)
    if kwargs.pop("noise_scale", 1.0) != 1.0:
        raise ValueError("whitebox_audit_report audits the honest run; noise_scale is not accepted")
    kwargs["positive_control"] = True
    return whitebox_audit(**kwargs)
