"""The DP word histogram of Hoory et al. 2021 as Apache Beam transforms (any runner).

h′(x) = the number of tuples that contain word x, each distinct word counted once per tuple (the
tuple is the privacy unit, ``dpbert.data.tuples``). ``DPHistogram`` adds one Gaussian draw to
each h′(x) and keeps the words whose noisy count reaches the threshold, through
``dpbert.privacy.histogram.noise_and_threshold`` (the DP logic lives there, not here); only
those ``(word, noisy_count)`` pairs leave the transform. ``ExactHistogram`` is the explicit,
non-private (ε = ∞) baseline for the paper's BERT-M comparison.

Input elements (one per tuple; a PCollection may mix them): ``bytes`` (a serialized
``tf.train.Example`` in the ingestion format, ``dpbert.data.tfrecord``; decoded in batches by
tfx_bsl, TensorFlow is not imported), a ``dpbert.data.tuples.WordTuple``, or a plain
``list``/``tuple`` of ``str`` words (no patient: not allowed with the patient cap).

Contract: each word is noised exactly once, in exactly one shard (``shard_of``: a stable hash);
with ``max_tuples_per_patient = k`` each patient contributes at most k tuples, chosen at random
before counting (calibrate the threshold with ``threshold_for(..., max_contributions=k)``);
production noise comes from OS entropy per DoFn instance, ``noise_seed`` (tests only) makes every
word's noise depend on the seed and the word alone. The exact counts exist only in memory and in
the runner's shuffle; the only ``Metrics`` are the tuples counted and the words released.

``run_histogram_job`` (on a given pipeline, e.g. TFX's ``BeamComponentParameter``) and
``run_dp_histogram`` / ``run_exact_histogram`` (on a pipeline built from ``beam_args``) read tuple
TFRecords and write the histogram file described in ``dpbert.vocab.histogram_file`` (JSON Lines
``{"word": ..., "count": ...}``, sorted by decreasing count then word). How it counts, shards,
caps and reads, and what a runner's monitoring can see: docs/scaling-out.md ("The vocabulary's
Beam job"). ``python -m beam_jobs.dp_histogram`` runs the vocabulary stage on a Beam runner.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import numbers
import zlib
from collections import Counter
from typing import List, Optional, Sequence, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

METRICS_NAMESPACE = "dpbert.dp_histogram"
#: Metric names (the only two the job reports).
TUPLES_COUNTED = "tuples_counted"
WORDS_RELEASED = "words_released"

DEFAULT_NUM_SHARDS = 64
DEFAULT_EXAMPLE_BATCH = 1024
DEFAULT_MAX_TABLE_WORDS = 2_000_000

WORDS_FEATURE = "words"
PATIENT_FEATURE = "patient_id"


# ----------------------------------------------------------------------------- validation

def _check_positive_finite(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_optional_int(name: str, value, minimum: int) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} (or None), got {value!r}")
    return int(value)


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


# ----------------------------------------------------------------------------- helpers

def shard_of(word: str, num_shards: int) -> int:
    """The shard of ``word``: a stable hash (identical in every process and on every runner)."""
    return zlib.crc32(word.encode("utf-8")) % num_shards


def word_seed(noise_seed: int, word: str) -> np.random.SeedSequence:
    """The seed of ``word``'s noise in seeded (test) mode: depends on the seed and the word only."""
    digest = hashlib.blake2b(word.encode("utf-8"), digest_size=16, person=b"dpbert-noise").digest()
    return np.random.SeedSequence([int(noise_seed), int.from_bytes(digest, "little")])


def _example_decoder(feature: str):
    """A tfx_bsl C++ decoder of serialized tf.train.Examples reading one BytesList feature."""
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx_bsl.coders import example_coder

    schema = schema_pb2.Schema()
    spec = schema.feature.add()
    spec.name = feature
    spec.type = schema_pb2.BYTES
    return example_coder.ExamplesToRecordBatchDecoder(schema.SerializeToString())


def _words_of(element):
    """The words of a non-serialized tuple element, checked (the message never quotes them)."""
    words = getattr(element, "words", element)
    if isinstance(words, (str, bytes)) or not isinstance(words, (list, tuple)):
        raise TypeError(
            "DPHistogram elements must be serialized tf.train.Example bytes, WordTuple objects or "
            f"lists/tuples of str words; got {type(element).__name__}")
    return words


