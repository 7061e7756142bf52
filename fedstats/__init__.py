"""fedstats: privacy-accounted biostatistics for multi-site clinical studies.

Sites keep their rows behind a :class:`Silo`; a :class:`Federation` reaches
them only through encoded messages; models such as
:class:`LogisticRegression` combine the sites' aggregates into the answer a
pooled analysis would give.
"""

from fedstats import deep
from fedstats.deep import DeepModelResults, FederatedTrainer
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
    SecureAggregationAborted,
    SeparationWarning,
    SiteDataError,
    SiteError,
    SiteUnreachableError,
    StudyConfigurationError,
    UnknownLevelError,
)
from fedstats.models.client_dp import DPFedAvg
from fedstats.models.cox import CoxPH
from fedstats.models.federation import Federation
from fedstats.models.heterogeneity import (
    HeterogeneityResults,
    SurvivalHeterogeneity,
    heterogeneity,
    survival_heterogeneity,
)
from fedstats.models.inventory import MessageInventory, MessageRecord
from fedstats.models.kaplan_meier import (
    KaplanMeier,
    KaplanMeierResults,
    LogRankResult,
    logrank_test,
)
from fedstats.models.logistic import LogisticRegression
from fedstats.models.privacy import ClientDP, PrivacyAccount, RecordDP
from fedstats.models.results import CoxPHResults, LogisticRegressionResults, Provenance
from fedstats.secagg.coordinator import SecureAggregation, SecureSum, secure_sum
from fedstats.site.design import DesignSpec
from fedstats.site.disclosure import DisclosurePolicy
from fedstats.site.silo import Silo

__version__ = "0.1.0"

__all__ = [
    "BudgetExceededError",
    "ClientDP",
    "CodecError",
    "ConvergenceWarning",
    "CoxPH",
    "CoxPHResults",
    "DPFedAvg",
    "DeepModelResults",
    "DesignSpec",
    "DisclosureError",
    "DisclosurePolicy",
    "FederatedTrainer",
    "Federation",
    "FedstatsError",
    "FedstatsWarning",
    "FingerprintMismatchError",
    "FormulaError",
    "HeterogeneityResults",
    "InconsistentColumnError",
    "InvalidReplyError",
    "KaplanMeier",
    "KaplanMeierResults",
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
    "UnknownLevelError",
    "__version__",
    "deep",
    "heterogeneity",
    "logrank_test",
    "secure_sum",
    "survival_heterogeneity",
]
