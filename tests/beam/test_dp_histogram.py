"""dpbert.vocab.beam_histogram: exact counting stage, noise/threshold, seeding, patient cap, runners."""
import collections
import json
import os
import random
import zlib

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that

from dpbert.data.synthetic import generate_notes
from dpbert.data.tuples import WordTuple, corpus_tuples, distinct_words
from dpbert.vocab import beam_histogram as dh
from dpbert.vocab.histogram_file import read_histogram


# ----------------------------------------------------------------------------- fixtures

#: --dist loadgroup: the shared Beam pipeline (module fixtures) runs once, on one worker.
pytestmark = pytest.mark.xdist_group("dp_histogram")


@pytest.fixture(scope="module")
def tuples():
    """Realistic tuples: the synthetic clinical corpus, N = 64 (short tuples, many per patient)."""
    return list(corpus_tuples(generate_notes(patients=6, admissions_per_patient=1, notes_per_admission=2,
                                             seed=7), tuple_words=64))


@pytest.fixture(scope="module")
def exact(tuples):
    counts = collections.Counter()
    for t in tuples:
        counts.update(distinct_words(t))
    return counts


@pytest.fixture(scope="module")
def released(tmp_path_factory, tuples):
    """Every in-memory run the counting, noise, threshold, seeding and patient-cap tests below read,
    as branches of one pipeline (:func:`_run_all`): ``{run name: its sorted output}``."""
    shuffled = list(tuples)
    random.Random(1).shuffle(shuffled)
    capped = [_serialize(t) for t in _patient_tuples([6, 4])]

    def cap_then_count(seed):  # the patient cap alone, then exact counts: which tuples were kept
        return dh.CapTuplesPerPatient(2, noise_seed=seed, example_batch=3) | dh.ExactHistogram()

    runs = {
        # Exact counting: mixed element kinds, a table small enough to flush mid-bundle, several shards.
        "exact": ([t if i % 3 else list(t.words) for i, t in enumerate(tuples)],
                  dh.ExactHistogram(num_shards=5, max_table_words=50), 1),
        "exact_serialized": ([_serialize(t) if i % 2 else t for i, t in enumerate(tuples)],
                             dh.ExactHistogram(num_shards=3, example_batch=7, max_table_words=80), 1),
        "once_per_tuple": ([["a", "a", "a", "b"], ["a"], ("b", "b")], dh.ExactHistogram(num_shards=2), 1),
        # Noise and threshold.
        "tiny": (tuples, dh.DPHistogram(sigma=1e-6, threshold=0.5), 1),
        "thr": (tuples, dh.DPHistogram(sigma=1e-6, threshold=3.5), 1),
        "a": (tuples, dh.DPHistogram(sigma=1.0, threshold=0.5), 1),
        "b": (tuples, dh.DPHistogram(sigma=1.0, threshold=0.5), 1),
        "real": (tuples, dh.DPHistogram(sigma=5.0, threshold=1.0), 1),
        # Seeding: one seed, three partitionings and element kinds; another seed.
        "s1": (tuples, dh.DPHistogram(2.0, 3.0, noise_seed=11), 1),
        "s2": (shuffled, dh.DPHistogram(2.0, 3.0, noise_seed=11, num_shards=3, max_table_words=40), 3),
        "s3": ([_serialize(t) for t in shuffled],
               dh.DPHistogram(2.0, 3.0, noise_seed=11, num_shards=1, example_batch=5), 2),
        "s4": (tuples, dh.DPHistogram(2.0, 3.0, noise_seed=12), 1),
        # The patient cap: unseeded and seeded; its choice on serialized examples over seeds.
        **{f"cap{seed}": (_patient_tuples(CAP_PER_PATIENT),
                          dh.DPHistogram(sigma=1e-6, threshold=0.5, max_tuples_per_patient=CAP_K, noise_seed=seed), 1)
           for seed in (None, 5)},
        "c1": (capped, cap_then_count(3), 1),
        "c2": (list(reversed(capped)), cap_then_count(3), 1),
        **{f"c{seed}": (capped, cap_then_count(seed), 1) for seed in range(10, 14)},
    }
    return _run_all(tmp_path_factory.mktemp("released"), runs)


