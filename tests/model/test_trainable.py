"""training.trainable: ghost norms of a trainable SUBSET (and LoRA adapters) vs brute force,
frozen coordinates untouched by a DP step, noise only on trainable coordinates, ε independent of
the set, the merged LoRA export."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from dpbert.mechanism import clipping, gaussian
from dpbert.mechanism import step as step_lib
from dpbert.network import bert as bert_lib
from dpbert.mechanism import ghost
from dpbert.network import trainable as trainable_lib
from dpbert.engine.build import GHOST
from tests.model.test_patient_clipping import _batch

# Every set, in two unions (bias+head: a Dense with only its bias trained; new_tokens: sliced rows of
# the embedding and columns of the output layer, whose bias is also whole in ``head``).
#: --dist loadgroup: its module fixture's models are built on one worker.
pytestmark = pytest.mark.xdist_group("trainable")


SETS = [["bias", "head", "new_tokens"], ["lora", "new_tokens"]]
NEW_IDS = [44, 45, 46, 47, 48, 49]  # the "appended" tokens of the test vocabulary (50)


def _spec(length=12, hidden=16, inter=32, layers=1):
    return bert_lib.BertSpec(vocab_size=50, hidden_size=hidden, num_layers=layers, num_heads=2, intermediate_size=inter,
                             max_seq_length=length, max_predictions=4, dropout=0.0, attention_dropout=0.0)


def _models(spec, names, seed=1, base=None):
    """The model training ``names`` (``base``: the plain model built with ``seed``, if at hand)."""
    models = bert_lib.build_bert(spec, seed=seed) if base is None else base
    if trainable_lib.needs_lora(names):
        models = bert_lib.add_lora(models, bert_lib.LoRASpec(rank=3, alpha=6.0), seed=seed)
        # Non-zero B so that A has a gradient too (B = 0 at the start of training).
        for v in trainable_lib.lora_variables(models.mlm):
            v.assign(tf.random.stateless_normal(v.shape, [seed, len(v.name)], stddev=0.3))
    return models, trainable_lib.select(models, names, NEW_IDS)


def _brute_force_groups(model, selection, batch, inputs, mask, k):
    """tests/model/test_patient_clipping.py's brute force, over the SELECTED pieces only: each
    group's gradient (numpy, one array per piece) and its norm."""
    per_group, norms = [], []
    for g in range(len(mask) // k):
        rows = slice(g * k, (g + 1) * k)
        m = tf.constant(mask[rows], tf.float32)
        with tf.GradientTape() as tape:
            out = model({name: v[rows] for name, v in inputs.items()}, training=True)
            loss = tf.reduce_sum(m * clipping.per_example_mlm_loss(batch["masked_labels"][rows], out,
                                                                batch["masked_weights"][rows]))
        grads = [tf.convert_to_tensor(x).numpy() for x in selection.gradients(tape, loss)]
        per_group.append(grads)
        norms.append(float(np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in grads))))
    return np.array(norms), per_group


def _clipped_sum(per_group, norms, clip):
    """Σ_g min(1, C/‖g‖)·g over the groups (an all-padding group: 0)."""
    weights = [min(1.0, clip / norm) if norm > 0 else 0.0 for norm in norms]
    return [sum(w * grads[i] for w, grads in zip(weights, per_group)) for i in range(len(per_group[0]))]


@pytest.fixture(scope="module")
def plain_models():
    """``get(spec)``: the plain model of ``_models`` (seed 1), built once per spec for both sets
    (the norms read it; a LoRA set adapts a copy)."""
    made = {}

    def get(spec):
        if spec not in made:
            made[spec] = bert_lib.build_bert(spec, seed=1)
        return made[spec]

    return get


