"""Choose DP-SGD's learning rate and clip norm for a planned run on a public proxy: no ε spent.

The rule (TAN, Sander et al. 2023): the planned run takes T steps at an expected batch of B units
with noise multiplier σ; its update is (Σ clipped unit gradients + N(0, σ²C²·I)) / B, so the noise
on the mean gradient has standard deviation σ·C/B per coordinate. The proxy trains at a small batch
b with σ_b = σ·b/B (:func:`proxy_noise_multiplier`): its noise on the mean is σ_b·C/b = σ·C/B, the
same, and T stays. Every (lr, C) of the grid trains on the proxy with the shipped loop
(``dpbert.engine.build.build_training``: the run's model, trainable set, schedule, unit and
sampling; run-time integrity checks and DP diagnostics off, a fixed public noise seed so that every
grid point sees the same batches and noise) and is scored by its held-out proxy MLM loss
(``dpbert.evaluate.mlm_loss``, the same masks for every point). The choice: the lowest loss (ties:
the grid's order).

Inputs: the plan (public numbers: :func:`plan_of` reads the configuration's public n and never a
corpus), the model and training configurations, and the proxy (``dpbert.tuning.proxy``). Nothing
here opens a path the configuration names (tests/tuning/test_tune.py audits every read).

The result (:class:`TuningResult`) holds the choice, every row and the provenance; :func:`write_tuned`
stores it (any ``dpbert.storage`` URI), :func:`tuned_overrides` turns a stored file into the
``--set`` overrides of ``dpbert run --tuned FILE``. docs/training.md ("Choosing the learning rate
and clip norm without spending ε").
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import math
import secrets
from typing import List, Optional, Sequence, Tuple

from dpbert import schema, storage
from dpbert.config import ConfigError
from dpbert.tuning.proxy import PROXY_SEED, Proxy

#: The ``"schema"`` of a stored tuning result.
SCHEMA = "dpbert.tuning/1"
#: Learning rates: AdamW normalises each coordinate's step, so lr is the step size in weight units
#: whatever C is; half-decades around the shipped values (1e-3 default, 3e-3 tests, 1e-2 demo).
LEARNING_RATES = (1e-3, 3e-3, 1e-2)
#: Clip norms: under AdamW a C below every unit's gradient norm clips all units and scales signal
#: and noise alike (the update does not change with C); C matters where it crosses the norms'
#: spread, so decades span "all clipped" to "few clipped".
CLIP_NORMS = (0.1, 1.0, 10.0)
#: The proxy's batch when none is given (at most the planned B).
PROXY_BATCH = 32


class AllDiverged(ValueError):
    """Every grid point's held-out proxy loss was not finite: the grid needs smaller learning rates."""


@dataclasses.dataclass(frozen=True)
class TuningPlan:
    """The planned run's public numbers: ε_T at δ (None: not computed), B, T, σ, the unit, k and
    the sampling mode."""

    epsilon_train: Optional[float]
    delta: float
    batch_size: int
    steps: int
    noise_multiplier: float
    unit: str = "tuple"
    max_contributions: int = 1
    sampling: str = "poisson"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Grid:
    learning_rates: Tuple[float, ...] = LEARNING_RATES
    clip_norms: Tuple[float, ...] = CLIP_NORMS

    def __post_init__(self):
        for name, values in (("learning rates", self.learning_rates), ("clip norms", self.clip_norms)):
            if not values or any(not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0) for v in values):
                raise ConfigError(f"the grid's {name} must be finite numbers > 0, got {list(values)}")

    def points(self) -> List[Tuple[float, float]]:
        return [(float(lr), float(c)) for lr in self.learning_rates for c in self.clip_norms]


@dataclasses.dataclass
class TuningResult:
    """``choice`` {learning_rate, clip_norm}; ``rows``: one per grid point, in the grid's order;
    ``provenance``: what chose it (proxy, seed, b, σ_b, T, grid, the plan)."""

    choice: dict
    rows: List[dict]
    provenance: dict

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "choice": self.choice, "rows": self.rows, "provenance": self.provenance}