def _serialize(t: WordTuple) -> bytes:
    from dpbert.data.tfrecord import tuple_to_example

    return tuple_to_example(t).SerializeToString()


def _run_all(tmp_path, runs):
    """Run each ``name: (elements, transform, partitions)`` of ``runs`` (its elements split into
    ``partitions`` Creates, flattened) as one branch of ONE pipeline on the in-memory DirectRunner
    (the branches share nothing but the sink: every output element tagged with its run's name,
    appended as a JSON line to one file by the in-process runner); return ``{name: its output as a
    sorted list}``. The file: ``<name>.jsonl`` for one run, else ``runs.jsonl``."""
    sink = tmp_path / (f"{next(iter(runs))}.jsonl" if len(runs) == 1 else "runs.jsonl")
    sink.write_text("", encoding="utf-8")

    def append(lines):
        with open(sink, "a", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in lines))

    with beam.Pipeline() as p:
        outputs = []
        for name, (elements, transform, partitions) in runs.items():
            parts = [p | f"{name}/Create{i}" >> beam.Create(elements[i::partitions]) for i in range(partitions)]
            pcoll = parts[0] if partitions == 1 else parts | f"{name}/Flatten" >> beam.Flatten()
            outputs.append(pcoll | name >> transform
                           | f"{name}/Json" >> beam.Map(lambda kv, name=name: json.dumps([name, kv[0], kv[1]])))
        _ = (outputs | "AllRuns" >> beam.Flatten() | "Batch" >> beam.BatchElements(min_batch_size=1000)
             | "Append" >> beam.Map(append))
    out = {name: [] for name in runs}
    for line in sink.read_text(encoding="utf-8").splitlines():
        name, word, count = json.loads(line)
        out[name].append((word, count))
    return {name: sorted(rows) for name, rows in out.items()}


def _run(tmp_path, name, elements, transform, partitions=1):
    """:func:`_run_all` of the one run ``name``: its output as a sorted list."""
    return _run_all(tmp_path, {name: (elements, transform, partitions)})[name]


# ----------------------------------------------------------------------------- exact counting stage

def test_counting_stage_equals_bruteforce_counter(released, exact):
    # Mixed element kinds, a table small enough to flush mid-bundle, several shards.
    assert released["exact"] == sorted(exact.items())


def test_serialized_examples_counted_like_tuples(released, exact):
    assert released["exact_serialized"] == sorted(exact.items())


def test_counting_stage_puts_each_word_in_exactly_one_shard(tuples, exact):
    def check(batches):
        seen = collections.Counter()
        for shard, (words, counts) in batches:
            assert len(words) == len(counts) == len(set(words))
            for word, count in zip(words, counts.tolist()):
                assert dh.shard_of(word, 4) == shard
                assert count == exact[word]
            seen.update(words)
        assert set(seen) == set(exact) and set(seen.values()) == {1}

    with beam.Pipeline() as p:
        out = p | beam.Create(tuples) | dh.CountTuplesPerWord(num_shards=4, max_table_words=30)
        assert_that(out, check)


def test_each_word_counts_once_per_tuple(released):
    assert released["once_per_tuple"] == [("a", 2), ("b", 2)]


# ----------------------------------------------------------------------------- noise and threshold

def test_tiny_sigma_gives_the_exact_counts(released, exact):
    out = dict(released["tiny"])
    assert set(out) == set(exact)
    assert max(abs(out[w] - exact[w]) for w in exact) < 1e-3


def test_words_below_threshold_are_dropped(released, exact):
    out = dict(released["thr"])
    assert set(out) == {w for w, c in exact.items() if c >= 4}
    assert 0 < len(out) < len(exact)
    assert min(out.values()) >= 3.5


def test_unseeded_runs_differ(released):
    a, b = released["a"], released["b"]
    common = set(dict(a)) & set(dict(b))
    assert len(common) > 10
    assert sum(dict(a)[w] != dict(b)[w] for w in common) == len(common)


def test_seeded_runs_identical_across_partitionings(released):
    # s2: shuffled, 3 partitions, 3 shards, a small table; s3: serialized, 2 partitions, 1 shard.
    runs = [released["s1"], released["s2"], released["s3"]]
    assert runs[0] and runs[0] == runs[1] == runs[2]
    assert released["s4"] != runs[0]  # another seed


