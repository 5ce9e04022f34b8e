"""One passkey prompt seen from inside an FPA model: field, levels, live set, answer attention."""

from __future__ import annotations

import math

import numpy as np
import torch

from fpa.eval.decode import greedy_decode
from fpa.ops.field import dip
from fpa.tasks.passkey import make_prompt, max_answer_tokens


def _capture_inputs(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """The normalised hidden states (1, T, hidden) entering every attention module."""
    seen, hooks = [], []
    for block in model.model.layers:
        hooks.append(block.attn.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach())))
    try:
        model(input_ids=ids)
    finally:
        for h in hooks:
            h.remove()
    return seen


def fpa_head_maps(attn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For an FPA attention module and its input x (1, T, hidden): field, level (H, T) and the
    attention weights of the last query over every key (H, T)."""
    field, level = attn.field_level(x)
    field, level = field[0], level[0]
    q, k, _ = attn.project(x)
    k = k.repeat_interleave(attn.num_heads // attn.num_kv_heads, 1)
    last = q[0, :, -1].float()  # (H, D)
    s = torch.einsum("hd,htd->ht", last, k[0].float()) / math.sqrt(q.shape[-1])
    s = s - attn.beta.float()[:, None] * dip(field, level)[:, -1]
    return field, level, torch.softmax(s, -1)


@torch.no_grad()
def passkey_example(model, tokenizer, length: int, depth: float, seed: int = 0) -> dict:
    """Run one passkey prompt through an FPA model and pick the (layer, head) whose answer-token
    attention puts the most weight on the needle. Returns JSON-able lists: ids, key,
    needle_start/needle_len, generated text, layer, head, field, level, attention (all (T,)),
    and needle_mass (that head's attention weight on the needle)."""
    if getattr(model.config, "attention", None) != "fpa":
        raise ValueError(f"model must have attention='fpa', got {getattr(model.config, 'attention', None)!r}")
    prompt = make_prompt(tokenizer, length, depth, np.random.default_rng([seed, length]))
    ids = torch.from_numpy(prompt.ids)[None]
    model.eval()
    inputs = _capture_inputs(model, ids)
    span = slice(prompt.needle_start, prompt.needle_start + prompt.needle_len)
    best: tuple[float, int, int, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    for i, (block, x) in enumerate(zip(model.model.layers, inputs)):
        field, level, w = fpa_head_maps(block.attn, x)
        mass = w[:, span].sum(-1)
        h = int(mass.argmax())
        if best is None or float(mass[h]) > best[0]:
            best = (float(mass[h]), i, h, field[h], level[h], w[h])
    if best is None:
        raise ValueError("model has no attention layers")
    new, _ = greedy_decode(model, ids, max_answer_tokens(tokenizer, len(prompt.key)))
    needle_mass, layer, head, best_field, best_level, best_w = best
    return {
        "ids": prompt.ids.tolist(),
        "key": prompt.key,
        "depth": float(depth),
        "needle_start": prompt.needle_start,
        "needle_len": prompt.needle_len,
        "generated": tokenizer.decode(new[0].tolist()),
        "layer": layer,
        "head": head,
        "needle_mass": needle_mass,
        "field": best_field.tolist(),
        "level": best_level.tolist(),
        "attention": best_w.tolist(),
    }
