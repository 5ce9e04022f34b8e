"""Attention ops: First Passage Attention, FoX, and the field utilities.

Imports nothing beyond torch and numpy.
"""

from fpa.ops.dispatch import FOX_BACKENDS, FPA_BACKENDS, first_passage_attention, forgetting_attention
from fpa.ops.field import dip, fox_as_fpa, live_keys, past_min_from_field, range_min, walk

__all__ = [
    "FPA_BACKENDS",
    "FOX_BACKENDS",
    "dip",
    "first_passage_attention",
    "forgetting_attention",
    "fox_as_fpa",
    "live_keys",
    "past_min_from_field",
    "range_min",
    "walk",
]
