"""The ``fedstats`` command; nothing imports it."""
