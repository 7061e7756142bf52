"""The silo boundary: the only code that touches a site's rows, its rules and its task handlers."""
