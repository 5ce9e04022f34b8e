"""Evaluations and the end-to-end reproduction of the paper's claims.

- ``loss``: per-position loss on held-out data up to several times the training length.
- ``passkey``: passkey retrieval grids (length x depth), full cache or an evicting KV cache.
- ``kv``: the cache policies at matched kept fractions (budgets; thresholds calibrated).
- ``example``: the field, levels, live set and answer-token attention of one passkey prompt.
- ``reproduce``: train the five methods, run every evaluation, write results.json and report.md.
"""