def test_no_exact_count_is_emitted(released, exact):
    out = released["real"]
    assert out
    for word, noisy in out:
        assert isinstance(noisy, float) and not float(noisy).is_integer()
        assert noisy != exact[word]


# ----------------------------------------------------------------------------- patient cap

def _patient_tuples(per_patient):
    """Tuples whose words reveal the cap: a per-patient word in all of a patient's tuples, a
    per-tuple word, and a word shared by everyone."""
    out = []
    for p, n in enumerate(per_patient):
        for i in range(n):
            out.append(WordTuple(doc_id=f"d{p}", index=i, words=(f"pat{p}", f"tup{p}_{i}", "shared"),
                                 patient_id=f"P{p}"))
    return out


CAP_PER_PATIENT, CAP_K = [1, 2, 5, 9], 3  # tuples per patient, the cap (the runs cap{None,5} of ``released``)


def test_patient_cap_keeps_at_most_k_tuples_per_patient(released):
    per_patient, k = CAP_PER_PATIENT, CAP_K
    for seed in (None, 5):
        out = dict(released[f"cap{seed}"])
        for p, n in enumerate(per_patient):
            assert round(out[f"pat{p}"]) == min(n, k)
            assert sum(1 for w in out if w.startswith(f"tup{p}_")) == min(n, k)
        assert round(out["shared"]) == sum(min(n, k) for n in per_patient)


def test_patient_cap_on_serialized_examples_and_seeded_choice(released):
    """Patients of 6 and 4 serialized tuples capped at 2 (``released``: c1 seed 3, c2 the same seed
    on the reversed elements, c10..c13 four other seeds)."""
    def chosen(name):
        return sorted(w for w, _ in released[name] if w.startswith("tup"))

    a = chosen("c1")
    assert len(a) == 4 and a == chosen("c2")
    # Over a few seeds, the choice is not always the same tuples (random, not first-k).
    assert len({tuple(chosen(f"c{s}")) for s in range(10, 14)}) > 1


def test_patient_cap_requires_patient_ids():
    with pytest.raises(Exception, match="patient_id"):
        with beam.Pipeline() as p:
            _ = p | beam.Create([["a", "b"]]) | dh.DPHistogram(1.0, 2.0, max_tuples_per_patient=2)


# ----------------------------------------------------------------------------- validation

@pytest.mark.parametrize("kwargs, name", [
    (dict(sigma=0, threshold=1), "sigma"),
    (dict(sigma=-1.0, threshold=1), "sigma"),
    (dict(sigma=float("nan"), threshold=1), "sigma"),
    (dict(sigma=1.0, threshold=0), "threshold"),
    (dict(sigma=1.0, threshold=float("inf")), "threshold"),
    (dict(sigma=1.0, threshold=2, max_tuples_per_patient=0), "max_tuples_per_patient"),
    (dict(sigma=1.0, threshold=2, noise_seed=-1), "noise_seed"),
    (dict(sigma=1.0, threshold=2, num_shards=0), "num_shards"),
])
def test_bad_parameters_are_rejected(kwargs, name):
    with pytest.raises(ValueError, match=name):
        dh.DPHistogram(**kwargs)


def test_bad_elements_are_rejected_without_quoting_them():
    with pytest.raises(Exception, match="got str") as info:
        with beam.Pipeline() as p:
            _ = p | beam.Create(["secret words"]) | dh.ExactHistogram()
    assert "secret" not in str(info.value).split("got str")[-1]


def test_invalid_utf8_is_rejected():
    from tensorflow.core.example import example_pb2

    example = example_pb2.Example()
    example.features.feature["words"].bytes_list.value.extend([b"ok", b"\xff\xfe"])
    with pytest.raises(Exception, match="UTF-8"):
        with beam.Pipeline() as p:
            _ = p | beam.Create([example.SerializeToString()]) | dh.ExactHistogram()


