"""Test-wide setup: every process that imports TensorFlow needs TF_USE_LEGACY_KERAS=1."""
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# tensorflow_privacy's __init__ imports the estimator code, broken on TF 2.16 (see
# ../shared/ENVIRONMENT.md); dpbert imports only the submodules it uses.
sys.skip_tf_privacy_import = True
