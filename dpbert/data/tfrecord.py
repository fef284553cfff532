"""Tuples on disk: sharded, gzipped TFRecord files of ``tf.train.Example``.

Schema (one Example per tuple; shared by the vocabulary Beam job and the trainer):
  words       BytesList  the tuple's words, in order (UTF-8)
  doc_id      BytesList  one entry
  patient_id  BytesList  zero or one entry
  admission_id BytesList zero or one entry
  tuple_index Int64List  position of the tuple in its document

These files hold private text: they live only in the pipeline root, next to the other private
artifacts, and nothing in dpbert prints or serves their content.
"""
from __future__ import annotations

from typing import Iterable, Iterator, List

from dpbert import storage
from dpbert.data.tuples import WordTuple

FILE_PATTERN = "tuples-*.tfrecord.gz"


def _tf():
    import tensorflow as tf  # imported lazily: readers and tests of the partition need no TF

    return tf


def tuple_to_example(t: WordTuple):
    tf = _tf()

    def b(values):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode("utf-8") for v in values]))

    feature = {
        "words": b(t.words),
        "doc_id": b([t.doc_id]),
        "patient_id": b([t.patient_id] if t.patient_id else []),
        "admission_id": b([t.admission_id] if t.admission_id else []),
        "tuple_index": tf.train.Feature(int64_list=tf.train.Int64List(value=[t.index])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature))


def example_to_tuple(serialized: bytes) -> WordTuple:
    tf = _tf()
    example = tf.train.Example.FromString(serialized)
    f = example.features.feature

    def s(name) -> List[str]:
        return [v.decode("utf-8") for v in f[name].bytes_list.value]

    patient, admission = s("patient_id"), s("admission_id")
    return WordTuple(doc_id=s("doc_id")[0], index=int(f["tuple_index"].int64_list.value[0]),
                     words=tuple(s("words")), patient_id=patient[0] if patient else None,
                     admission_id=admission[0] if admission else None)


def write_tuples(tuples: Iterable[WordTuple], directory: str, num_shards: int = 4) -> int:
    """Write tuples round-robin into ``num_shards`` gzipped TFRecord files; returns the count."""
    tf = _tf()
    tf.io.gfile.makedirs(directory)
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    writers = [tf.io.TFRecordWriter(storage.join(directory, f"tuples-{i:05d}-of-{num_shards:05d}.tfrecord.gz"),
                                    options) for i in range(num_shards)]
    count = 0
    try:
        for t in tuples:
            writers[count % num_shards].write(tuple_to_example(t).SerializeToString())
            count += 1
    finally:
        for w in writers:
            w.close()
    return count


def tuple_files(directory: str) -> List[str]:
    tf = _tf()
    files = sorted(tf.io.gfile.glob(storage.join(directory, FILE_PATTERN)))
    if not files:
        raise FileNotFoundError(f"no tuple files ({FILE_PATTERN}) under {directory}")
    return files


def read_tuples(directory: str) -> Iterator[WordTuple]:
    """Stream the tuples back, shard by shard."""
    tf = _tf()
    for path in tuple_files(directory):
        for record in tf.data.TFRecordDataset(path, compression_type="GZIP").as_numpy_iterator():
            yield example_to_tuple(record)
