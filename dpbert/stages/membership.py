"""MembershipInference's stage: membership-inference attacks on the pre-trained model(s)
(Jagannatha et al. 2021; ``dpbert.evaluate.membership``).

Members are the tuples of the patients the trainer trained on, non-members those of the patients
it held out. The trainer holds each patient out independently (keyed PRF, ``dpbert.data.splits``)
when ``membership.holdout_patient_fraction > 0`` and records ``holdout_patient_fraction`` and the
key's fingerprint ``holdout_key_id`` on the model artifact; this stage recomputes the SAME split
from the fraction and the secret key kept in the private WordTuples artifact. A model
trained on every patient has no non-member to test against: :func:`holdout_of` refuses it rather
than report attacks on a split that does not exist. The DP model and the non-private baseline
must carry the same split.

Samples: at most ``membership.max_samples`` tuples, half members, half non-members, taken patient
by patient (``membership.seed``), each class's quota spread over at least ten patients when it
has that many; their MLM masks are drawn from the same seed, identically for every model.

Output: properties ``attacks`` = ``{"dp": {attack: {"advantage", "auc"}}, "non_dp": {...}}`` (the
second only with a baseline), ``roc_curves`` (the same curves as the file, at most 50 points each,
for the report and the dashboard), and ``roc_curves.json`` in the report directory:
``{"dp": {attack: {"advantage", "auc", "n", "roc": {"fpr", "tpr"}}}, ...}`` with at most 200
points per curve. Neither holds a sample id, a patient id or any text. They are statistics of the
private evaluation data that are NOT differentially private (as every attack result is); the
report is not marked private, like the exposure report.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from typing import Dict, Optional

from dpbert import schema, storage
from dpbert.config import MembershipConfig
from dpbert.stages.result import StageResult

log = logging.getLogger("dpbert.membership")

ROC_FILE = "roc_curves.json"
PROPERTY_ROC_POINTS = 50
MIN_PATIENTS_PER_CLASS = 10
HOLDOUT_KEY_ID = "holdout_key_id"


class NoHoldoutError(ValueError):
    """The model was trained on every patient: there is no non-member to attack with."""


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    """A PretrainedModel as this stage needs it: its directory and the properties it carries."""

    uri: str
    holdout_patient_fraction: Optional[float]
    holdout_key_id: Optional[str]
    non_private: bool


def holdout_of(model: TrainedModel) -> Dict[str, float]:
    """``{"fraction", "key_id"}`` recorded on a model; NoHoldoutError if none."""
    fraction, key_id = model.holdout_patient_fraction, model.holdout_key_id
    if fraction is None or float(fraction) <= 0 or not key_id:
        raise NoHoldoutError(
            f"the model {model.uri} was trained on every patient (no {schema.HOLDOUT_FRACTION} recorded): "
            "membership inference needs out-of-training patients; set membership.holdout_patient_fraction "
            "(e.g. 0.3) and re-train")
    return {"fraction": float(fraction), "key_id": str(key_id)}


def _mask_probability(model_dir: str) -> float:
    run_config = storage.read_json(storage.join(model_dir, schema.RUN_CONFIG_FILE), default=None)
    if run_config is not None:
        return float(run_config.get("mask_probability", 0.15))
    return 0.15


def evaluate_models(tuples_dir: str, model_dirs: Dict[str, str], holdout_fraction: float, holdout_key_id: str,
                    seed: int = 0, max_samples: int = 2000) -> Dict:
    """The attacks for each ``{label: PretrainedModel directory}`` (``model/`` and ``tokenizer/``
    in it) on the same samples and masks. Returns ``{"results": {label: run_attacks(...)},
    "n_members": int, "n_non_members": int}``."""
    import numpy as np

    from dpbert.data.splits import admission_key, patient_key, read_holdout_key, split_patients
    from dpbert.data.tfrecord import read_tuples
    from dpbert.evaluate import membership
    from dpbert.network.bert import load_bert
    from dpbert.vocab.wordpiece import SPECIAL_TOKENS, load_tokenizer, tokenize_tuples

    # Pass 1: keys only (the corpus may not fit in memory as text).
    patients, admissions = [], []
    for t in read_tuples(tuples_dir):
        patients.append(patient_key(t))
        admissions.append(admission_key(t))
    split = split_patients(patients, 1.0 - holdout_fraction, read_holdout_key(tuples_dir))
    if split.key_id != holdout_key_id:
        raise ValueError("the tuples' holdout key is not the one the model was trained with "
                         "(a different ingestion?): the membership split cannot be recomputed")
    is_member = split.is_train(patients)
    # Each class's quota spread over >= MIN_PATIENTS_PER_CLASS patients when it has them: the
    # white-box attacks split by patient and need several on each side.
    chosen = membership.select_samples(patients, is_member, max_samples, seed,
                                       min_patients=MIN_PATIENTS_PER_CLASS)
    # Pass 2: the chosen tuples' words, in file order (the order of pass 1).
    wanted = set(int(i) for i in chosen)
    words = [t.words for i, t in enumerate(read_tuples(tuples_dir)) if i in wanted]
    if len(words) != len(chosen):
        raise RuntimeError("the tuples changed between two reads")
    sample_patients = [patients[i] for i in chosen]
    sample_admissions = [admissions[i] for i in chosen]
    sample_members = is_member[chosen]
    log.info("membership: member and non-member samples drawn (holdout fraction %.3g)", holdout_fraction)

    results = {}
    for label, uri in model_dirs.items():
        tokenizer = load_tokenizer(storage.join(uri, schema.TOKENIZER_DIR))
        models = load_bert(storage.join(uri, schema.MODEL_DIR))
        token_ids = tokenize_tuples(tokenizer, words, models.spec.max_seq_length)
        specials = [tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS]
        results[label] = membership.run_attacks(
            models, token_ids, sample_patients, sample_admissions, np.asarray(sample_members), seed,
            settings=membership.AttackSettings(special_token_ids=specials,
                                               mask_token_id=tokenizer.token_to_id("[MASK]"),
                                               mask_probability=_mask_probability(uri)))
        log.info("membership[%s]: %s", label, {a: (r["advantage"], r["auc"]) for a, r in results[label].items()})
    return {"results": results, "n_members": int(sample_members.sum()),
            "n_non_members": int((~sample_members).sum())}


def _coarse(results: Dict, points: int) -> Dict:
    """The ROC curves downsampled to ``points`` (rounded) for a property."""
    from dpbert.evaluate.membership import downsample_curve

    out = {}
    for label, attacks in results.items():
        out[label] = {}
        for name, r in attacks.items():
            fpr, tpr = r["roc"]["fpr"], r["roc"]["tpr"]
            if fpr and all(v is not None for v in tpr):
                fpr, tpr = downsample_curve(fpr, tpr, points)
                fpr, tpr = [round(float(v), 4) for v in fpr], [round(float(v), 4) for v in tpr]
            out[label][name] = {"fpr": list(fpr), "tpr": list(tpr)}
    return out


def membership_inference(tuples_dir: str, report_dir: str, model: TrainedModel, config: MembershipConfig,
                         baseline: Optional[TrainedModel] = None) -> StageResult:
    """S-BBA, A-BBA, P-BBA, S-AWBA, S-GWBA on the DP model (and the non-private baseline), on the
    split recorded on the model; ``config``: the evaluation's ``seed`` and ``max_samples``."""
    holdout = holdout_of(model)
    # "dp" is the DP model; a non-private main model (training.non_private) is reported as "non_dp".
    model_dirs = {"non_dp" if model.non_private else "dp": model.uri}
    if baseline is not None:
        if holdout_of(baseline) != holdout:
            raise ValueError("the DP model and the non-private baseline were trained on different patient "
                             "splits; their attacks would not be comparable")
        if "non_dp" in model_dirs or not baseline.non_private:
            raise ValueError("baseline_model must be the non-private baseline of a DP model")
        model_dirs["non_dp"] = baseline.uri
    out = evaluate_models(tuples_dir, model_dirs, holdout["fraction"], holdout["key_id"], config.seed,
                          config.max_samples)
    results = out["results"]
    storage.storage_for(report_dir).makedirs(report_dir)
    storage.write_text(storage.join(report_dir, ROC_FILE), json.dumps(results, indent=1, sort_keys=True))
    return StageResult(properties={
        "attacks": {label: {name: {"advantage": r["advantage"], "auc": r["auc"]} for name, r in attacks.items()}
                    for label, attacks in results.items()},
        "roc_curves": _coarse(results, PROPERTY_ROC_POINTS),
        "roc_file": ROC_FILE,
        "n_members": out["n_members"],
        "n_non_members": out["n_non_members"],
        schema.HOLDOUT_FRACTION: holdout["fraction"],
        HOLDOUT_KEY_ID: holdout["key_id"],
        "seed": int(config.seed),
        "max_samples": int(config.max_samples),
        # Attack scores on private rows, exact member counts: operator-only (not DP).
        schema.PRIVATE: 1,
    })
