"""Evaluations of a trained model (the end-to-end reproduction that runs them is fpa.experiments.lm.reproduce).

- ``loss``: per-position loss on held-out data up to several times the training length.
- ``passkey``: passkey retrieval grids (length x depth), full cache or an evicting KV cache.
- ``kv``: the cache policies by short name: budget policies at a kept fraction, the model's own
  threshold rule at fixed thresholds.
- ``curves``: passkey accuracy against the kept fraction, one curve per policy.
- ``growth``: kept keys against context length (the exponent of an evicting cache's growth).
- ``example``: the field, levels, live set and answer-token attention of one passkey prompt.
- ``decode``: greedy decoding with a cache and chunked prefill.
- ``kvpress_grid``: passkey under kvpress presses, the external baselines.
"""
