"""The coordinator half of federated deep models: rounds, aggregation, privacy plans, results.

:class:`~fedstats.deep.training.trainer.FederatedTrainer` asks the sites for local
training rounds through a :class:`~fedstats.models.federation.Federation` and
combines their updates; it imports nothing of the site.
"""
