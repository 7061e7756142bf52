"""The Flower apps: a study's jobs (:mod:`fedstats.jobs`) run over Flower (:mod:`fedstats.flower`).

The coordinator runs as a Flower ``ServerApp`` (:mod:`fedstats.flower_apps.coordinator_app`),
each site as a ``ClientApp`` on its own SuperNode (:mod:`fedstats.flower_apps.site_app`,
served by :mod:`fedstats.flower_apps.site_worker`). On the coordinator side Flower is one
more ``bytes -> bytes`` transport for the coordinator's
:class:`~fedstats.models.federation.Federation`
(:mod:`fedstats.flower_apps.grid_transport`, with the study's failure policy), and on the
site side every request reaches the site's own :meth:`fedstats.Silo.handle`.
"""
