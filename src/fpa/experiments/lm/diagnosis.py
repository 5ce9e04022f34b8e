"""Why an FPA walk model misses the passkey at 8x: dilution or forgetting.

For each reported FPA walk seed (either walk arm) that passes the 1x control and is below 100% at
8x, on the prompts of its failing (8x, depth) cells
and on the 1x prompts of the same depths: the retrieval head (the (layer, head) whose last-query
attention puts the most mass on the needle at 1x), its attention mass on the needle, and the
needle's penalty beta x dip at the last query (mean over the needle's tokens). A miss is
**forgetting** when the needle's penalty at 8x exceeds its 1x penalty by more than ``FORGET_MARGIN``
(the field dipped below the needle's level between it and the question: its logit is lowered by
more than a factor e), else **dilution** (the needle keeps its logit; the mass is spread over the
longer filler). A model trained under a threshold rule is inspected as served: the keys the rule
has hidden from the last query get no attention mass (the rest renormalised).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from fpa.experiments.lm.presets import ReproducePreset

FORGET_MARGIN = 1.0
MAX_PROMPTS = 8  # failing prompts inspected per seed


@torch.no_grad()
def _head_stats(model, prompt) -> dict:
    """Per (layer, head): needle mass (L, H) and needle penalty (L, H) at the last query."""
    from fpa.eval.example import _capture_inputs
    from fpa.ops.field import dip

    ids = torch.from_numpy(prompt.ids)[None]
    span = slice(prompt.needle_start, prompt.needle_start + prompt.needle_len)
    mass, pen = [], []
    for block, x in zip(model.model.layers, _capture_inputs(model, ids)):
        from fpa.eval.example import fpa_head_maps

        attn = block.attn
        field, level, w = fpa_head_maps(attn, x)
        threshold = getattr(attn, "training_eviction_threshold", None)
        if threshold is not None:
            from fpa.ops.fpa.evicting import hide_from

            groups = attn.num_heads // attn.num_kv_heads
            hidden = hide_from(field[None], level[None], attn.beta.float(), threshold, groups)[0] <= w.shape[-1] - 1
            w = w.masked_fill(hidden, 0.0)
            w = w / w.sum(-1, keepdim=True)
        penalty = attn.beta.float()[:, None] * dip(field, level)[:, -1]  # (H, T)
        mass.append(w[:, span].sum(-1))
        pen.append(penalty[:, span].mean(-1))
    return {"mass": torch.stack(mass).numpy(), "penalty": torch.stack(pen).numpy()}


def diagnose_seed(model_dir: str, p_dict: dict, failing_cells: list[int]) -> dict:
    """Worker entry point: the diagnosis of one model on its failing 8x cells (depth indices)."""
    from fpa.eval.passkey import cell_prompts
    from fpa.experiments.lm.train_eval import load_model

    p = ReproducePreset.from_dict(p_dict)
    model, tok = load_model(model_dir, "cpu")
    L = p.train_len
    rows = []
    for j in failing_cells:
        depth = p.depths[j]
        at1 = [_head_stats(model, q) for q in cell_prompts(tok, L, depth, j, p.trials, p.prompt_seed)]
        at8 = [_head_stats(model, q) for q in cell_prompts(tok, 8 * L, depth, j, p.trials, p.prompt_seed)]
        m1 = np.mean([s["mass"] for s in at1], 0)
        layer, head = np.unravel_index(int(m1.argmax()), m1.shape)
        for s1, s8 in zip(at1, at8):
            pen1, pen8 = float(s1["penalty"][layer, head]), float(s8["penalty"][layer, head])
            rows.append(
                {
                    "depth": depth,
                    "layer": int(layer),
                    "head": int(head),
                    "mass_1x": float(s1["mass"][layer, head]),
                    "mass_8x": float(s8["mass"][layer, head]),
                    "penalty_1x": pen1,
                    "penalty_8x": pen8,
                    "cause": "forgetting" if pen8 > pen1 + FORGET_MARGIN else "dilution",
                }
            )
        if len(rows) >= MAX_PROMPTS:
            break
    causes = [r["cause"] for r in rows]
    return {"prompts": rows, "forgetting": causes.count("forgetting"), "dilution": causes.count("dilution")}


def failing_cells(p: ReproducePreset, grid: dict) -> tuple[list[int], str | None]:
    """(the 8x cells, as depth indices, where a model's passkey ``grid`` misses; why there is
    nothing to diagnose, or None): a model that never learned the task at 1x is not diagnosed, its
    8x miss says nothing about extrapolation."""
    from fpa.experiments.lm.methods import CONTROL

    if 8 not in p.passkey_multiples or 1 not in p.passkey_multiples:
        return [], "the preset evaluates no 1x and 8x lengths"
    i1, i8 = list(p.passkey_multiples).index(1), list(p.passkey_multiples).index(8)
    if sum(grid["correct"][i1]) < CONTROL * p.trials * len(p.depths):
        return [], "below the 1x control"
    failing = [j for j, c in enumerate(grid["correct"][i8]) if c < p.trials]
    return failing, None if failing else "perfect at 8x"


def diagnose_run(model_dir: str, p_dict: dict, grid: dict) -> dict:
    """Worker entry point: the diagnosis of one FPA walk model from its passkey ``grid`` (as
    served), or {"skipped": why} when it is below the 1x control or perfect at 8x."""
    failing, skipped = failing_cells(ReproducePreset.from_dict(p_dict), grid)
    if skipped is not None:
        return {"skipped": skipped}
    return diagnose_seed(model_dir, p_dict, failing)


def collect_diagnosis(runs: list[dict], outputs: dict, run_id: Callable[[dict], str]) -> dict:
    """{run id: diagnosis with its "seed" and "method"} for every run whose ``diagnose-<run>``
    stage output (in ``outputs``) is a diagnosis, not a skip."""
    out = {}
    for r in runs:
        rid = run_id(r)
        d = outputs.get(f"diagnose-{rid}")
        if d is not None and "skipped" not in d:
            out[rid] = {**d, "seed": r["seed"], "method": r["spec"].name}
    return out
