"""Secure aggregation: ring, Shamir shares, cryptography, the pinned roster, and the
site and coordinator halves of the protocol."""