def test_seed_of_a_word_is_stable():
    a = np.random.default_rng(dh.word_seed(3, "pain")).normal()
    assert a == np.random.default_rng(dh.word_seed(3, "pain")).normal()
    assert a != np.random.default_rng(dh.word_seed(3, "pains")).normal()
    assert dh.shard_of("pain", 64) == zlib.crc32(b"pain") % 64  # stable, not Python's salted hash()


# ----------------------------------------------------------------------------- runners

@pytest.mark.slow  # make test-slow (CI): worker processes; the same job runs in process below
def test_run_dp_histogram_multi_processing(tmp_path, tuples, exact):
    from dpbert.data.tfrecord import write_tuples

    source = str(tmp_path / "tuples")
    write_tuples(tuples, source, num_shards=3)
    args = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    out_path = str(tmp_path / "hist.jsonl")
    result = dh.run_dp_histogram(source, out_path, sigma=2.0, threshold=3.0, beam_args=args, noise_seed=11)
    assert result.tuples_counted == len(tuples)
    released = read_histogram(out_path)
    assert result.words_released == len(released) > 0
    # Sorted by decreasing count; identical to the in-memory seeded run of the same transform.
    assert [c for _, c in released] == sorted((c for _, c in released), reverse=True)
    in_memory = _run(tmp_path, "mem", tuples, dh.DPHistogram(2.0, 3.0, noise_seed=11))
    assert sorted(released) == in_memory
    # Nothing but the released file is left in the output directory.
    assert sorted(os.listdir(tmp_path)) == sorted(["tuples", "hist.jsonl", "mem.jsonl"])
    for _, noisy in released:
        assert not float(noisy).is_integer()


def test_run_exact_histogram_and_metrics(tmp_path, tuples, exact):
    from dpbert.data.tfrecord import write_tuples

    source = str(tmp_path / "tuples")
    write_tuples(tuples, source, num_shards=2)
    result = dh.run_exact_histogram(os.path.join(source, "tuples-*.tfrecord.gz"), str(tmp_path / "exact.jsonl"),
                                    beam_args=["--runner=DirectRunner"])
    assert dict(read_histogram(result.output_path)) == dict(exact)
    assert result.tuples_counted == len(tuples)
    assert all(isinstance(c, int) for _, c in read_histogram(result.output_path))


def test_only_non_sensitive_metrics_are_reported(tuples):
    pipeline = beam.Pipeline()
    _ = pipeline | beam.Create(tuples) | dh.DPHistogram(sigma=1.0, threshold=3.0)
    result = pipeline.run()
    result.wait_until_finish()
    counters = result.metrics().query(beam.metrics.MetricsFilter())["counters"]
    ours = {c.key.metric.name for c in counters if c.key.metric.namespace == dh.METRICS_NAMESPACE}
    assert ours == {dh.TUPLES_COUNTED, dh.WORDS_RELEASED}


def test_missing_tuple_files_are_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tuple files match"):
        dh.run_dp_histogram(str(tmp_path / "nothing"), str(tmp_path / "h.jsonl"), 1.0, 2.0)
    assert not (tmp_path / "h.jsonl").exists()


def test_run_histogram_job_on_a_given_pipeline(tmp_path):
    """The TFX component's entry point: a pipeline it built, DP or (sigma=None) exact + cap."""
    from dpbert.data.tfrecord import write_tuples

    source = str(tmp_path / "tuples")
    write_tuples(_patient_tuples([1, 4, 6]), source, num_shards=2)
    exact_path = str(tmp_path / "exact.jsonl")
    result = dh.run_histogram_job(beam.Pipeline(), source, exact_path, max_tuples_per_patient=2, noise_seed=1)
    exact = dict(read_histogram(exact_path))
    assert result.tuples_counted == 5 and result.words_released is None
    assert (exact["pat0"], exact["pat1"], exact["pat2"], exact["shared"]) == (1, 2, 2, 5)
    dp_path = str(tmp_path / "dp.jsonl")
    result = dh.run_histogram_job(beam.Pipeline(), source, dp_path, sigma=1e-6, threshold=1.5)
    assert {w for w, _ in read_histogram(dp_path)} == {"pat1", "pat2", "shared"}
    assert result.words_released == 3
    with pytest.raises(ValueError, match="both"):
        dh.run_histogram_job(beam.Pipeline(), source, dp_path, sigma=1.0)
