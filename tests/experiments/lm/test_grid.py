"""The tuning grid's walks start as FoX at forget-gate bias 2 (fpa.experiments.lm.grid)."""

import math

import torch

from fpa.experiments.lm.grid import FOX2_WALK_BIAS, TUNING_GRID
from fpa.layers import FirstPassageAttention


def test_every_walk_of_the_grid_starts_with_foxs_initial_decay():
    """With the increment head's weights at 0 (the bias alone), the penalty of key j at query i,
    beta * (level_j - min of the field over (j, i]), from the definition, is FoX's initial logit
    bias at bias 2: (i - j) * log sigmoid(2)."""
    fox_decay = -math.log(1.0 / (1.0 + math.exp(-2.0)))  # -log sigmoid(2), per token
    walks = [s for s in TUNING_GRID if s.base == "fpa-walk"]
    assert len(walks) == 4 and all(s.model["fpa"]["walk_bias_init"] == FOX2_WALK_BIAS for s in walks)
    for s in walks:
        opts = {**s.model["fpa"], "field_init_std": 0.0, "level_offset": "none"}  # the offset is apart
        layer = FirstPassageAttention(16, 2, options=opts)
        T = 12
        with torch.no_grad():
            field, level = (t[0].tolist() for t in layer.field_level(torch.randn(1, T, 16)))
            beta = layer.beta.tolist()
        for h in range(2):
            for i in range(T):
                for j in range(i):
                    dip = max(0.0, level[h][j] - min(field[h][k] for k in range(j + 1, i + 1)))
                    assert abs(beta[h] * dip - (i - j) * fox_decay) < 1e-5