@pytest.mark.parametrize("names", SETS, ids=["+".join(n) for n in SETS])
@pytest.mark.parametrize("k", [1, 4])
def test_subset_ghost_norms_match_brute_force(plain_models, names, k):
    # (40, 8, 16): the instantiation branch for the big layers; LoRA adapters are rank 3.
    spec = _spec(*((12, 16, 32) if k == 1 else (40, 8, 16)))
    models, selection = _models(spec, names, base=plain_models(spec))
    batch, inputs, loss_fn = _batch(spec, 4 * k)
    ids = np.asarray(inputs["input_ids"]).copy()
    ids[0, 1:4] = [44, 45, 44]  # appended tokens present (and repeated) in the first unit
    inputs = dict(inputs, input_ids=ids)
    mask = np.ones(4 * k, np.float32)
    mask[-1] = 0
    ref, per_group = _brute_force_groups(models.mlm, selection, batch, inputs, mask, k)
    present = ref > 0
    clip = float(np.median(ref[present]))
    grads, _, norms, _ = ghost.clipped_gradient_sum(models.mlm, inputs, loss_fn, mask, clip, group_size=k,
                                                    selection=selection)
    expected = _clipped_sum(per_group, ref, clip)
    np.testing.assert_allclose(norms.numpy(), ref, rtol=1e-4, atol=1e-7)
    assert [tuple(g.shape) for g in grads] == [tuple(p.shape) for p in selection.pieces]
    scale = max(float(np.max(np.abs(e))) for e in expected)
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), want, atol=2e-6 * scale)
    # The subset's norm is NOT the whole model's (the frozen terms are really left out).
    whole = ghost.clipped_gradient_sum(models.mlm, inputs, loss_fn, mask, 1e9, group_size=k)[2].numpy()
    assert np.all(norms.numpy()[present] < whole[present] * (1 - 1e-3))


def test_selection_counts_and_validation():
    spec = _spec(layers=2)
    models, _ = _models(spec, ["bias"])
    h, i, v, L = 16, 32, 50, 12
    counts = {"bias": 2 * (4 * h + 2 * h + i + h + 2 * h) + 2 * h + (h + 2 * h + v),
              "head": h * h + h + 2 * h + v,
              "new_tokens": len(NEW_IDS) * (2 * h + 1)}
    for names, count in counts.items():
        assert trainable_lib.select(models, [names], NEW_IDS).size == count, names
    lora = _models(spec, ["lora"], base=models)[1]  # adapts a copy: ``models`` stays plain
    r = 3
    assert lora.size == 2 * (4 * 2 * r * h + 2 * r * (h + i))
    assert trainable_lib.select(models, ["all"]).size == bert_lib.count_parameters(spec)
    with pytest.raises(ValueError, match="unknown"):
        trainable_lib.validate_names(["bias", "biases"])
    with pytest.raises(ValueError, match="combined"):
        trainable_lib.validate_names(["all", "bias"])
    with pytest.raises(ValueError, match="LoRA adapters"):
        trainable_lib.select(models, ["lora"])
    with pytest.raises(ValueError, match="token_sources"):
        trainable_lib.select(models, ["new_tokens"])
    with pytest.raises(ValueError, match="selects no parameter"):
        trainable_lib.select(models, ["new_tokens"], [])


def _stepper(models, selection, optimizer, group_size=1, noise_multiplier=1.3, seed=7, batch=4.0):
    from dpbert.engine.train import make_mlm_functions

    mask_fn, prepare_fn, loss_fn, metrics_fn = make_mlm_functions(models.spec, [0, 1, 2, 3, 4], 4, 0.15)
    config = gaussian.DPSGDConfig(clip_norm=0.5, noise_multiplier=noise_multiplier, expected_batch_size=batch,
                                  noise_seed=seed, group_size=group_size)
    stepper = step_lib.DPSGDTrainStep(models.mlm, optimizer, config, prepare_fn=prepare_fn, loss_fn=loss_fn,
                                      metrics_fn=metrics_fn, selection=selection, clipping=GHOST)
    return stepper, mask_fn


def _rounds(spec, mask_fn, rows, real=True, seed=0):
    from dpbert.engine.masking import example_keys

    rng = np.random.default_rng(seed)
    ids = rng.integers(5, spec.vocab_size, (rows, spec.max_seq_length)).astype(np.int32)
    ids[:, 1] = 44  # an appended token in every row
    features = mask_fn(ids, example_keys(0, 0, np.arange(rows)))
    mask = np.full((1, rows), 1.0 if real else 0.0, np.float32)
    return [{"features": {k: v[None] for k, v in features.items()}, "example_mask": mask}]


def _frozen_and_trained(models, selection):
    """(frozen coordinates, trained coordinates) of every model weight as flat arrays."""
    frozen, trained = [], []
    for v in models.mlm.weights:
        value = v.numpy()
        piece = selection.piece(v)
        keep = np.zeros(value.shape, bool)
        if piece is not None:
            if piece.axis is None:
                keep[...] = True
            else:
                index = [slice(None)] * value.ndim
                index[piece.axis] = np.asarray(piece.indices)
                keep[tuple(index)] = True
        frozen.append(value[~keep])
        trained.append(value[keep])
    return np.concatenate(frozen), np.concatenate(trained)


