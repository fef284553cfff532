"""dpbert: differentially private BERT pre-training on clinical text.

Plain-Python core (no TFX imports): ``dpbert.data`` (readers, word/tuple partition, synthetic
corpus), ``dpbert.privacy`` (mechanisms, DP events, accounting), ``dpbert.vocab`` (WordPiece
from a noisy histogram), ``dpbert.network`` (BERT MLM), ``dpbert.mechanism`` (the DP-SGD step), ``dpbert.engine`` (training), ``dpbert.evaluate``.
"""
import os
import sys

# Every process that imports TensorFlow through dpbert gets Keras 2 (tensorflow-privacy's
# optimizers need it) and skips tensorflow_privacy's broken estimator imports on TF 2.16.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.skip_tf_privacy_import = True

__version__ = "0.1.0"
