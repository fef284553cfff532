"""TFX components: thin adapters that read artifacts, call ``dpbert.*``, write artifacts.

Artifact classes are re-exported here because the Kubeflow V2 runtime imports them by their
TYPE_NAME, ``components.<Class>``.
"""
from components.artifacts import (  # noqa: F401
    ALL_TYPES,
    AuditReport,
    CanaryList,
    CanaryReport,
    DPVocabulary,
    MembershipReport,
    NerReport,
    PretrainedModel,
    PrivacyReport,
    WordTuples,
)
