"""Site task handlers, one module per model family; registered in :mod:`fedstats.site.registry`."""
