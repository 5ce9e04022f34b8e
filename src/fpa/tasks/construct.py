"""P4 by construction: explicit FPA walk-head parameters, head dimension 1, that attend to the target set.

No training. The layer is a walk ``FirstPassageAttention(V, 1, head_dim=1, options=...)`` on one-hot
token embeddings (hidden size = vocabulary size V). Per token the construction sets:

- the walk increment (``{`` / push / call: +1, ``}`` / pop / return: -1, anything else 0), so the
  field is the nesting depth and a key is live iff its block is still open (P3);
- beta = ``beta`` (a closed key's dip is >= 1, so its logit drops by >= beta);
- a one-dimensional key and query: the query scores target-type keys +C, the other live keys
  <= 0 (scope: declarations of the other variable -C);
- a one-dimensional value: the payload bit (stack, calls) or value / 3 (scope); ``o_proj`` copies
  it to hidden unit 0, which is the prediction.

The head dimension is 1 whatever m and T are.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fpa.layers.attention import FirstPassageAttention
from fpa.layers.options import FPAOptions
from fpa.tasks.nested import ScopeTask, get_task
from fpa.tasks.probe import attention_probs, layer_output

# per task: token -> (increment, key, query sign, value); query sign +-1 for query tokens, 0 else
# (the value of every non-target token is its random bit: only the attention keeps it out)
_PUSH = [(1, 1, 0, 0.0), (1, 1, 0, 1.0)]
_POP = [(-1, -1, 0, 0.0), (-1, -1, 0, 1.0)]
_OTHER = [(0, -1, 0, 0.0), (0, -1, 0, 1.0)]
_QUERY = [(0, -1, 1, 0.0), (0, -1, 1, 1.0)]


def token_table(task: str) -> np.ndarray:
    """(V, 4) float: increment, key, query sign, value per token id of ``task``."""
    t = get_task(task)
    if task == "stack":
        rows = _PUSH + _POP + _QUERY
    elif task == "calls":
        rows = _PUSH + _POP + _OTHER + _QUERY
    else:
        s = ScopeTask
        rows = [(1, 0, 0, 0.0), (-1, 0, 0, 0.0), (0, 0, 0, 0.0)]
        rows += [
            (0, 1 if var == 0 else -1, 0, val / (s.n_values - 1))
            for var in range(s.n_vars)
            for val in range(s.n_values)
        ]
        rows += [(0, 0, 1 if var == 0 else -1, 0.0) for var in range(s.n_vars)]
    table = np.array(rows, dtype=np.float32)
    assert table.shape[0] == t.vocab_size
    return table


@torch.no_grad()
def constructed_head(task: str, beta: float = 40.0, content: float = 20.0) -> FirstPassageAttention:
    """The FPA walk head (hidden = vocabulary size, head_dim 1) realising ``task``'s target sets."""
    table = torch.from_numpy(token_table(task))
    V = table.shape[0]
    layer = FirstPassageAttention(
        V, 1, head_dim=1, options=FPAOptions(mode="walk", walk_increment="linear", level_offset="none")
    )  # field = depth, level = field
    layer.increment_proj.weight.copy_(table[:, 0][None])
    layer.increment_proj.bias.zero_()
    layer.set_beta_(beta)
    layer.k_proj.weight.copy_(table[:, 1][None])
    layer.q_proj.weight.copy_(content * table[:, 2][None])
    layer.v_proj.weight.copy_(table[:, 3][None])
    layer.o_proj.weight.zero_()
    layer.o_proj.weight[0, 0] = 1.0
    return layer


@torch.no_grad()
def constructive_check(
    task: str,
    n: int = 1000,
    ms: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
    length_factors: tuple[int, ...] = (1, 4),
    seed: int = 0,
    chunk: int = 50,
) -> dict:
    """Target mass and accuracy of the constructed head on n random instances per (m, length factor).

    Returns {"task", "n", "min_target_mass", "accuracy", "cells": [{m, length_factor, T, min_mass, accuracy}]}.
    """
    task_obj = get_task(task)
    layer = constructed_head(task)
    rng = np.random.default_rng([seed, 7])
    cells = []
    for m in ms:
        for f in length_factors:
            masses, hits = [], []
            for i in range(0, n, chunk):
                b = task_obj.sample(rng, min(chunk, n - i), m, f)
                x = F.one_hot(torch.from_numpy(b.tokens), task_obj.vocab_size).float()
                probs, v = attention_probs(layer, x)
                masses.append((probs[:, 0, -1] * torch.from_numpy(b.target).float()).sum(-1))
                pred = layer_output(layer, probs, v)[:, -1, 0]
                hits.append((pred - torch.from_numpy(b.answer)).abs() < torch.from_numpy(b.tolerance))
            mass, hit = torch.cat(masses), torch.cat(hits).float()
            cells.append(
                dict(
                    m=m,
                    length_factor=f,
                    T=int(b.tokens.shape[1]),
                    min_mass=float(mass.min()),
                    accuracy=float(hit.mean()),
                )
            )
    return dict(
        task=task,
        n=n,
        head_dim=1,
        min_target_mass=min(c["min_mass"] for c in cells),
        accuracy=min(c["accuracy"] for c in cells),
        cells=cells,
    )