def proxy_noise_multiplier(noise_multiplier: float, batch_size: int, proxy_batch: int) -> float:
    """σ_b = σ·b/B: the proxy's noise on the mean gradient, σ_b·C/b, equals the run's σ·C/B."""
    if not 1 <= int(proxy_batch) <= int(batch_size):
        raise ConfigError(f"the proxy batch b must be in [1, B = {batch_size}], got {proxy_batch}")
    return float(noise_multiplier) * int(proxy_batch) / int(batch_size)


def plan_of(config, accountant: str = "pld") -> TuningPlan:
    """The plan of ``config`` over its PUBLIC n (``training.dataset_size``, or
    ``training.dataset_patients`` for the patient unit): ConfigError without one — the tuner never
    counts a corpus. ε_T: the training's ε at ``training.delta`` (diagnostics composed), from the
    accounting package."""
    from dpbert.accounting.accountant import dpsgd_epsilon
    from dpbert.accounting.sigma import configured_sigma
    from dpbert.privacy.plan import plan_for_config

    tc, unit = config.training, config.privacy.unit
    if tc.non_private:
        raise ConfigError("training.non_private: the tuner chooses DP-SGD's learning rate and clip norm")
    n = tc.dataset_patients if unit == "patient" else tc.dataset_size
    if n is None:
        field = "training.dataset_patients" if unit == "patient" else "training.dataset_size"
        raise ConfigError(f"{field} is not set: the tuner plans from the public n and never counts the corpus")
    plan = plan_for_config(config, n)
    k = plan.max_contributions if unit == "patient" else 1
    epsilon = dpsgd_epsilon(configured_sigma(tc), plan.sampling_probability, plan.steps, tc.delta, tc.sampling,
                            accountant, k, user_level=unit == "patient")
    return TuningPlan(epsilon, tc.delta, tc.batch_size, plan.steps, tc.noise_multiplier, unit, k, tc.sampling)


def _model_start(model_config, training_config, proxy: Proxy):
    """(``ModelStart`` for every grid point, its provenance): random init, or the public start
    (checkpoint + warm-up on the shipped public text) for ``model.init: minilm``, built once."""
    from dpbert.engine.build import ModelStart

    tokenizer, mc = proxy.tokenizer, model_config
    size = tokenizer.get_vocab_size()
    if mc.init != "minilm":
        return ModelStart(mc, size), f"random initialisation (training.seed {training_config.seed})"
    from dpbert.network import init_public
    from dpbert.engine.public_warmup import public_start
    from dpbert.resources.checkpoint import checkpoint_dir

    directory = checkpoint_dir(mc.init_dir)
    tokens = [tokenizer.id_to_token(i) for i in range(size)]
    spec = init_public.spec_for_public(mc, size, training_config.mask_probability, directory)
    weights, _ = public_start(spec, tokenizer, tokens, steps=mc.public_warmup_steps, seed=training_config.seed,
                              checkpoint_dir=directory, batch_size=mc.public_warmup_batch_size,
                              learning_rate=mc.public_warmup_learning_rate,
                              mask_probability=training_config.mask_probability)
    return (ModelStart(mc, size, tokens, directory, weights, new_token_ids=[]),
            f"public start: {directory}, {mc.public_warmup_steps} warm-up steps on the shipped public text")


