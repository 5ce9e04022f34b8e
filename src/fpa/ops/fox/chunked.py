"""Query-chunked FoX attention: the bias c_i - c_j (c = cumsum of log forget gates) built per chunk.

Shares the softmax engine with chunked FPA, so the two differ only in their bias.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fpa.ops import cpu_kernels
from fpa.ops.chunked_attention import chunked_backward, chunked_forward

DEFAULT_CHUNK = 128


class _FoXChunkBias:
    def __init__(self, cum: Tensor, Tq: int, want_grad: bool):
        self.cum = cum  # (B, Hkv, G, Tk): cumulative log forget gate
        self.P, self.Tq = cum.shape[-1] - Tq, Tq
        self.fused = cpu_kernels.usable(cum)
        if self.fused:
            self.cum_rows = cum.reshape(-1, cum.shape[-1]).contiguous()  # (B * Hq, Tk)
        if want_grad:
            self.dcum = torch.zeros_like(cum)

    def rows_forward(self, S: Tensor, lse: Tensor, r0: int, r1: int, scale: float) -> None:
        cpu_kernels.fox_rows(S, None, lse, None, self.cum_rows, self.Tq, r0, r1, scale)

    def rows_backward(self, S: Tensor, dP: Tensor, lse: Tensor, delta: Tensor, r0: int, r1: int, scale: float,
                      want: bool) -> None:
        dcum = self.dcum.view(-1, self.dcum.shape[-1]) if want else None
        cpu_kernels.fox_rows(S, dP, lse, delta, self.cum_rows, self.Tq, r0, r1, scale, dcum)

    def bias(self, r0: int, r1: int, keep: bool) -> Tensor:
        P = self.P
        return self.cum[..., P + r0 : P + r1, None] - self.cum[..., None, : P + r1]

    def backward(self, r0: int, r1: int, ds: Tensor) -> None:
        P = self.P
        self.dcum[..., P + r0 : P + r1] += ds.sum(dim=-1)
        self.dcum[..., : P + r1] -= ds.sum(dim=-2)


class FoXChunkedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, log_fgate, scale: float, chunk: int):
        """q (B, Hq, Tq, D); k, v (B, Hkv, Tk, *); log_fgate (B, Hq, Tk) -> (B, Hq, Tq, Dv)."""
        dt = torch.float64 if q.dtype == torch.float64 or log_fgate.dtype == torch.float64 else torch.float32
        B, Hq, Tq, D = q.shape
        Hkv, Tk = k.shape[1], k.shape[2]
        G = Hq // Hkv
        cum = torch.cumsum(log_fgate.to(dt), dim=-1).reshape(B, Hkv, G, Tk)
        out, lse = chunked_forward(q.to(dt).reshape(B, Hkv, G, Tq, D), k.to(dt), v.to(dt), scale, _FoXChunkBias(cum, Tq, False), chunk)
        ctx.save_for_backward(q, k, v, log_fgate, out, lse)
        ctx.scale, ctx.chunk = scale, chunk
        return out.reshape(B, Hq, Tq, -1).to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, log_fgate, out, lse = ctx.saved_tensors
        dt = out.dtype
        B, Hq, Tq, D = q.shape
        Hkv, Tk = k.shape[1], k.shape[2]
        G = Hq // Hkv
        want = ctx.needs_input_grad[3]
        cum = torch.cumsum(log_fgate.to(dt), dim=-1).reshape(B, Hkv, G, Tk)
        bias = _FoXChunkBias(cum, Tq, want)
        dq, dk, dv = chunked_backward(
            q.to(dt).reshape(B, Hkv, G, Tq, D), k.to(dt), v.to(dt), out, lse,
            dout.to(dt).reshape(B, Hkv, G, Tq, -1), ctx.scale, bias, ctx.chunk, want,
        )
        dlog = None
        if want:
            # d/dlogf_u = sum_{t >= u} dcum_t
            dlog = bias.dcum.flip(-1).cumsum(-1).flip(-1).reshape(B, Hq, Tk).to(log_fgate.dtype)
        return dq.reshape(q.shape).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dlog, None, None


def fox_chunked(q: Tensor, k: Tensor, v: Tensor, log_fgate: Tensor, scale: float, chunk: int = DEFAULT_CHUNK) -> Tensor:
    return FoXChunkedFunction.apply(q, k, v, log_fgate, scale, chunk)
