"""MLMPretrainer: DP-SGD (or, explicitly, non-private) BERT masked-LM pre-training.

A thin adapter over ``dpbert.model.train.train_mlm``. What it adds is where state lives:

* the checkpoints and the write-ahead DP step ledger go to a *stable* directory keyed by the
  inputs and the configuration (``<pipeline_root>/_trainer_state/<key>``), not to the
  execution's output URI, so a re-run after a crash or preemption resumes from the last
  checkpoint and the ledger keeps counting every step ever executed on the private data;
* the artifact records the DP event built from the steps actually taken
  (``steps_taken_total``), which the accountant recomputes ε from.
"""
import hashlib
import json
import logging
import os
import shutil
from typing import Optional

from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component

from components.artifacts import CanaryList, DPVocabulary, PretrainedModel, WordTuples
from components.common import get_property, section_from_json, set_properties
from dpbert.config import ModelConfig, PrivacyConfig, TrainingConfig

log = logging.getLogger("dpbert.trainer")


def _state_dir(model_uri: str, key_material: str) -> str:
    # model_uri = <pipeline_root>/<node id>/model/<execution id>
    root = os.path.dirname(os.path.dirname(os.path.dirname(model_uri)))
    key = hashlib.sha256(key_material.encode()).hexdigest()[:20]
    return os.path.join(root, "_trainer_state", key)


def _loss_curve(losses, points: int = 200):
    if len(losses) <= points:
        return [round(float(x), 5) for x in losses]
    stride = len(losses) / points
    return [round(float(losses[int(i * stride)]), 5) for i in range(points)] + [round(float(losses[-1]), 5)]