def test_frozen_coordinates_bit_identical_after_dp_steps(eager_steps):
    """AdamW with weight decay (which would move every coordinate it is given) and patient
    clipping: the frozen variables and the frozen rows of a sliced variable do not move by one
    bit; the trained ones do. (Two steps, eagerly: what the step writes is tested, not its trace.)"""
    spec = _spec()
    models, selection = _models(spec, ["lora", "new_tokens", "bias"])
    optimizer = tf_keras.optimizers.AdamW(learning_rate=1e-2, weight_decay=0.1, jit_compile=False)
    stepper, mask_fn = _stepper(models, selection, optimizer, group_size=2)
    frozen0, trained0 = _frozen_and_trained(models, selection)
    for step in range(2):
        stepper.run_step(_rounds(spec, mask_fn, 8, seed=step))
    frozen1, trained1 = _frozen_and_trained(models, selection)
    assert frozen1.tobytes() == frozen0.tobytes()
    assert np.mean(trained1 != trained0) > 0.99
    # The optimizer holds state for the trained coordinates only.
    assert sum(int(np.prod(v.shape)) for v in stepper.variables) == selection.size


@pytest.mark.parametrize("names", [["new_tokens"], ["lora", "bias", "head"]], ids=["new_tokens", "lora+bias+head"])
def test_noise_only_on_trainable_coordinates(names, request):
    """All-padding batches (zero gradient), SGD at lr 1: the update is the noise alone. Its std on
    the trained coordinates is σ·C/B (tolerance from the sample std's standard error, as
    dpbert.diagnostics.noise_check); on every frozen coordinate it is exactly 0."""
    spec = _spec()
    models, selection = _models(spec, names)
    if selection.size >= 1000:  # a few steps: eagerly (the values the step writes are tested, not its trace)
        request.getfixturevalue("eager_steps")
    sigma, clip, batch = 1.3, 0.5, 4.0
    stepper, mask_fn = _stepper(models, selection, tf_keras.optimizers.SGD(1.0), noise_multiplier=sigma,
                                batch=batch)
    rounds = _rounds(spec, mask_fn, 4, real=False)
    frozen0, trained0 = _frozen_and_trained(models, selection)
    updates = []
    for _ in range(max(2, int(np.ceil(4000 / selection.size)))):
        stepper.run_step(rounds)
        frozen1, trained1 = _frozen_and_trained(models, selection)
        assert frozen1.tobytes() == frozen0.tobytes()
        updates.append(trained0 - trained1)
        trained0 = trained1
    noise = np.concatenate(updates).astype(np.float64)
    expected = sigma * clip / batch
    tolerance = 4.0 / np.sqrt(2 * noise.size)
    assert abs(noise.std(ddof=1) / expected - 1) <= tolerance, (noise.std(ddof=1), expected, noise.size)
    assert abs(noise.mean()) <= 4.0 * expected / np.sqrt(noise.size)


def test_merged_lora_export_loads_and_equals_adapted_model(tmp_path):
    """The adapted model starts equal to its base (B = 0); once the adapters moved, the saved
    (merged) model is a plain BERT that load_bert reads and that computes the adapted function."""
    spec = _spec()
    plain = bert_lib.build_bert(spec, seed=1)
    inputs = _batch(spec, 3)[1]
    plain_out = plain.mlm(inputs, training=False).numpy()
    models = bert_lib.add_lora(plain, bert_lib.LoRASpec(rank=3, alpha=6.0), seed=1)
    np.testing.assert_array_equal(models.mlm(inputs, training=False).numpy(), plain_out)
    for v in trainable_lib.lora_variables(models.mlm):  # the adapters move (non-zero B, as _models)
        v.assign(tf.random.stateless_normal(v.shape, [1, len(v.name)], stddev=0.3))
    adapted = models.mlm(inputs, training=False).numpy()
    assert np.abs(adapted - plain_out).max() > 1e-2  # the adapters (non-zero B) do change the model
    bert_lib.save_bert(models, tmp_path / "model")
    loaded = bert_lib.load_bert(tmp_path / "model")
    assert loaded.lora is None and not trainable_lib.lora_variables(loaded.mlm)
    np.testing.assert_allclose(loaded.mlm(inputs, training=False).numpy(), adapted, atol=1e-5)
    enc = loaded.encoder(inputs["input_ids"], training=False)["sequence_output"].numpy()
    np.testing.assert_allclose(enc, models.encoder(inputs["input_ids"], training=False)["sequence_output"].numpy(),
                               atol=1e-5)


