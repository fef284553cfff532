"""The dpbert DAG: one ``create_pipeline(config, ...)`` factory used by every runner."""
from __future__ import annotations

import dataclasses
import os
from typing import List, Optional

from tfx import v1 as tfx

from dpbert.config import Config, MembershipConfig, section_to_json
from pipeline.code_version import component_code_version


def _core_version(module: str) -> str:
    """The ``code_version`` of a component: a hash of the first-party files ``module`` imports."""
    return component_code_version(module)


def fingerprint_state_root(pipeline_root: str) -> str:
    """Where the corpus fingerprint's salt lives: the trainers' private state root
    (``dpbert.stages.pretrain.STATE_ROOT``, marked operator-only), never an artifact's directory."""
    from dpbert.stages.pretrain import STATE_ROOT

    return os.path.join(pipeline_root, STATE_ROOT)


def _ledger_target(config: Config, with_plan: bool = True) -> str:
    from dpbert.accounting.target import ledger_target_json

    return ledger_target_json(config, with_plan)


def ingest_component(config: Config, pipeline_root: Optional[str] = None):
    """The DAG's first component, CorpusIngest, for ``config``.

    With ``pipeline_root`` (the local runner), ``corpus_fingerprint`` is the KEYED fingerprint of
    the corpus (``dpbert.data.fingerprint``, computed here, its salt in the private state under
    ``pipeline_root``): in TFX's cache key as ExampleGen's input fingerprint is, so a corpus
    changed in place is re-read and everything downstream re-runs; an unchanged one stays cached.
    It lives in the local ML Metadata store's execution record, never on an artifact. Without
    ``pipeline_root`` (a compiled Kubeflow / Vertex AI spec) no fingerprint is passed: a spec is
    read by whoever can see the PipelineJob, and ``kubeflow.runner`` turns CorpusIngest's cache
    off instead.
    """
    from components.ingest import CorpusIngest

    fingerprint = {}
    if pipeline_root is not None:
        from dpbert.data.fingerprint import corpus_fingerprint, load_or_create_salt

        salt = load_or_create_salt(fingerprint_state_root(pipeline_root))
        fingerprint["corpus_fingerprint"] = corpus_fingerprint(config.corpus, salt)
    return CorpusIngest(
        corpus_config=section_to_json(config.corpus),
        tuple_words=config.privacy.tuple_words,
        # The ingest re-checks every record before it writes (a patient id on each under the patient unit).
        privacy_unit=config.privacy.unit,
        code_version=_core_version("components.ingest"),
        **fingerprint,
    )


