"""``local_privacy.seed`` (issue 22 item 4): refused with a budget like the other noise seeds; without
one, a seeded privatization records no dχ guarantee, and its noise is keyed per record id so that
neighbouring datasets differ in the one unit only. The refusal and the per-unit keying fail on the
previous main (the seed was accepted; the noise was keyed by position in the stream)."""
import math

import pytest

from dpbert import schema
from dpbert.config import ConfigError, LocalPrivacyConfig, load_config
from dpbert.data.tuples import WordTuple
from dpbert.stages import privatize as stage
from tests.local_privacy.conftest import separated_embeddings, toy_embeddings  # noqa: F401 (fixtures)

BUDGET = ["privacy.epsilon_budget=10", "training.dataset_size=1000"]


def test_config_refuses_a_local_privacy_seed_with_a_budget():
    with pytest.raises(ConfigError, match=r"local_privacy\.seed is for tests only .* predictable"):
        load_config(None, BUDGET + ["local_privacy.enabled=true", "local_privacy.seed=7"])
    load_config(None, BUDGET + ["local_privacy.enabled=false", "local_privacy.seed=7"])  # inert when disabled
    load_config(None, ["local_privacy.enabled=true", "local_privacy.seed=7"])  # no budget: tests
    load_config(None, BUDGET + ["local_privacy.enabled=true"])  # OS entropy


def test_run_with_a_local_privacy_seed_under_the_demo_budget_exits_2_and_writes_nothing(tmp_path, capsys):
    from dpbert_cli.main import main

    out = tmp_path / "x"
    code = main(["run", "--set", "local_privacy.enabled=true", "--set", "local_privacy.seed=7",
                 "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "local_privacy.seed" in err and "Traceback" not in err
    assert not out.exists()


def _tuples(n=30, extra=False):
    words = ("patients", "given", "aspirin", "daily", ".")
    tuples = [WordTuple(doc_id=f"d{i}", index=0, words=words, patient_id=f"p{i}") for i in range(n)]
    if extra:  # the neighbouring dataset: one more unit, read FIRST (it shifts every position)
        tuples.insert(0, WordTuple(doc_id="added", index=0, words=("fever", "and", "pain"), patient_id="q"))
    return tuples


def _privatize(tmp_path, name, tuples, embeddings, seed):
    from dpbert.data.tfrecord import read_tuples, write_tuples

    write_tuples(tuples, str(tmp_path / f"{name}_in"), num_shards=1)
    stage.privatize_tuples_dir(str(tmp_path / f"{name}_in"), str(tmp_path / f"{name}_out"), 0.5, embeddings,
                               tuple_words=5, seed=seed, batch_tuples=7, num_shards=1)
    return {t.tuple_id: t.words for t in read_tuples(str(tmp_path / f"{name}_out"))}


def test_seeded_noise_is_keyed_per_unit_neighbouring_datasets_differ_in_that_unit(tmp_path,
                                                                                   separated_embeddings):  # noqa: F811
    d = _privatize(tmp_path, "d", _tuples(), separated_embeddings, seed=7)
    d_plus = _privatize(tmp_path, "dplus", _tuples(extra=True), separated_embeddings, seed=7)
    assert set(d_plus) - set(d) == {"added#0"}
    assert all(d_plus[k] == d[k] for k in d)  # every other unit privatized exactly as before
    assert len(set(d.values())) > 10  # and the noise is real (η = 0.5 on well-separated tokens)
    # Positive control: noise keyed by position (one seeded stream, the previous main's) re-privatizes
    # the units after the added one, and this check sees it.
    from dpbert.local_privacy.text import privatize_word_lists

    def by_position(tuples):
        words, _ = privatize_word_lists([t.words for t in tuples], separated_embeddings.tokenizer,
                                        separated_embeddings.mechanism(), 0.5, 7, max_words=5)
        return {t.tuple_id: tuple(w) for t, w in zip(tuples, words)}

    before, after = by_position(_tuples()), by_position(_tuples(extra=True))
    assert sum(after[k] != before[k] for k in before) > 20


def test_seeded_privatization_records_no_dchi_guarantee(tmp_path, toy_embeddings):  # noqa: F811
    from dpbert.data.splits import write_holdout_key
    from dpbert.data.tfrecord import write_tuples
    from dpbert.local_privacy.embeddings import write_hf_checkpoint

    write_tuples(_tuples(), str(tmp_path / "in"), num_shards=1)
    write_holdout_key(str(tmp_path / "in"))
    public = str(write_hf_checkpoint(toy_embeddings, tmp_path / "public"))
    inputs = {schema.NUM_TUPLES: 30, schema.TUPLE_WORDS: 5}
    seeded = stage.privatize(str(tmp_path / "in"), str(tmp_path / "a"),
                             LocalPrivacyConfig(enabled=True, eta=2.0, seed=3, embeddings_dir=public), inputs,
                             num_shards=1).properties
    assert seeded["noise_seed_fixed"] == 1 and seeded[schema.NON_PRIVATE] == 1
    assert math.isinf(seeded["eta_guaranteed"]) and seeded["eta"] == 2.0  # drawn at η, guaranteed nothing
    fresh = stage.privatize(str(tmp_path / "in"), str(tmp_path / "b"),
                            LocalPrivacyConfig(enabled=True, eta=2.0, embeddings_dir=public), inputs,
                            num_shards=1).properties
    assert fresh["noise_seed_fixed"] == 0 and fresh[schema.NON_PRIVATE] == 0 and fresh["eta_guaranteed"] == 2.0