def test_unregistered_trainable_layer_is_still_refused():
    """check_model_supported refuses a TRAINED unregistered layer, and accepts it frozen."""
    inp = tf_keras.Input((3,))
    conv_like = tf_keras.layers.BatchNormalization(name="bn")
    out = tf_keras.layers.Dense(2, name="d")(conv_like(inp))
    model = tf_keras.Model(inp, out)
    with pytest.raises(NotImplementedError, match="bn"):
        clipping.check_model_supported(model, GHOST.is_registered)
    dense_only = trainable_lib.Selection(trainable_lib.Piece(v) for v in model.get_layer("d").trainable_variables)
    clipping.check_model_supported(model, GHOST.is_registered, selection=dense_only)


def test_train_mlm_subset_same_dp_event_merged_export_and_resume_refused(corpus, tmp_path, eager_steps):
    """train_mlm with lora + new_tokens (the integrity brute-force check at every step, over the
    trained pieces): the DP event values it observed on the running objects (σ, q, steps, ...)
    and so ε are those of the plan of the same configuration training everything; the released
    model is a plain BERT; a resume with another set is refused before anything is written.
    (One step, eagerly: the records are tested, not the step's trace.)"""
    import dataclasses

    from dpbert.config import ModelConfig, TrainingConfig
    from dpbert.engine.train import train_mlm
    from dpbert.privacy import diagnostics
    from dpbert.accounting.accountant import dpsgd_epsilon
    from dpbert.privacy.plan import plan_training

    from .conftest import SPECIALS

    model = ModelConfig(preset="tiny", num_layers=1, max_seq_length=16, dropout=0.0)
    whole = TrainingConfig(batch_size=16, steps=1, clip_norm=1.0, noise_multiplier=0.8, noise_seed=1,
                           integrity_check_every=1, dataset_size=64)
    subset = dataclasses.replace(whole, trainable=["lora", "new_tokens"], lora_rank=2)
    new_ids = [36, 37, 38, 39]
    result = train_mlm(corpus, SPECIALS, 40, model, subset, tmp_path, progress=False, export_saved_model=False,
                       new_token_ids=new_ids)
    assert result.trainable["sets"] == ["lora", "new_tokens"]
    assert 0 < result.trainable["parameters"] < result.trainable["total_parameters"] / 10
    assert result.integrity_checks["clipping"]["passed"] and result.integrity_checks["clipping"]["checks"] == 1
    plan = plan_training(whole, 64)
    sigma_all = diagnostics.effective_noise_multiplier(whole.noise_multiplier, diagnostics.config_of(whole))
    observed = result.observed
    assert (observed["sampling_probability"], observed["steps_executed"], observed["base_noise_multiplier"],
            observed["gradient_noise_multiplier"], observed["expected_batch_size"]) == \
        (plan.sampling_probability, plan.steps, 0.8, 0.8, plan.expected_batch_size)
    assert result.effective_noise_multiplier == sigma_all
    eps = dpsgd_epsilon(result.effective_noise_multiplier, result.sampling_rate, result.steps_taken_total, 1e-6)
    assert eps == dpsgd_epsilon(sigma_all, plan.sampling_probability, plan.steps, 1e-6) and np.isfinite(eps)
    loaded = bert_lib.load_bert(tmp_path / "model")
    assert loaded.lora is None and not trainable_lib.lora_variables(loaded.mlm)
    run_config = (tmp_path / "run_config.json").read_text()
    with pytest.raises(ValueError, match="trainable"):
        train_mlm(corpus, SPECIALS, 40, model, dataclasses.replace(subset, trainable=["bias"], steps=3), tmp_path,
                  progress=False, export_saved_model=False, new_token_ids=new_ids)
    assert (tmp_path / "run_config.json").read_text() == run_config


@pytest.mark.parametrize("distributed", [{"replicas": 2, "strategy": "mirrored"}, {"strategy": "mirrored"},
                                         {"workers": 2}], ids=["2-mirrored", "1-mirrored", "2-workers"])
def test_new_tokens_on_a_distributed_strategy_is_refused_at_validation(distributed):
    """The new tokens' rows are written back by a sliced scatter that a mirrored variable does not
    implement (NotImplementedError at the first step): refused with the fields named (exit 2).
    Control: the same sets on one device, and the other sets distributed, validate."""
    from dpbert.config import ConfigError, TrainingConfig

    sets = ["bias", "head", "new_tokens"]
    with pytest.raises(ConfigError) as err:
        TrainingConfig(batch_size=8, trainable=sets, **distributed).validate("training")
    text = str(err.value)
    assert text.startswith("training.trainable ") and "new_tokens" in text
    assert "training.replicas" in text and "training.strategy" in text and "training.workers" in text
    TrainingConfig(batch_size=8, trainable=sets).validate("training")
    TrainingConfig(batch_size=8, trainable=["bias", "head"], **distributed).validate("training")