def create_components(config: Config, pipeline_root: Optional[str] = None) -> List:
    """The components of the DAG, in order, wired by their artifacts (``pipeline_root``: see
    ``ingest_component``)."""
    from components.accountant import PrivacyAccountant
    from components.canary import CanaryExposure, CanaryGen
    from dpbert.stages.canary import canary_rows
    from components.membership import MembershipInference
    from components.ner import NerEvaluator
    from components.trainer import MLMPretrainer
    from components.vocabulary import DPVocabularyGen

    ingest = ingest_component(config, pipeline_root)
    tuples = ingest.outputs["tuples"]
    privatizer = None
    if config.local_privacy.enabled:
        # dχ-privacy of every token with a PUBLIC embedding table (components/privatizer.py):
        # the vocabulary, the canaries and the trainers read the privatized tuples.
        from components.privatizer import TextPrivatizer

        privatizer = TextPrivatizer(
            tuples=tuples,
            local_privacy_config=section_to_json(config.local_privacy),
            code_version=_core_version("components.privatizer"),
        )
        tuples = privatizer.outputs["privatized_tuples"]
    vocabulary = DPVocabularyGen(
        tuples=tuples,
        vocab_config=section_to_json(config.vocab),
        privacy_config=section_to_json(config.privacy),
        # Where the public checkpoint is (vocab.source public / public+dp).
        model_config=section_to_json(config.model, ("init", "init_dir")),
        # The dataset's privacy ledger, without the training's planned records (its cache must not
        # depend on the training's configuration: dpbert.accounting.target.ledger_target_json).
        ledger_target=_ledger_target(config, with_plan=False),
        code_version=_core_version("components.vocabulary"),
    )
    trainer_args = dict(
        tuples=tuples,
        vocabulary=vocabulary.outputs["vocabulary"],
        model_config=section_to_json(config.model),
        training_config=section_to_json(config.training),
        privacy_config=section_to_json(config.privacy),
        # Only the patient split: the evaluation's seed and sample count must not re-train.
        membership_config=section_to_json(config.membership, MembershipConfig.HOLDOUT_FIELDS),
        ledger_target=_ledger_target(config),  # the dataset's privacy ledger (dpbert.ledger)
        code_version=_core_version("components.trainer"),
    )
    if pipeline_root is not None:  # the local DAG; a compiled spec gets it from kubeflow.runner
        trainer_args["pipeline_root"] = str(pipeline_root)
    canaries = None
    if config.canary.enabled:
        canaries = CanaryGen(
            tuples=tuples,
            vocabulary=vocabulary.outputs["vocabulary"],
            canary_config=section_to_json(config.canary),
            training_config=section_to_json(config.training),
            code_version=_core_version("components.canary"),
            public_rows=canary_rows(config) or 0,
        )
        trainer_args["canaries"] = canaries.outputs["canaries"]
    trainer = MLMPretrainer(**trainer_args).with_id("MLMPretrainer")
    accountant = PrivacyAccountant(
        vocabulary=vocabulary.outputs["vocabulary"],
        model=trainer.outputs["model"],
        privacy_config=section_to_json(config.privacy),
        training_delta=config.training.delta,
        code_version=_core_version("components.accountant"),
        ledger_target=_ledger_target(config),  # the dataset's budget gate decides within budget
    )
    components = [ingest] + ([privatizer] if privatizer else []) + [vocabulary] + \
        ([canaries] if canaries else []) + [trainer, accountant]
    baseline = None
    if config.training.train_non_private_baseline and not config.training.non_private:
        # The same data without clipping or noise (ε = ∞): a private comparison artifact.
        baseline = MLMPretrainer(**trainer_args, non_private=1).with_id("MLMPretrainerNonPrivate")
        components.append(baseline)
    baseline_input = {"baseline_model": baseline.outputs["model"]} if baseline else {}
    if canaries is not None:
        components.append(CanaryExposure(
            canaries=canaries.outputs["canaries"],
            model=trainer.outputs["model"],
            privacy_report=accountant.outputs["report"],
            audit_beta=config.canary.audit_beta,
            code_version=_core_version("components.canary"),
            **baseline_input,
        ))
    if config.audit.enabled and not config.training.non_private:
        # The configured DP-SGD re-run on the embedded PUBLIC corpus with m gradient canaries
        # (dpbert.stages.audit): its bound is released next to the accountant's ε.
        from components.audit import PrivacyAuditor

        components.append(PrivacyAuditor(
            vocabulary=vocabulary.outputs["vocabulary"],
            privacy_report=accountant.outputs["report"],
            model_config=section_to_json(config.model),
            training_config=section_to_json(config.training),
            privacy_config=section_to_json(config.privacy),
            membership_config=section_to_json(config.membership, MembershipConfig.HOLDOUT_FIELDS),
            public_corpus_config=section_to_json(dataclasses.replace(config.corpus, path=None, format=None)),
            audit_config=section_to_json(config.audit),
            code_version=_core_version("components.audit"),
        ))
    if config.membership.holdout_patient_fraction > 0:
        # Members: the trained-on patients' tuples; non-members: the held-out patients'.
        components.append(MembershipInference(
            tuples=ingest.outputs["tuples"],
            model=trainer.outputs["model"],
            membership_config=section_to_json(config.membership),
            code_version=_core_version("components.membership"),
            **baseline_input,
        ))
    if config.ner.enabled:
        components.append(NerEvaluator(
            model=trainer.outputs["model"],
            ner_config=section_to_json(config.ner),
            tuple_words=config.privacy.tuple_words,
            # The utility table's public row: the trainer's public start (model.init, public
            # layers, warm-up) with the training seed and masking.
            model_config=section_to_json(config.model),
            training_config=section_to_json(config.training, ("seed", "mask_probability")),
            code_version=_core_version("components.ner"),
            **baseline_input,
        ))
    return components


def create_pipeline(config: Config, pipeline_root: str, metadata_path: Optional[str] = None,
                    beam_pipeline_args: Optional[List[str]] = None,
                    fingerprint_corpus: Optional[bool] = None) -> tfx.dsl.Pipeline:
    """Build the DAG for ``config``.

    ``metadata_path``: a local sqlite ML Metadata store (None for Kubeflow/Vertex, which bring
    their own). ``beam_pipeline_args`` default to ``config.beam.pipeline_args()``.
    ``fingerprint_corpus``: pass CorpusIngest the keyed corpus fingerprint (``ingest_component``);
    default: with a local store only (a compiled spec carries none).
    """
    if fingerprint_corpus is None:
        fingerprint_corpus = metadata_path is not None
    metadata = (tfx.orchestration.metadata.sqlite_metadata_connection_config(metadata_path)
                if metadata_path else None)
    return tfx.dsl.Pipeline(
        pipeline_name=config.pipeline.name,
        pipeline_root=pipeline_root,
        components=create_components(config, pipeline_root if fingerprint_corpus else None),
        enable_cache=config.pipeline.enable_cache,
        metadata_connection_config=metadata,
        beam_pipeline_args=beam_pipeline_args if beam_pipeline_args is not None else config.beam.pipeline_args(),
    )


