"""Multi-machine studies on Flower: the same task messages, carried between machines.

The coordinator runs as a Flower ``ServerApp`` (:mod:`fedstats.flower.coordinator_app`),
each site as a ``ClientApp`` on its own SuperNode (:mod:`fedstats.flower.site_app`).
A message's record holds the codec's bytes unchanged (:mod:`fedstats.flower.messages`),
so on the coordinator side Flower is one more ``bytes -> bytes`` transport for
:class:`~fedstats.Federation` (:mod:`fedstats.flower.grid_transport`), and on the
site side every request reaches the site's own :meth:`fedstats.Silo.handle`.
"""
