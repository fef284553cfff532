"""dpbert's artifact types.

TYPE_NAME is ``components.<Class>``: the Kubeflow V2 runtime re-imports an artifact class from
its TYPE_NAME, so ``components`` must be a top-level importable package in the container image
(it is: ``setup.py`` installs it) and each class is re-exported from ``components/__init__.py``.
No PROPERTIES are declared (the Vertex compiler rejects them on custom types): every value is a
custom property.

``PRIVATE`` marks artifacts whose files hold private data (tuples of raw text, the canary
secrets): the dashboard and the report never open them.
"""
from tfx.types.artifact import Artifact


class WordTuples(Artifact):
    """The corpus cut into N-word tuples (the privacy unit), as gzipped TFRecord shards."""

    TYPE_NAME = "components.WordTuples"
    PRIVATE = True


class DPVocabulary(Artifact):
    """The noisy histogram (kept words only) and the WordPiece vocabulary learnt from it."""

    TYPE_NAME = "components.DPVocabulary"
    PRIVATE = False


class PretrainedModel(Artifact):
    """A BERT masked-LM checkpoint with its training ledger (DP event, steps, σ, C, ...)."""

    TYPE_NAME = "components.PretrainedModel"
    PRIVATE = False


class PrivacyReport(Artifact):
    """The run's ε ledger (JSON + readable statement)."""

    TYPE_NAME = "components.PrivacyReport"
    PRIVATE = False


class CanaryList(Artifact):
    """The canaries (with their secrets) and the insertion seed. PRIVATE: never shown."""

    TYPE_NAME = "components.CanaryList"
    PRIVATE = True


class CanaryReport(Artifact):
    """Exposure per canary group (DP vs non-DP), the plot, and the one-run audit's ε lower bound."""

    TYPE_NAME = "components.CanaryReport"
    PRIVATE = False


class NerReport(Artifact):
    """Entity-extraction F1 after fine-tuning, per model, and held-out MLM loss."""

    TYPE_NAME = "components.NerReport"
    PRIVATE = False


class MembershipReport(Artifact):
    """Membership-inference attacks (advantage, AUC, ROC) on the DP and non-DP models."""

    TYPE_NAME = "components.MembershipReport"
    PRIVATE = False


class AuditReport(Artifact):
    """The white-box one-run audit of the configured DP-SGD (public rows, DP vocabulary): the ε
    lower bound, its power, its positive control, next to the accountant's ε. Released."""

    TYPE_NAME = "components.AuditReport"
    PRIVATE = False


ALL_TYPES = (WordTuples, DPVocabulary, PretrainedModel, PrivacyReport, CanaryList, CanaryReport, NerReport,
             MembershipReport, AuditReport)