class Tuner:
    """One grid search: ``run()`` trains every point (``repeats`` noise seeds each) and chooses."""

    def __init__(self, plan: TuningPlan, model_config, training_config, proxy: Proxy, *, grid: Grid = Grid(),
                 proxy_batch: Optional[int] = None, seed: int = PROXY_SEED, repeats: int = 1):
        self.plan, self.model_config, self.training_config, self.proxy = plan, model_config, training_config, proxy
        self.grid, self.seed, self.repeats = grid, int(seed), int(repeats)
        self.b = min(plan.batch_size, PROXY_BATCH) if proxy_batch is None else int(proxy_batch)
        self.sigma_b = proxy_noise_multiplier(plan.noise_multiplier, plan.batch_size, self.b)
        if self.b > proxy.units:
            raise ConfigError(f"the proxy batch b = {self.b} exceeds the proxy's {proxy.units} units")
        if self.repeats < 1:
            raise ConfigError(f"repeats must be >= 1, got {repeats}")
        self._start = None

    def row_config(self, learning_rate: float, clip_norm: float, repeat: int):
        """The training configuration of one proxy run: the run's, at (b, σ_b, lr, C), T steps."""
        p = self.plan
        return dataclasses.replace(
            self.training_config, batch_size=self.b, noise_multiplier=self.sigma_b, learning_rate=learning_rate,
            clip_norm=clip_norm, steps=p.steps, epochs=None, sampling=p.sampling, dataset_size=self.proxy.units,
            dataset_patients=self.proxy.units if p.unit == "patient" else None, replicas=1, accumulation_steps=1,
            workers=1, strategy="default", noise_seed=self.seed + repeat, integrity_check_every=0,
            dp_diagnostics=False, checkpoint_every=p.steps, stats_every=p.steps, export_saved_model=False,
            non_private=False, train_non_private_baseline=False, jit_compile=False)

    def start(self):
        if self._start is None:
            self._start = _model_start(self.model_config, self.training_config, self.proxy)
        return self._start

    def train_row(self, learning_rate: float, clip_norm: float, repeat: int) -> float:
        """The held-out proxy MLM loss after one proxy run with the shipped loop (inf: diverged)."""
        from dpbert.evaluate.mlm_loss import heldout_mlm_loss
        from dpbert.engine.build import ChainOutputs, TrainingRows, build_training
        from dpbert.privacy.plan import plan_training
        from dpbert.vocab.wordpiece import SPECIAL_TOKENS, special_ids

        tc, proxy = self.row_config(learning_rate, clip_norm, repeat), self.proxy
        plan = plan_training(tc, proxy.units, unit=self.plan.unit, max_contributions=self.plan.max_contributions)
        specials = {t: proxy.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
        rows = TrainingRows(proxy.train_rows, specials,
                            patient_keys=proxy.unit_keys if self.plan.unit == "patient" else None)
        out = f"ram://dpbert-tuning/{secrets.token_hex(8)}"
        try:
            with build_training(rows, self.start()[0], tc, ChainOutputs(out, resume=False, export_saved_model=False,
                                                                      progress=False), plan) as training:
                training.loop.run()
                ids = special_ids(proxy.tokenizer)
                loss = heldout_mlm_loss(training.models.mlm, proxy.heldout_rows, tuple(ids), ids.mask,
                                        training.spec.max_predictions, tc.mask_probability, seed=self.seed)
        finally:
            store = storage.storage_for(out)
            if store.exists(out):
                store.rmtree(out)
        return loss if math.isfinite(loss) else math.inf

    def run(self) -> TuningResult:
        rows = []
        for lr, clip in self.grid.points():
            losses = [self.train_row(lr, clip, r) for r in range(self.repeats)]
            rows.append({"learning_rate": lr, "clip_norm": clip, "heldout_loss": sum(losses) / len(losses),
                         "heldout_losses": losses})
        best = min(range(len(rows)), key=lambda i: (rows[i]["heldout_loss"], i))
        if not math.isfinite(rows[best]["heldout_loss"]):
            raise AllDiverged("every grid point diverged on the proxy: add smaller learning rates to the grid")
        choice = {"learning_rate": rows[best]["learning_rate"], "clip_norm": rows[best]["clip_norm"]}
        return TuningResult(choice, rows, self.provenance())

    def provenance(self) -> dict:
        return {
            "rule": "TAN (Sander et al. 2023): sigma_b = sigma * b / B keeps the noise on the mean gradient "
                    "sigma * C / B; T kept",
            "plan": self.plan.to_dict(), "proxy": self.proxy.provenance(), "proxy_batch": self.b,
            "proxy_noise_multiplier": self.sigma_b, "steps": self.plan.steps, "seed": self.seed,
            "repeats": self.repeats, "start": self.start()[1],
            "grid": {"learning_rates": list(self.grid.learning_rates), "clip_norms": list(self.grid.clip_norms)},
            "score": f"held-out proxy MLM loss (nats), masks of the public seed {self.seed}",
            "loop": "dpbert.engine.build.build_training (integrity checks and DP diagnostics off)",
            "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }


def tune(config, source: str = "synthetic", *, grid: Grid = Grid(), proxy_batch: Optional[int] = None,
         seed: int = PROXY_SEED, repeats: int = 1, patients: Optional[int] = None,
         accountant: str = "pld", tuner: type = Tuner) -> TuningResult:
    """Tune ``config``'s learning rate and clip norm on the ``source`` proxy (module docstring).
    ``tuner``: the class that runs the grid (tests pass a deliberately broken one)."""
    from dpbert.tuning import proxy as proxy_lib

    plan = plan_of(config, accountant)
    sizes = {} if patients is None else {"patients": patients, "heldout_patients": max(1, patients // 5)}
    spec = proxy_lib.spec_for(config, source, seed, **sizes)
    return tuner(plan, config.model, config.training, proxy_lib.build_proxy(spec), grid=grid,
                 proxy_batch=proxy_batch, seed=seed, repeats=repeats).run()


def write_tuned(result: TuningResult, uri) -> str:
    """Store ``result`` as strict JSON at ``uri`` (any ``dpbert.storage`` URI); returns ``uri``."""
    storage.write_text(str(uri), schema.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n")
    return str(uri)


def read_tuned(uri) -> Tuple[dict, str]:
    """(the stored tuning result at ``uri``, checked; its text's sha256): ValueError naming the
    file and the key."""
    text = storage.read_text(str(uri))
    try:
        doc = schema.loads(text)
    except ValueError as err:
        raise ValueError(f"{uri}: not a tuning result ({err})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{uri}: not a tuning result (\"schema\" must be {SCHEMA!r})")
    choice = doc.get("choice")
    for key in ("learning_rate", "clip_norm"):
        value = choice.get(key) if isinstance(choice, dict) else None
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0):
            raise ValueError(f"{uri}: choice.{key} must be a finite number > 0, got {value!r}")
    if not isinstance(doc.get("provenance"), dict):
        raise ValueError(f"{uri}: no provenance")
    return doc, hashlib.sha256(text.encode("utf-8")).hexdigest()


def provenance_line(doc: dict, uri, text_sha256: str) -> str:
    """One line naming the tuning file and what chose its values (``training.tuned_from``)."""
    p = doc["provenance"]
    plan = p.get("plan", {})
    return (f"{uri} (sha256 {text_sha256[:16]}); {p.get('proxy', {}).get('source')} proxy, seed {p.get('seed')}, "
            f"b={p.get('proxy_batch')}, sigma_b={p.get('proxy_noise_multiplier')}, T={p.get('steps')}, grid "
            f"{len(p.get('grid', {}).get('learning_rates', []))}x{len(p.get('grid', {}).get('clip_norms', []))}; "
            f"for B={plan.get('batch_size')}, sigma={plan.get('noise_multiplier')}, "
            f"epsilon_T={plan.get('epsilon_train')}")


def tuned_overrides(uri, fields: Sequence[str] = ()) -> List[str]:
    """The ``--set`` overrides of the stored tuning result at ``uri``: the learning rate and clip
    norm, and ``training.tuned_from`` (its provenance line) when ``fields`` (the training
    configuration's field names) has it."""
    doc, digest = read_tuned(uri)
    out = [f"training.learning_rate={doc['choice']['learning_rate']!r}",
           f"training.clip_norm={doc['choice']['clip_norm']!r}"]
    if "tuned_from" in fields:
        line = provenance_line(doc, uri, digest)
        out.append(f"training.tuned_from={schema.dumps(line)}")
    return out
