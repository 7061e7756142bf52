"""Combining the sites' model updates: the weighted mean and robust alternatives.

The rules are part of the contract both sides share
(:mod:`fedstats.contract.aggregation`, where they are described): an exact training names
its rule in every round, and sites that verify paths re-derive the next network with it.
"""

from fedstats.contract.aggregation import (
    Aggregator,
    CoordinateMedian,
    Mean,
    NormBounded,
    TrimmedMean,
)

__all__ = ["Aggregator", "CoordinateMedian", "Mean", "NormBounded", "TrimmedMean"]
