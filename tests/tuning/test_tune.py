"""The tuner reads nothing private: an audit of every read while it runs, with positive controls.

ONE audit hook (``sys.addaudithook``, which cannot be removed) is installed at import; it acts only
while ``_ARMED`` names private paths. Armed, it fails any ``open`` / directory listing of a private
path, and a guard (:func:`_guard`) fails any ``dpbert.storage`` or ``tf.io.gfile`` read of one
(those can bypass Python's ``open``: ``fake://``, ``ram://``, gs://, TensorFlow's C++ file system).
The private paths: a tmp corpus (``corpus.path``), the pipeline's output folder holding fake derived
artifacts — tuples, the word histogram, the held-out split (``pipeline.output_dir``) — and the same
on ``fake://`` (``privacy.ledger``'s folder). The tuner gets the whole configuration naming them.

Cost: one 2×2 grid of 2-step proxy runs of a 1-layer, 16-wide model training only its MLM head
(``training.trainable [head]``), ε by RDP; the steps run eagerly (tests/model/conftest.py
``eagerly``: the same Python and ops, no trace per grid point), the claim being what is read.
"""
from __future__ import annotations

import math
import os
import sys

import pytest

from dpbert.config import ConfigError, load_config
from dpbert.tuning import proxy as proxy_lib
from dpbert.tuning import tune as tune_lib
from tests.model.conftest import eagerly

_ARMED: dict = {"paths": (), "hits": []}


class PrivateRead(RuntimeError):
    """A private path was read while the tuner ran."""


def _is_private(path) -> bool:
    if isinstance(path, int) or path is None:
        return False
    text = os.fsdecode(os.fspath(path))
    if "://" not in text:
        text = os.path.abspath(text)
    return any(text == p or text.startswith(p.rstrip("/") + "/") for p in _ARMED["paths"])


def _audit(event: str, args) -> None:
    if not _ARMED["paths"] or event not in ("open", "os.listdir", "os.scandir", "glob.glob", "shutil.copyfile"):
        return
    if args and _is_private(args[0]):
        _ARMED["hits"].append(f"{event} {args[0]}")
        raise PrivateRead(f"{event} of a private path: {args[0]}")


sys.addaudithook(_audit)


def _guarded(fn):
    def check(*args, **kwargs):
        for value in args[:2]:
            if isinstance(value, (str, os.PathLike)) and _is_private(value):
                _ARMED["hits"].append(f"{getattr(fn, '__qualname__', fn)} {value}")
                raise PrivateRead(f"storage read of a private path: {value}")
        return fn(*args, **kwargs)
    return check


@pytest.fixture
def _guard(monkeypatch):
    """Arm the hook and the storage guard; yields a function that arms it on the given paths."""
    import tensorflow as tf

    from dpbert.storage.fake import FakeStorage
    from dpbert.storage.gfile import GFileStorage
    from dpbert.storage.local import LocalStorage

    for cls in (FakeStorage, GFileStorage, LocalStorage):
        for name in ("read", "read_bytes", "exists", "isdir", "listdir", "glob", "copytree", "generation"):
            monkeypatch.setattr(cls, name, _guarded(getattr(cls, name)))
    for name in ("GFile", "exists", "isdir", "listdir", "glob", "walk"):
        monkeypatch.setattr(tf.io.gfile, name, _guarded(getattr(tf.io.gfile, name)))
    monkeypatch.setattr(tf.data, "TFRecordDataset", _guarded(tf.data.TFRecordDataset))

    def arm(paths):
        _ARMED["paths"], _ARMED["hits"] = tuple(paths), []
    yield arm
    _ARMED["paths"] = ()


@pytest.fixture
def private(tmp_path):
    """A configuration naming a private corpus and artifacts derived from it (local and fake://)."""
    from dpbert import storage

    corpus = tmp_path / "private" / "notes.jsonl"
    corpus.parent.mkdir()
    corpus.write_text('{"text": "patient 4711 admitted with secret diagnosis", "patient_id": "p1"}\n')
    out = tmp_path / "private" / "run"
    derived = {"tuples": out / "tuples" / "part-0.jsonl", "histogram": out / "vocab" / "histogram.json",
               "heldout": out / "split" / "heldout.json"}
    for path in derived.values():
        path.parent.mkdir(parents=True)
        path.write_text('{"words": ["patient", "4711", "secret"]}\n')
    remote = "fake://private-run"
    storage.write_text(f"{remote}/tuples/part-0.jsonl", '{"words": ["patient", "4711"]}\n')
    storage.write_json(f"{remote}/vocab/histogram.json", {"secret": 3.5})
    config = load_config(None, [
        f"corpus.path={corpus}", f"pipeline.output_dir={out}", f"privacy.ledger={remote}/ledger",
        "model.preset=custom", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
        "model.intermediate_size=32", "model.max_seq_length=16", "model.dropout=0.0", "vocab.source=dp",
        "vocab.size=80", "privacy.unit=patient", "privacy.max_tuples_per_patient=2", "privacy.tuple_words=12",
        "membership.holdout_patient_fraction=0", "training.dataset_patients=1000", "training.batch_size=8",
        "training.steps=2", "training.warmup_steps=1", "training.noise_multiplier=1.0", "training.trainable=[head]",
        "training.delta=1e-5"])
    return config, [str(corpus), str(out), remote], derived, remote


