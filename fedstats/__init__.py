"""fedstats: privacy-accounted biostatistics for multi-site clinical studies.

Sites keep their rows behind a :class:`Silo`; a :class:`Federation` reaches
them only through encoded messages; models such as
:class:`LogisticRegression` combine the sites' aggregates into the answer a
pooled analysis would give. Deep models (:mod:`fedstats.deep`) need the
``deep`` extra (``pip install 'fedstats[deep]'``) and are imported on first use.
"""

import importlib
from typing import TYPE_CHECKING, Any

from fedstats.errors import (
    BudgetExceededError,
    CodecError,
    ConvergenceWarning,
    DisclosureError,
    FedstatsError,
    FedstatsWarning,
    FingerprintMismatchError,
    FormulaError,
    InconsistentColumnError,
    InvalidReplyError,
    MissingColumnError,
    MissingValuesError,
    NoBudgetError,
    NoEventsError,
    NonBinaryOutcomeError,
    PerfectSeparationError,
    PlannedBudgetError,
    PrivacyUtilityWarning,
    SecureAggregationAborted,
    SeparationWarning,
    SiteDataError,
    SiteError,
    SiteUnreachableError,
    StudyConfigurationError,
    SurvivalHorizonWarning,
    UnknownLevelError,
)

_PUBLIC: dict[str, str] = {
    "DPFedAvg": "fedstats.models.client_dp",
    "CoxPH": "fedstats.models.cox",
    "concordance_index": "fedstats.models.cox",
    "classification_metrics": "fedstats.models.classifier_scores",
    "Federation": "fedstats.in_process",
    "CumulativeIncidence": "fedstats.models.cumulative_incidence",
    "CumulativeIncidenceResults": "fedstats.models.cumulative_incidence",
    "FineGray": "fedstats.models.fine_gray",
    "FineGrayResults": "fedstats.models.fine_gray",
    "HeterogeneityResults": "fedstats.models.heterogeneity",
    "SurvivalHeterogeneity": "fedstats.models.heterogeneity",
    "heterogeneity": "fedstats.models.heterogeneity",
    "survival_heterogeneity": "fedstats.models.heterogeneity",
    "MessageInventory": "studyfiles.inventory",
    "MessageRecord": "studyfiles.inventory",
    "KaplanMeier": "fedstats.models.kaplan_meier",
    "KaplanMeierResults": "fedstats.models.kaplan_meier",
    "LogRankResult": "fedstats.models.logrank",
    "logrank_test": "fedstats.models.logrank",
    "LogisticRegression": "fedstats.models.logistic",
    "VerticalLogisticRegression": "fedstats.models.vertical_logistic",
    "link": "fedstats.models.record_linkage",
    "LinkageResult": "fedstats.models.record_linkage",
    "GLM": "fedstats.models.glm",
    "GLMResults": "fedstats.models.glm_results",
    "ClientDP": "fedstats.models.privacy",
    "PrivacyAccount": "fedstats.models.privacy",
    "RecordDP": "fedstats.models.privacy",
    "CoxPHResults": "fedstats.models.results",
    "LogisticRegressionResults": "fedstats.models.results",
    "Provenance": "fedstats.models.results",
    "SecureAggregation": "fedstats.models.secure_aggregation",
    "SecureSum": "fedstats.models.secure_aggregation",
    "secure_sum": "fedstats.models.secure_aggregation",
    "DesignSpec": "fedstats.contract.design",
    "DisclosurePolicy": "fedstats.site.disclosure",
    "Silo": "fedstats.site.silo",
    "DeepModelResults": "fedstats.deep",
    "FederatedTrainer": "fedstats.deep",
}
"""Where each public name is defined, imported on first use (PEP 562): ``import fedstats``
loads no model, no SciPy and no torch until a name is used."""

_SUBMODULES = frozenset({"datasets", "deep"})

if TYPE_CHECKING:
    from fedstats import datasets, deep
    from fedstats.contract.design import DesignSpec
    from fedstats.deep import DeepModelResults, FederatedTrainer
    from fedstats.in_process import Federation
    from fedstats.models.classifier_scores import classification_metrics
    from fedstats.models.client_dp import DPFedAvg
    from fedstats.models.cox import CoxPH, concordance_index
    from fedstats.models.cumulative_incidence import (
        CumulativeIncidence,
        CumulativeIncidenceResults,
    )
    from fedstats.models.fine_gray import FineGray, FineGrayResults
    from fedstats.models.glm import GLM
    from fedstats.models.glm_results import GLMResults
    from fedstats.models.heterogeneity import (
        HeterogeneityResults,
        SurvivalHeterogeneity,
        heterogeneity,
        survival_heterogeneity,
    )
    from fedstats.models.kaplan_meier import KaplanMeier, KaplanMeierResults
    from fedstats.models.logistic import LogisticRegression
    from fedstats.models.logrank import LogRankResult, logrank_test
    from fedstats.models.privacy import ClientDP, PrivacyAccount, RecordDP
    from fedstats.models.record_linkage import LinkageResult, link
    from fedstats.models.results import CoxPHResults, LogisticRegressionResults, Provenance
    from fedstats.models.secure_aggregation import SecureAggregation, SecureSum, secure_sum
    from fedstats.models.vertical_logistic import VerticalLogisticRegression
    from fedstats.site.disclosure import DisclosurePolicy
    from fedstats.site.silo import Silo
    from studyfiles.inventory import MessageInventory, MessageRecord

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Import a public name's module the first time the name is used."""
    if name in _SUBMODULES:
        return importlib.import_module(f"fedstats.{name}")
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'fedstats' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC, *_SUBMODULES})


__all__ = [
    "GLM",
    "BudgetExceededError",
    "ClientDP",
    "CodecError",
    "ConvergenceWarning",
    "CoxPH",
    "CoxPHResults",
    "CumulativeIncidence",
    "CumulativeIncidenceResults",
    "DPFedAvg",
    "DeepModelResults",
    "DesignSpec",
    "DisclosureError",
    "DisclosurePolicy",
    "FederatedTrainer",
    "Federation",
    "FedstatsError",
    "FedstatsWarning",
    "FineGray",
    "FineGrayResults",
    "FingerprintMismatchError",
    "FormulaError",
    "GLMResults",
    "HeterogeneityResults",
    "InconsistentColumnError",
    "InvalidReplyError",
    "KaplanMeier",
    "KaplanMeierResults",
    "LinkageResult",
    "LogRankResult",
    "LogisticRegression",
    "LogisticRegressionResults",
    "MessageInventory",
    "MessageRecord",
    "MissingColumnError",
    "MissingValuesError",
    "NoBudgetError",
    "NoEventsError",
    "NonBinaryOutcomeError",
    "PerfectSeparationError",
    "PlannedBudgetError",
    "PrivacyAccount",
    "PrivacyUtilityWarning",
    "Provenance",
    "RecordDP",
    "SecureAggregation",
    "SecureAggregationAborted",
    "SecureSum",
    "SeparationWarning",
    "Silo",
    "SiteDataError",
    "SiteError",
    "SiteUnreachableError",
    "StudyConfigurationError",
    "SurvivalHeterogeneity",
    "SurvivalHorizonWarning",
    "UnknownLevelError",
    "VerticalLogisticRegression",
    "__version__",
    "classification_metrics",
    "concordance_index",
    "datasets",
    "deep",
    "heterogeneity",
    "link",
    "logrank_test",
    "secure_sum",
    "survival_heterogeneity",
]
