"""Query-chunked FPA (FPA.md section 5) with a hand-written backward. CPU path and GPU fallback.

For the query chunk [r0, r1) (new-position coordinates) and a key j before the chunk,
    M(i, j) = min(A_j, Pc_i),  A_j = min of the field after j up to r0 - 1 (the past keys'
    past_min folded in), Pc_i = min of the field over [r0, i];
for keys inside the chunk, a local chunk x chunk cumulative minimum. The backward routes
each active penalty's gradient to the argmin of whichever term was the minimum, and to the
level. Ties are broken towards the later term (Pc over A, past_min over the field); any
choice is a valid subgradient and the totals over tied positions agree.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fpa.ops import cpu_kernels
from fpa.ops.chunked_attention import chunked_backward, chunked_forward

DEFAULT_CHUNK = 128


class _FPAChunkBias:
    """-beta * dip for one query chunk. Tensors in the grouped layout (B, Hkv, G, ...)."""

    def __init__(self, field: Tensor, past_min: Tensor, level: Tensor, beta: Tensor, want_grad: bool):
        self.field = field  # (B, Hkv, G, Tq): the field at the query positions
        self.past_min = past_min  # (B, Hkv, G, P)
        self.level = level  # (B, Hkv, G, Tk)
        self.beta = beta  # (1, Hkv, G, 1, 1)
        self.Tq, self.P = field.shape[-1], past_min.shape[-1]
        self.fused = cpu_kernels.usable(field, past_min, level, beta)
        if self.fused:  # row-block layout (B * Hq, n) of the C++ rows
            bh = field.shape[0] * field.shape[1] * field.shape[2]
            self.rows = [x.reshape(bh, x.shape[-1]).contiguous() for x in (field, past_min, level)]
            self.beta_h = beta.reshape(-1).contiguous()  # (Hq,)
        if want_grad:
            # Gradient of the "virtual" vector [field | past_min]: every minimum comes from one of them.
            self.dvirtual = field.new_zeros(*field.shape[:-1], self.Tq + self.P)
            self.dlevel = torch.zeros_like(level)
            self.dbeta = torch.zeros_like(beta)
            if self.fused:
                self.dbeta_bh = torch.zeros(self.rows[0].shape[0], dtype=torch.float64)
        self._kept: tuple | None = None

    def rows_forward(self, S: Tensor, lse: Tensor, r0: int, r1: int, scale: float) -> None:
        f, pm, lv = self.rows
        cpu_kernels.fpa_rows(S, None, lse, None, f, pm, lv, self.beta_h, self.beta_h.shape[0], r0, r1, scale)

    def rows_backward(self, S: Tensor, dP: Tensor, lse: Tensor, delta: Tensor, r0: int, r1: int, scale: float,
                      want: bool) -> None:
        f, pm, lv = self.rows
        grads = None
        if want:
            grads = (self.dvirtual.view(lv.shape[0], -1), self.dlevel.view(lv.shape), self.dbeta_bh)
        cpu_kernels.fpa_rows(S, dP, lse, delta, f, pm, lv, self.beta_h, self.beta_h.shape[0], r0, r1, scale, grads)

    def finish_grads(self) -> None:
        """Fold the fused path's per-(batch, head) beta gradient into dbeta (1, Hkv, G, 1, 1)."""
        if self.fused:
            B = self.field.shape[0]
            self.dbeta = self.dbeta_bh.view(B, -1).sum(0).to(self.dbeta.dtype).view(self.dbeta.shape)

    def _before_chunk(self, r0: int) -> tuple[Tensor, Tensor]:
        """A (..., P + r0): field minimum after each earlier key up to r0 - 1; src: its index in [field | past_min]."""
        Tq, P = self.Tq, self.P
        dev = self.field.device
        past_src = (Tq + torch.arange(P, device=dev)).expand_as(self.past_min)
        if r0 == 0:
            return self.past_min, past_src
        rev = torch.cummin(self.field[..., :r0].flip(-1), dim=-1)
        suffix = rev.values.flip(-1)  # min_{j <= t < r0}
        suffix_src = (r0 - 1 - rev.indices).flip(-1)
        inf = torch.full_like(suffix[..., :1], float("inf"))
        new_vals = torch.cat([suffix[..., 1:], inf], dim=-1)
        new_src = torch.cat([suffix_src[..., 1:], torch.zeros_like(suffix_src[..., :1])], dim=-1)
        whole_min, whole_src = suffix[..., :1], suffix_src[..., :1]
        take_past = self.past_min <= whole_min
        past_vals = torch.where(take_past, self.past_min, whole_min)
        past_src = torch.where(take_past, past_src, whole_src)
        return torch.cat([past_vals, new_vals], dim=-1), torch.cat([past_src, new_src], dim=-1)

    def bias(self, r0: int, r1: int, keep: bool) -> Tensor:
        c, P = r1 - r0, self.P
        K, n_before = P + r1, P + r0
        a_vals, a_src = self._before_chunk(r0)
        chunk_field = self.field[..., r0:r1]
        pc = torch.cummin(chunk_field, dim=-1)
        # Local minima, built key-major (j, t) so the cummin runs along the contiguous last dim
        # (a cummin along dim -2 is several times slower on CPU); read back transposed as (i, j).
        after = torch.ones(c, c, dtype=torch.bool, device=chunk_field.device).triu(1)  # (j, t): t > j
        x = torch.where(after, chunk_field[..., None, :], torch.full((), float("inf"), dtype=chunk_field.dtype, device=chunk_field.device))
        local_vals, local_idx = torch.cummin(x, dim=-1)
        local_vals, local_idx = local_vals.transpose(-1, -2), local_idx.transpose(-1, -2)
        m = torch.empty(*chunk_field.shape[:-1], c, K, dtype=chunk_field.dtype, device=chunk_field.device)
        torch.minimum(a_vals[..., None, :], pc.values[..., :, None], out=m[..., :n_before])
        m[..., n_before:] = local_vals
        neg_dip = m.sub_(self.level[..., None, :K]).clamp_(max=0)  # -dip, in place
        if keep:
            self._kept = (r0, r1, neg_dip, a_vals, a_src, pc.values, pc.indices, local_idx)
            return neg_dip * self.beta
        return neg_dip.mul_(self.beta)

    def backward(self, r0: int, r1: int, ds: Tensor) -> None:
        kr0, kr1, neg_dip, a_vals, a_src, pc_vals, pc_idx, local_idx = self._kept
        assert (kr0, kr1) == (r0, r1), "backward must follow bias(keep=True) for the same chunk"
        self._kept = None
        K, n_before = self.P + r1, self.P + r0
        self.dbeta += (ds * neg_dip).sum(dim=(0, 3, 4), keepdim=True)
        g = ds.mul_(self.beta).masked_fill_(neg_dip == 0, 0.0)  # dLoss/dM, reusing ds
        self.dlevel[..., :K] -= g.sum(dim=-2)
        g_before, g_local = g[..., :n_before], g[..., n_before:]
        to_a = a_vals[..., None, :] < pc_vals[..., :, None]
        g_to_a = g_before * to_a
        self.dvirtual.scatter_add_(-1, a_src, g_to_a.sum(dim=-2))
        self.dvirtual.scatter_add_(-1, pc_idx + r0, g_before.sum(dim=-1) - g_to_a.sum(dim=-1))
        self.dvirtual.scatter_add_(-1, (local_idx + r0).flatten(-2), g_local.flatten(-2))


class FPAChunkedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, field, level, past_min, beta, scale: float, chunk: int):
        """q (B, Hq, Tq, D); k, v (B, Hkv, Tk, *); field (B, Hq, Tq); level (B, Hq, Tk);
        past_min (B, Hq, Tk - Tq); beta (Hq,). Returns (B, Hq, Tq, Dv) in q's dtype."""
        dt = torch.float64 if q.dtype == torch.float64 or field.dtype == torch.float64 else torch.float32
        B, Hq, Tq, D = q.shape
        Hkv = k.shape[1]
        G = Hq // Hkv
        q5 = q.to(dt).reshape(B, Hkv, G, Tq, D)
        kk, vv = k.to(dt), v.to(dt)
        grouped = [x.to(dt).reshape(B, Hkv, G, x.shape[-1]) for x in (field, past_min, level)]
        b5 = beta.to(dt).reshape(1, Hkv, G, 1, 1)
        bias = _FPAChunkBias(*grouped, b5, want_grad=False)
        out, lse = chunked_forward(q5, kk, vv, scale, bias, chunk)
        ctx.save_for_backward(q, k, v, field, level, past_min, beta, out, lse)
        ctx.scale, ctx.chunk = scale, chunk
        return out.reshape(B, Hq, Tq, -1).to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, field, level, past_min, beta, out, lse = ctx.saved_tensors
        dt = out.dtype
        B, Hq, Tq, D = q.shape
        Hkv = k.shape[1]
        G = Hq // Hkv
        q5 = q.to(dt).reshape(B, Hkv, G, Tq, D)
        grouped = [x.to(dt).reshape(B, Hkv, G, x.shape[-1]) for x in (field, past_min, level)]
        b5 = beta.to(dt).reshape(1, Hkv, G, 1, 1)
        bias_grad = any(ctx.needs_input_grad[3:7])
        bias = _FPAChunkBias(*grouped, b5, want_grad=bias_grad)
        do5 = dout.to(dt).reshape(B, Hkv, G, Tq, -1)
        dq, dk, dv = chunked_backward(q5, k.to(dt), v.to(dt), out, lse, do5, ctx.scale, bias, ctx.chunk, bias_grad)
        dfield = dpast = dlevel = dbeta = None
        if bias_grad:
            bias.finish_grads()
            dfield = bias.dvirtual[..., :Tq].reshape(B, Hq, Tq).to(field.dtype)
            dpast = bias.dvirtual[..., Tq:].reshape(B, Hq, -1).to(past_min.dtype)
            dlevel = bias.dlevel.reshape(B, Hq, -1).to(level.dtype)
            dbeta = bias.dbeta.reshape(Hq).to(beta.dtype)
        return (dq.reshape(q.shape).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dfield, dlevel, dpast, dbeta, None, None)


def fpa_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    field: Tensor,
    level: Tensor,
    past_min: Tensor,
    beta: Tensor,
    scale: float,
    chunk: int = DEFAULT_CHUNK,
) -> Tensor:
    """Chunked FPA in the cache form: field (B, Hq, Tq) at the query positions, past_min (B, Hq, Tk - Tq)."""
    return FPAChunkedFunction.apply(q, k, v, field, level, past_min, beta, scale, chunk)