GRID = tune_lib.Grid((1e-3, 1e-2), (0.1, 1.0))


def _tune(config, tuner=tune_lib.Tuner):
    return tune_lib.tune(config, "synthetic", grid=GRID, proxy_batch=4, patients=10, accountant="rdp", tuner=tuner)


class _Recording(tune_lib.Tuner):
    """The shipped tuner, recording the training configuration of every proxy run."""
    seen: list = []

    def row_config(self, learning_rate, clip_norm, repeat):
        tc = super().row_config(learning_rate, clip_norm, repeat)
        self.seen.append((tc.batch_size, tc.noise_multiplier, tc.steps, tc.learning_rate, tc.clip_norm))
        return tc


def test_the_tuner_reads_nothing_private_and_records_its_choice_with_provenance(private, _guard):
    config, paths, _, _ = private
    _guard(paths)
    _Recording.seen = []
    with eagerly():
        result = _tune(config, _Recording)
    assert _ARMED["hits"] == []
    # Each proxy run: b = 4, σ_b = σ·b/B = 1.0·4/8, the planned T = 2, the grid point.
    assert _Recording.seen == [(4, 0.5, 2, lr, c) for lr, c in GRID.points()]
    assert [(r["learning_rate"], r["clip_norm"]) for r in result.rows] == GRID.points()
    assert all(math.isfinite(r["heldout_loss"]) for r in result.rows)
    best = min(result.rows, key=lambda r: r["heldout_loss"])
    assert result.choice == {"learning_rate": best["learning_rate"], "clip_norm": best["clip_norm"]}
    p = result.provenance
    # TAN: σ_b = σ·b/B = 1.0·4/8, so σ_b·C/b = σ·C/B; T kept.
    assert (p["proxy_batch"], p["proxy_noise_multiplier"], p["steps"]) == (4, 0.5, 2)
    assert p["plan"]["batch_size"] == 8 and p["plan"]["unit"] == "patient" and p["plan"]["epsilon_train"] > 0
    assert p["proxy"]["source"] == "synthetic" and p["proxy"]["seed"] == proxy_lib.PROXY_SEED
    assert p["grid"] == {"learning_rates": [1e-3, 1e-2], "clip_norms": [0.1, 1.0]}


class _ReadsOneTuple(tune_lib.Tuner):
    """Broken on purpose: peeks at one private tuple before training."""
    path = None

    def run(self):
        with open(self.path, encoding="utf-8") as f:
            f.readline()
        return super().run()


class _ReadsTheHistogram(tune_lib.Tuner):
    """Broken on purpose: reads the private word histogram through dpbert.storage (no ``open``)."""
    uri = None

    def run(self):
        from dpbert import storage

        storage.read_json(self.uri)
        return super().run()


def test_positive_control_a_tuner_reading_one_private_tuple_fails_the_audit(private, _guard):
    config, paths, derived, _ = private
    broken = type("Broken", (_ReadsOneTuple,), {"path": str(derived["tuples"])})
    _guard(paths)
    with pytest.raises(PrivateRead):
        _tune(config, broken)
    assert _ARMED["hits"] == [f"open {derived['tuples']}"]


def test_positive_control_a_storage_read_of_a_derived_artifact_fails_the_audit(private, _guard):
    config, paths, _, remote = private
    broken = type("Broken", (_ReadsTheHistogram,), {"uri": f"{remote}/vocab/histogram.json"})
    _guard(paths)
    with pytest.raises(PrivateRead):
        _tune(config, broken)
    assert len(_ARMED["hits"]) == 1 and _ARMED["hits"][0].endswith(f"{remote}/vocab/histogram.json")


def test_the_synthetic_proxy_refuses_the_corpus_seed_and_a_config_without_public_n():
    config = load_config(None, ["training.dataset_size=100"])
    with pytest.raises(ConfigError, match="corpus.synthetic.seed"):
        proxy_lib.spec_for(config, "synthetic", seed=config.corpus.synthetic.seed)
    with pytest.raises(ConfigError, match="training.dataset_size is not set"):
        tune_lib.plan_of(load_config(None, []))


def test_tan_scaling_keeps_the_noise_on_the_mean_gradient():
    sigma, B, b, C = 0.7832, 192, 32, 1.0
    sigma_b = tune_lib.proxy_noise_multiplier(sigma, B, b)
    assert sigma_b * C / b == pytest.approx(sigma * C / B, rel=1e-15)
    with pytest.raises(ConfigError, match="proxy batch"):
        tune_lib.proxy_noise_multiplier(sigma, B, B + 1)