def _first(value):
    return value[0]


# ----------------------------------------------------------------------------- counting

class _CountWordsInBundle(beam.DoFn):
    """Per-bundle table word → number of tuples containing it; flushed as per-shard batches.

    Output elements: ``(shard, (words: list[str], counts: np.ndarray[int64]))`` with each word at
    most once per output element. Inputs must be in the global window (``_Globally`` ensures it).
    """

    def __init__(self, num_shards: int, example_batch: int, max_table_words: int):
        self._num_shards = num_shards
        self._example_batch = example_batch
        self._max_table_words = max_table_words
        self._tuples_counted = Metrics.counter(METRICS_NAMESPACE, TUPLES_COUNTED)

    def setup(self):
        self._decoder = None

    def start_bundle(self):
        self._counter = Counter()  # str word -> tuples, for WordTuple / list elements
        self._tables = []  # Arrow (w: large_string, n: int64) per batch of serialized Examples
        self._table_rows = 0
        self._examples = []
        self._tuples = 0

    def process(self, element):
        if isinstance(element, bytes):
            self._examples.append(element)
            if len(self._examples) >= self._example_batch:
                self._count_examples()
        else:
            self._counter.update(set(_words_of(element)))
            self._tuples += 1
        if len(self._counter) + self._table_rows > self._max_table_words:
            yield from self._flush()

    def finish_bundle(self):
        for value in self._flush():
            yield GlobalWindows.windowed_value(value)

    def _count_examples(self):
        import pyarrow as pa
        import pyarrow.compute as pc

        if self._decoder is None:
            self._decoder = _example_decoder(WORDS_FEATURE)
        column = self._decoder.DecodeBatch(self._examples).column(0)
        self._tuples += len(self._examples)
        self._examples = []
        # The decoder's list array is not sliced: its values are the flattened words.
        words = column.values if column.offset == 0 else column.flatten()
        if len(words) == 0:
            return
        encoded = pc.dictionary_encode(words)
        size = len(encoded.dictionary)
        index = encoded.indices.to_numpy()
        parent = pc.list_parent_indices(column).to_numpy().astype(np.int64, copy=False)
        # Distinct (tuple, word) pairs, then tuples per word: each word once per tuple.
        pairs = np.unique(parent * size + index)
        counts = np.bincount(pairs % size, minlength=size).astype(np.int64, copy=False)
        self._tables.append((encoded.dictionary, counts))
        self._table_rows += size
        if self._table_rows > self._max_table_words // 2 and len(self._tables) > 1:
            self._compact()

    def _compact(self):
        """Merge the per-batch tables into one (hash-encode the words, sum with bincount)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if len(self._tables) == 1:
            return
        words = pa.chunked_array([w for w, _ in self._tables]).combine_chunks()
        counts = np.concatenate([n for _, n in self._tables])
        encoded = pc.dictionary_encode(words)
        merged = np.bincount(encoded.indices.to_numpy(), weights=counts,
                             minlength=len(encoded.dictionary))
        self._tables = [(encoded.dictionary, np.rint(merged).astype(np.int64))]
        self._table_rows = len(encoded.dictionary)

    def _flush(self):
        import pyarrow as pa

        if self._examples:
            self._count_examples()
        table = {}
        if self._tables:
            self._compact()
            words, counts = self._tables[0]
            try:
                words = words.cast(pa.large_string())
            except pa.ArrowInvalid:
                raise ValueError("a tuple's words feature holds bytes that are not valid UTF-8") from None
            table = dict(zip(words.to_pylist(), counts.tolist()))
        if self._counter:
            if any(type(word) is not str for word in self._counter):
                raise TypeError("the words of a WordTuple / list element must be str")
            if table:
                for word, count in self._counter.items():
                    table[word] = table.get(word, 0) + count
            else:
                table = self._counter
        if self._tuples:
            self._tuples_counted.inc(self._tuples)
        self._counter = Counter()
        self._tables = []
        self._table_rows = 0
        self._tuples = 0
        if not table:
            return
        shards: List[Tuple[list, list]] = [([], []) for _ in range(self._num_shards)]
        for word, count in table.items():
            words, counts = shards[shard_of(word, self._num_shards)]
            words.append(word)
            counts.append(count)
        for shard, (words, counts) in enumerate(shards):
            if words:
                yield shard, (words, np.asarray(counts, dtype=np.int64))


class _MergeCounts(beam.CombineFn):
    """Merges per-bundle batches of one shard into ``(words, counts)``, each word once."""

    def create_accumulator(self):
        return {}

    def add_input(self, accumulator, batch):
        words, counts = batch
        if not accumulator:
            accumulator.update(zip(words, counts.tolist()))
            return accumulator
        get = accumulator.get
        for word, count in zip(words, counts.tolist()):
            accumulator[word] = get(word, 0) + count
        return accumulator

    def merge_accumulators(self, accumulators):
        accumulators = sorted(accumulators, key=len, reverse=True)
        merged = accumulators[0]
        for other in accumulators[1:]:
            get = merged.get
            for word, count in other.items():
                merged[word] = get(word, 0) + count
        return merged

    def extract_output(self, accumulator):
        return list(accumulator), np.fromiter(accumulator.values(), dtype=np.int64, count=len(accumulator))


class _Globally(beam.PTransform):
    def expand(self, pcoll):
        return pcoll | "GlobalWindow" >> beam.WindowInto(GlobalWindows())


class CountTuplesPerWord(beam.PTransform):
    """EXACT h′ in per-shard batches: ``(shard, (words, counts))``, every word in exactly one.

    Non-private: an internal stage of ``DPHistogram`` / ``ExactHistogram``, public only so that
    it can be tested in isolation. Never write its output anywhere.
    """

    def __init__(self, num_shards: int = DEFAULT_NUM_SHARDS, example_batch: int = DEFAULT_EXAMPLE_BATCH,
                 max_table_words: int = DEFAULT_MAX_TABLE_WORDS):
        super().__init__()
        self._num_shards = _check_int("num_shards", num_shards, 1)
        self._example_batch = _check_int("example_batch", example_batch, 1)
        self._max_table_words = _check_int("max_table_words", max_table_words, 1)

    def expand(self, tuples):
        return (
            tuples
            | "InGlobalWindow" >> _Globally()
            | "CountInBundle" >> beam.ParDo(
                _CountWordsInBundle(self._num_shards, self._example_batch, self._max_table_words))
            | "MergeShard" >> beam.CombinePerKey(_MergeCounts())
        )


# ----------------------------------------------------------------------------- patient cap

class _KeyByPatient(beam.DoFn):
    """``(patient_id, (priority, element))`` with a random priority (OS entropy or the seed)."""

    def __init__(self, noise_seed: Optional[int], example_batch: int):
        self._noise_seed = noise_seed
        self._example_batch = example_batch

    def setup(self):
        self._rng = np.random.default_rng() if self._noise_seed is None else None
        self._decoder = None

    def start_bundle(self):
        self._examples = []

    def _priority(self, content: bytes) -> float:
        if self._noise_seed is None:
            return float(self._rng.random())
        digest = hashlib.blake2b(digest_size=8, person=b"dpbert-cap")
        digest.update(str(self._noise_seed).encode() + b"\0")
        digest.update(content)
        return int.from_bytes(digest.digest(), "little") / 2.0 ** 64

    @staticmethod
    def _missing():
        return ValueError("max_tuples_per_patient is set but a tuple has no patient_id "
                          "(the patient cap needs every tuple's patient)")

    def process(self, element):
        if isinstance(element, bytes):
            self._examples.append(element)
            if len(self._examples) >= self._example_batch:
                yield from self._key_examples()
            return
        patient = getattr(element, "patient_id", None)
        words = _words_of(element)
        if not patient:
            raise self._missing()
        content = "\x1f".join([str(getattr(element, "doc_id", "")), str(getattr(element, "index", "")),
                               patient, *words]).encode("utf-8")
        yield patient, (self._priority(content), element)

    def finish_bundle(self):
        for value in self._key_examples():
            yield GlobalWindows.windowed_value(value)

    def _key_examples(self):
        if not self._examples:
            return
        if self._decoder is None:
            self._decoder = _example_decoder(PATIENT_FEATURE)
        examples, self._examples = self._examples, []
        patients = self._decoder.DecodeBatch(examples).column(0).to_pylist()
        for serialized, patient in zip(examples, patients):
            if not patient or not patient[0]:
                raise self._missing()
            yield patient[0].decode("utf-8", "replace"), (self._priority(serialized), serialized)


class CapTuplesPerPatient(beam.PTransform):
    """Keep at most ``k`` tuples per patient, chosen uniformly at random (the patient-level unit).

    Random priority per tuple (OS entropy; or a stable hash of the seed and the tuple's content
    when ``noise_seed`` is given), then ``Top.PerKey(k)`` per patient (lifted: at most k tuples
    per patient and bundle cross the shuffle). Every tuple must carry a patient id.
    """

    def __init__(self, k: int, noise_seed: Optional[int] = None, example_batch: int = DEFAULT_EXAMPLE_BATCH):
        super().__init__()
        self._k = _check_int("max_tuples_per_patient", k, 1)
        self._noise_seed = _check_optional_int("noise_seed", noise_seed, 0)
        self._example_batch = _check_int("example_batch", example_batch, 1)

    def expand(self, tuples):
        return (
            tuples
            | "InGlobalWindow" >> _Globally()
            | "KeyByPatient" >> beam.ParDo(_KeyByPatient(self._noise_seed, self._example_batch))
            | "TopKPerPatient" >> beam.combiners.Top.PerKey(self._k, key=_first)
            | "Unkey" >> beam.FlatMap(lambda kv: [element for _, element in kv[1]])
        )


# ----------------------------------------------------------------------------- noise

class _NoiseAndThreshold(beam.DoFn):
    """One ``noise_and_threshold`` call per shard batch; yields the kept ``(word, noisy_count)``."""

    def __init__(self, sigma: float, threshold: float, noise_seed: Optional[int]):
        self._sigma = sigma
        self._threshold = threshold
        self._noise_seed = noise_seed
        self._words_released = Metrics.counter(METRICS_NAMESPACE, WORDS_RELEASED)

    def setup(self):
        from dpbert.privacy.histogram import noise_and_threshold

        self._noise_and_threshold = noise_and_threshold
        # Fresh OS entropy for every DoFn instance (worker); never pickled, never seeded.
        self._rng = np.random.default_rng() if self._noise_seed is None else None

    def process(self, shard_batch):
        _, (words, counts) = shard_batch
        if self._noise_seed is None:
            kept = self._noise_and_threshold(words, counts, self._sigma, self._threshold, self._rng)
        else:
            kept = []
            for i, word in enumerate(words):
                rng = np.random.default_rng(word_seed(self._noise_seed, word))
                kept.extend(self._noise_and_threshold([word], counts[i:i + 1], self._sigma,
                                                      self._threshold, rng))
        self._words_released.inc(len(kept))
        for word, noisy in kept:
            yield word, float(noisy)


class DPHistogram(beam.PTransform):
    """Tuples → the noised, thresholded histogram ``(word, noisy_count)`` (kept words only).

    Args:
      sigma: standard deviation of the Gaussian noise on each count (> 0).
      threshold: keep words whose noisy count is >= threshold; take it from
        ``dpbert.privacy.histogram.threshold_for`` (the guarantee depends on it).
      noise_seed: tests only. None (production) draws the noise from OS entropy.
      max_tuples_per_patient: if set, each patient contributes at most this many tuples, chosen
        at random, before counting (the privacy unit becomes the patient; calibrate the
        threshold with ``max_contributions`` accordingly).
      num_shards: number of shuffle keys of the merged table (parallelism of the merge/noise).
    """

    def __init__(self, sigma: float, threshold: float, noise_seed: Optional[int] = None,
                 max_tuples_per_patient: Optional[int] = None, num_shards: int = DEFAULT_NUM_SHARDS,
                 example_batch: int = DEFAULT_EXAMPLE_BATCH, max_table_words: int = DEFAULT_MAX_TABLE_WORDS):
        super().__init__()
        self._sigma = _check_positive_finite("sigma", sigma)
        self._threshold = _check_positive_finite("threshold", threshold)
        self._noise_seed = _check_optional_int("noise_seed", noise_seed, 0)
        self._cap = _check_optional_int("max_tuples_per_patient", max_tuples_per_patient, 1)
        self._count = CountTuplesPerWord(num_shards, example_batch, max_table_words)
        self._example_batch = example_batch

    def expand(self, tuples):
        if self._cap is not None:
            tuples = tuples | "CapPerPatient" >> CapTuplesPerPatient(self._cap, self._noise_seed,
                                                                     self._example_batch)
        return (
            tuples
            | "CountTuplesPerWord" >> self._count
            | "NoiseAndThreshold" >> beam.ParDo(_NoiseAndThreshold(self._sigma, self._threshold,
                                                                   self._noise_seed))
        )


class ExactHistogram(beam.PTransform):
    """NON-PRIVATE (ε = ∞) baseline: ``(word, h′(word))`` for every word, exact integer counts.

    Only for the paper's BERT-M comparison; the caller must record ε = ∞ for what it builds.
    ``max_tuples_per_patient`` applies the same patient cap as ``DPHistogram`` (same tuples,
    no noise); ``cap_seed`` seeds that choice (tests only).
    """

    def __init__(self, num_shards: int = DEFAULT_NUM_SHARDS, example_batch: int = DEFAULT_EXAMPLE_BATCH,
                 max_table_words: int = DEFAULT_MAX_TABLE_WORDS, max_tuples_per_patient: Optional[int] = None,
                 cap_seed: Optional[int] = None):
        super().__init__()
        self._count = CountTuplesPerWord(num_shards, example_batch, max_table_words)
        self._cap = _check_optional_int("max_tuples_per_patient", max_tuples_per_patient, 1)
        self._cap_seed = _check_optional_int("cap_seed", cap_seed, 0)
        self._example_batch = example_batch

    def expand(self, tuples):
        if self._cap is not None:
            tuples = tuples | "CapPerPatient" >> CapTuplesPerPatient(self._cap, self._cap_seed,
                                                                     self._example_batch)
        return (
            tuples
            | "CountTuplesPerWord" >> self._count
            | "Unbatch" >> beam.FlatMap(lambda kv: zip(kv[1][0], kv[1][1].tolist()))
        )


# ----------------------------------------------------------------------------- runners

@dataclasses.dataclass(frozen=True)
class HistogramRunResult:
    output_path: str
    #: Tuples that entered the count (after the patient cap, if any); None if the runner
    #: reported no metrics.
    tuples_counted: Optional[int]
    #: Words released (lines written); None for the exact histogram or without metrics.
    words_released: Optional[int]


def tuple_file_pattern(tuples_source: str) -> str:
    """The file pattern of ``tuples_source``: a glob is used as is; a directory (local or on any
    Beam filesystem, e.g. gs://) of ingestion shards becomes ``<dir>/tuples-*.tfrecord.gz``; a
    single file is used as is."""
    from apache_beam.io.filesystems import FileSystems

    from dpbert import storage
    from dpbert.data.tfrecord import FILE_PATTERN

    if any(ch in tuples_source for ch in "*?["):
        return tuples_source
    inside = FileSystems.join(tuples_source, FILE_PATTERN)
    if storage.storage_for(tuples_source).isdir(tuples_source) or FileSystems.match([inside])[0].metadata_list:
        return inside
    return tuples_source


def _require_files(pattern: str):
    from apache_beam.io.filesystems import FileSystems

    try:
        found = FileSystems.match([pattern])[0].metadata_list
    except Exception:  # a filesystem error is reported as "nothing matched", with the pattern
        found = []
    if not found:
        raise FileNotFoundError(f"no tuple files match {pattern}")


def _write_sorted(pairs, output_path: str):
    from dpbert.vocab.histogram_file import format_line, sort_key

    return (
        pairs
        | "Collect" >> beam.combiners.ToList()
        | "SortAndFormat" >> beam.FlatMap(lambda rows: [format_line(w, c) for w, c in sorted(rows, key=sort_key)])
        | "Write" >> beam.io.WriteToText(output_path, num_shards=1, shard_name_template="")
    )


def _counter_value(result, name: str) -> Optional[int]:
    try:
        counters = result.metrics().query(
            beam.metrics.MetricsFilter().with_namespace(METRICS_NAMESPACE).with_name(name))["counters"]
    except Exception:  # some runners do not report metrics
        return None
    if not counters:
        return None
    return int(sum(c.committed if c.committed is not None else c.attempted for c in counters))


def run_histogram_job(pipeline: Optional[beam.Pipeline], tuples_source: str, output_path: str,
                      sigma: Optional[float] = None, threshold: Optional[float] = None,
                      noise_seed: Optional[int] = None, max_tuples_per_patient: Optional[int] = None,
                      num_shards: int = DEFAULT_NUM_SHARDS) -> HistogramRunResult:
    """Add read tuples → histogram → write ``output_path`` to ``pipeline`` and run it.

    ``pipeline`` is a fresh ``beam.Pipeline`` (e.g. TFX's ``BeamComponentParameter``, built
    with the pipeline's ``beam_pipeline_args``); None builds one with default options.
    With ``sigma`` and ``threshold``: ``DPHistogram``. With both None: the NON-PRIVATE
    ``ExactHistogram`` (ε = ∞; the caller records it). The patient cap applies to both.
    """
    if (sigma is None) != (threshold is None):
        raise ValueError("sigma and threshold must both be set (DP histogram) or both be None "
                         f"(non-private exact histogram), got sigma={sigma!r}, threshold={threshold!r}")
    if sigma is None:
        transform = ExactHistogram(num_shards, max_tuples_per_patient=max_tuples_per_patient, cap_seed=noise_seed)
    else:
        transform = DPHistogram(sigma, threshold, noise_seed=noise_seed,
                                max_tuples_per_patient=max_tuples_per_patient, num_shards=num_shards)
    pattern = tuple_file_pattern(tuples_source)
    _require_files(pattern)
    pipeline = pipeline if pipeline is not None else beam.Pipeline()
    _ = (
        pipeline
        | "TuplePattern" >> beam.Create([pattern])
        # ReadAll: the matched files are reshuffled, so every runner (the DirectRunner's
        # multi_processing mode included) spreads them over its workers.
        | "ReadTuples" >> beam.io.ReadAllFromTFRecord()
        | "Histogram" >> transform
        | "WriteHistogram" >> _Writer(output_path)
    )
    result = pipeline.run()
    result.wait_until_finish()
    return HistogramRunResult(output_path, _counter_value(result, TUPLES_COUNTED),
                              None if sigma is None else _counter_value(result, WORDS_RELEASED))


def _pipeline(beam_args: Optional[Sequence[str]]) -> beam.Pipeline:
    from apache_beam.options.pipeline_options import PipelineOptions

    return beam.Pipeline(options=PipelineOptions(list(beam_args or [])))


class _Writer(beam.PTransform):
    def __init__(self, output_path: str):
        super().__init__()
        self._output_path = output_path

    def expand(self, pairs):
        return _write_sorted(pairs, self._output_path)


def run_dp_histogram(tuples_source: str, output_path: str, sigma: float, threshold: float,
                     beam_args: Optional[Sequence[str]] = None, noise_seed: Optional[int] = None,
                     max_tuples_per_patient: Optional[int] = None,
                     num_shards: int = DEFAULT_NUM_SHARDS) -> HistogramRunResult:
    """Read tuple TFRecords (a directory of ingestion shards or a file pattern, gzip detected
    from the name), run ``DPHistogram`` and write the released words to ``output_path``
    (JSON Lines, ``dpbert.vocab.histogram_file``). ``beam_args`` are Beam pipeline options, e.g.
    ``BeamConfig.pipeline_args()``."""
    if sigma is None or threshold is None:
        raise ValueError("sigma and threshold are required (run_exact_histogram is the non-private baseline)")
    return run_histogram_job(_pipeline(beam_args), tuples_source, output_path, sigma, threshold,
                             noise_seed=noise_seed, max_tuples_per_patient=max_tuples_per_patient,
                             num_shards=num_shards)


def run_exact_histogram(tuples_source: str, output_path: str,
                        beam_args: Optional[Sequence[str]] = None,
                        max_tuples_per_patient: Optional[int] = None,
                        num_shards: int = DEFAULT_NUM_SHARDS) -> HistogramRunResult:
    """NON-PRIVATE (ε = ∞) baseline: write every word with its exact tuple count."""
    return run_histogram_job(_pipeline(beam_args), tuples_source, output_path,
                             max_tuples_per_patient=max_tuples_per_patient, num_shards=num_shards)


__all__ = [
    "DPHistogram", "ExactHistogram", "CountTuplesPerWord", "CapTuplesPerPatient", "HistogramRunResult",
    "run_dp_histogram", "run_exact_histogram", "run_histogram_job", "shard_of", "word_seed", "tuple_file_pattern",
    "METRICS_NAMESPACE", "TUPLES_COUNTED", "WORDS_RELEASED",
]
