"""Privacy accounting: units of privacy and neighbouring relations.

Every budget and every charge names its unit of privacy (a patient for
record-level privacy at a site, a site for client-level privacy across a
federation) and its neighbouring relation, which map onto
``dp_accounting``'s own. Accountants and the durable ledger build on these.
"""

from accounting.units import Neighbouring, PrivacyUnit

__all__ = ["Neighbouring", "PrivacyUnit"]
