"""Site-side data preparation: the analysis-frame contract every site meets.

So far: the study specification (:class:`StudySpec`, read from TOML and
validated field by field) and the site fingerprint (column names, kinds,
declared levels and units), which lets a coordinator refuse to combine
incompatible sites before any data is touched. Readers for FHIR R4 and OMOP
CDM build the analysis frame the specification defines.
"""

from harmonize.errors import HarmonizationError, SpecError
from harmonize.fingerprint import ColumnFingerprint, SiteFingerprint, fingerprint_frame
from harmonize.spec import ConceptSet, Covariate, StudySpec, load_spec, parse_spec

__all__ = [
    "ColumnFingerprint",
    "ConceptSet",
    "Covariate",
    "HarmonizationError",
    "SiteFingerprint",
    "SpecError",
    "StudySpec",
    "fingerprint_frame",
    "load_spec",
    "parse_spec",
]
