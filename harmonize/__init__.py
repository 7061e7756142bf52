"""Site-side data preparation: the analysis-frame contract every site meets.

So far: the site fingerprint (column names, kinds, declared levels and
units), which lets a coordinator refuse to combine incompatible sites before
any data is touched. Readers for FHIR R4 and OMOP CDM and the study
specification build on it.
"""

from harmonize.fingerprint import ColumnFingerprint, SiteFingerprint, fingerprint_frame

__all__ = ["ColumnFingerprint", "SiteFingerprint", "fingerprint_frame"]
