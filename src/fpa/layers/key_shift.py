"""Key shift: each key mixed with the key of the token before it by a learned per-head gate.

k'_t = (1 - a_t) k_t + a_t k_prev(t), a_t = sigmoid(w_h . x_t + b_h) per KV head and token, where
k_prev(t) is the key of the latest real token before t (zero before the first one). A key then
carries its predecessor: a query can find "the token after X" in one attention hop, which a
one-layer copy or lookup otherwise needs two layers for (FoX's "Pro" block shifts keys the same
way). Padding tokens are skipped: they are never a predecessor. Keys are shifted before the
qk-norm and position encoding, as projections.
"""

from __future__ import annotations

import torch
from torch import Tensor


def shift_keys(
    k: Tensor, gate: Tensor, prev: Tensor | None = None, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Shift keys k (B, H, T, D) by the gate a (B, H, T) in [0, 1].

    prev (B, H, D): the key of the latest real token before these T (a decoding cache's carry;
    None: zero, the start of a sequence). mask (B, T) bool, False at padding tokens (never a
    predecessor; their own output is unused). Computed in float32 or wider. Returns (k' (B, H, T, D)
    in k's dtype, the carry for the next call (B, H, D): the key of the latest real token, or
    ``prev`` if there was none).
    """
    B, H, T, D = k.shape
    if prev is None:
        prev = k.new_zeros(B, H, D)
    ext = torch.cat([prev[:, :, None].to(k.dtype), k], 2)  # slot 0: the carry, slot t + 1: token t
    if mask is None:
        before, carry = ext[:, :, :-1], ext[:, :, -1]
    else:
        # latest real slot at or before t, then shifted one step: the predecessor's slot
        slot = torch.arange(1, T + 1, device=k.device) * mask.to(device=k.device, dtype=torch.long)
        latest = torch.cummax(slot, -1).values  # (B, T)
        pred = torch.cat([latest.new_zeros(B, 1), latest[:, :-1]], -1)
        idx = pred[:, None, :, None].expand(B, H, T, D)
        before = ext.gather(2, idx)
        carry = ext.gather(2, latest[:, None, -1:, None].expand(B, H, 1, D))[:, :, 0]
    dt = torch.promote_types(k.dtype, torch.float32)  # float32 sums for half-precision keys
    a = gate.to(dt)[..., None]
    out = (1 - a) * k.to(dt) + a * before.to(dt)
    return out.to(k.dtype), carry