@component
def MLMPretrainer(
    tuples: InputArtifact[WordTuples],
    vocabulary: InputArtifact[DPVocabulary],
    model: OutputArtifact[PretrainedModel],
    model_config: Parameter[str],
    training_config: Parameter[str],
    privacy_config: Parameter[str],
    code_version: Parameter[str],
    non_private: Parameter[int] = 0,
    canaries: InputArtifact[CanaryList] = None,
):
    """Tokenize the tuples with the DP vocabulary and pre-train; one tuple = one example."""
    from dpbert.data.tfrecord import read_tuples
    from dpbert.evaluate.membership import patient_key, split_patients
    from dpbert.model.train import train_mlm
    from dpbert.privacy import events
    from dpbert.vocab.wordpiece import SPECIAL_TOKENS, load_tokenizer, tokenize_tuples

    mc = section_from_json(ModelConfig, model_config)
    tc = section_from_json(TrainingConfig, training_config)
    pc = section_from_json(PrivacyConfig, privacy_config)
    if non_private:
        tc.non_private = True
    if pc.unit == "patient" and not tc.non_private:
        # The accountant would charge k-fold group privacy, but nothing here caps the examples
        # per patient at k: refuse rather than report an ε that does not hold.
        raise ValueError("privacy.unit = patient is supported by the vocabulary stage only; "
                         "DP-SGD pre-training needs privacy.unit = tuple")

    tokenizer = load_tokenizer(vocabulary.uri)
    train_patients = None
    if tc.holdout_patient_fraction > 0:
        # Hold patients out for membership inference (components/membership.py recomputes the same
        # split from the properties recorded below). First pass: the patient keys only.
        train_patients = split_patients([patient_key(t) for t in read_tuples(tuples.uri)],
                                        train_fraction=1.0 - tc.holdout_patient_fraction,
                                        seed=tc.holdout_seed).train
    token_ids = tokenize_tuples(tokenizer, (t.words for t in read_tuples(tuples.uri)
                                            if train_patients is None or patient_key(t) in train_patients),
                                mc.max_seq_length)
    if token_ids.shape[0] == 0:
        raise ValueError("no training tuple left after holding patients out")
    canary_counts = None
    if canaries is not None:
        from components.canary import apply_canaries

        # Canaries are public-by-construction test data; they enlarge n but not the planned q.
        token_ids, canary_counts = apply_canaries(token_ids, canaries.uri, mc.max_seq_length)
    n = int(token_ids.shape[0])
    # With held-out patients too, q stays planned from every tuple (what the budget guard planned).
    n_planned = tc.dataset_size or int(get_property(tuples, "num_tuples", n))
    q = min(1.0, tc.batch_size / n_planned)
    specials = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    log.info("trainer: %d examples of %d tokens, vocabulary %d, %s", n, mc.max_seq_length,
             tokenizer.get_vocab_size(), "NON-PRIVATE baseline" if tc.non_private else
             f"DP-SGD σ = {tc.noise_multiplier}, C = {tc.clip_norm}, q = {q:.4g}")

    state = _state_dir(model.uri, json.dumps([tuples.uri, vocabulary.uri, model_config, training_config,
                                              privacy_config, int(non_private),
                                              canaries.uri if canaries is not None else None]))
    vocab_tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())] \
        if mc.init == "minilm" else None
    # Fault injection for the resume test (tests/e2e/test_resume.py): crash after that many steps.
    crash_after = os.environ.get("DPBERT_TEST_CRASH_AFTER_STEPS")
    result = train_mlm(token_ids, specials, tokenizer.get_vocab_size(), mc, tc, state,
                       sampling_probability=q if tc.sampling == "poisson" else None, resume=True,
                       progress=True, vocab_tokens=vocab_tokens,
                       stop_after_steps=int(crash_after) if crash_after else None)
    # The artifact holds a copy; the state directory keeps the ledger for later resumes.
    shutil.copytree(os.path.join(state, "model"), os.path.join(model.uri, "model"), dirs_exist_ok=True)
    for name in ("train_result.json", "dp_ledger.json", "run_config.json"):
        if os.path.exists(os.path.join(state, name)):
            shutil.copy(os.path.join(state, name), os.path.join(model.uri, name))
    if os.path.isdir(os.path.join(state, "tensorboard")):
        shutil.copytree(os.path.join(state, "tensorboard"), os.path.join(model.uri, "tensorboard"),
                        dirs_exist_ok=True)
    tokenizer_dir = os.path.join(model.uri, "tokenizer")
    os.makedirs(tokenizer_dir, exist_ok=True)
    for name in ("vocab.txt", "tokenizer.json"):
        shutil.copy(os.path.join(vocabulary.uri, name), tokenizer_dir)

    if tc.non_private:
        record = events.non_private_event("train")
        epsilon = float("inf")
    else:
        # Charged for every step executed on private data, resumed runs and lost steps included.
        # The noise multiplier actually applied to the logical batch (σ; σ√(P·T) only in the
        # paper-compatible noise mode, which the trainer reports as effective).
        sigma = result.effective_noise_multiplier
        record = events.dpsgd_event(sigma, tc.batch_size,
                                    events.accounted_dataset_size(tc.sampling, n_planned, n),
                                    result.steps_taken_total, tc.sampling)
        from dpbert.privacy.accountant import dpsgd_epsilon

        epsilon = dpsgd_epsilon(sigma, record["sampling_probability"], result.steps_taken_total,
                                tc.delta, tc.sampling)
    if canary_counts is not None:
        with open(os.path.join(model.uri, "canary_counts.json"), "w", encoding="utf-8") as f:
            json.dump(canary_counts, f)
    with open(os.path.join(model.uri, "dp_events.json"), "w", encoding="utf-8") as f:
        f.write(events.to_json([record]))
    losses = list(result.losses)
    set_properties(model, {
        "non_private": tc.non_private,
        # The baseline is trained without privacy on private data: never to be released.
        "private": int(tc.non_private),
        "noise_multiplier": 0.0 if tc.non_private else tc.noise_multiplier,
        "effective_noise_multiplier": result.effective_noise_multiplier,
        "clip_norm": tc.clip_norm,
        "sampling_mode": tc.sampling,
        "sampling_rate": record.get("sampling_probability", q),
        "logical_batch": tc.batch_size,
        "replicas": result.replicas,
        "accumulation_steps": result.accumulation,
        "steps_taken_total": result.steps_taken_total,
        "steps_this_run": result.steps_this_run,
        "resumed_from_step": result.resumed_from_step,
        "steps_planned": result.steps_planned,
        "dataset_size": n,
        "planned_dataset_size": n_planned,
        "delta": tc.delta,
        "epsilon_train": epsilon,
        "dp_events": events.to_json([record]),
        "final_mlm_loss": result.final_mlm_loss,
        "final_mlm_accuracy": result.final_mlm_accuracy,
        "initial_mlm_loss": float(sum(losses[:5]) / max(1, len(losses[:5]))) if losses else None,
        "loss_curve": _loss_curve(losses),
        "clipped_fraction": result.clipped_fraction,
        "clipping_path": result.clipping_path,
        "holdout_patient_fraction": tc.holdout_patient_fraction if train_patients is not None else None,
        "holdout_seed": tc.holdout_seed if train_patients is not None else None,
        "model_preset": mc.preset,
        "max_seq_length": mc.max_seq_length,
        "code_version": code_version,
    })
    log.info("trainer: %d steps in total (%d this run), final MLM loss %.4f", result.steps_taken_total,
             result.steps_this_run, result.final_mlm_loss)
