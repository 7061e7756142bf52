"""The site half of federated deep models: the ``deep.train`` and ``deep.evaluate`` handlers.

Served as a plugin of the site registry (:data:`fedstats.site.registry.DEEP_TASKS`),
imported the first time a deep task is asked for, so a site without the ``deep``
extra never imports torch. A site trains on its own rows (:mod:`.local_training`,
record-level DP-SGD in :mod:`.dp_sgd`) and replies the flat update; it imports
nothing of the coordinator.
"""
