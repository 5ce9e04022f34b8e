"""Query-chunked FoX attention: the bias c_i - c_j (c = cumsum of log forget gates) built per chunk.

Shares the softmax engine with chunked FPA, so the two differ only in their bias.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fpa.ops.chunked_attention import chunked_backward, chunked_forward
from fpa.ops.cpu_kernels import calls, loader

DEFAULT_CHUNK = 64


class _FoXChunkBias:
    def __init__(self, cum: Tensor, Tq: int, want_grad: bool):
        self.cum = cum  # (B, Hkv, G, Tk): cumulative log forget gate
        self.P, self.Tq = cum.shape[-1] - Tq, Tq
        self.fused = loader.usable(cum)
        if self.fused:
            self.cum_rows = cum.reshape(-1, cum.shape[-1]).contiguous()  # (B * Hq, Tk)
        if want_grad:
            self.dcum = cum.new_zeros(cum.shape)

    def rows_forward(self, S: Tensor, lse: Tensor, r0: int, r1: int, scale: float) -> None:
        calls.fox_rows(S, None, lse, None, self.cum_rows, self.Tq, r0, r1, scale, lib=loader.require())

    def whole(
        self,
        q5: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor | None,
        dout: Tensor | None,
        lse: Tensor,
        delta: Tensor | None,
        grads: tuple | None,
        chunk: int,
        scale: float,
        want: bool,
    ) -> None:
        dq, dk, dv = grads if grads is not None else (None, None, None)
        dcum = self.dcum.view(-1, self.dcum.shape[-1]) if want else None
        calls.fox_whole(
            q5, k, v, out, dout, lse, delta, dq, dk, dv, self.cum_rows, chunk, scale, dcum, lib=loader.require()
        )

    def rows_backward(
        self, S: Tensor, dP: Tensor, lse: Tensor, delta: Tensor, r0: int, r1: int, scale: float, want: bool
    ) -> None:
        dcum = self.dcum.view(-1, self.dcum.shape[-1]) if want else None
        calls.fox_rows(S, dP, lse, delta, self.cum_rows, self.Tq, r0, r1, scale, dcum, lib=loader.require())

    def bias(self, r0: int, r1: int, keep: bool) -> Tensor:
        P = self.P
        return self.cum[..., P + r0 : P + r1, None] - self.cum[..., None, : P + r1]

    def backward(self, r0: int, r1: int, ds: Tensor) -> None:
        P = self.P
        self.dcum[..., P + r0 : P + r1] += ds.sum(dim=-1)
        self.dcum[..., : P + r1] -= ds.sum(dim=-2)


def _math_dtype(q: Tensor, log_fgate: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 or log_fgate.dtype == torch.float64 else torch.float32


# Custom ops, like fpa.ops.fpa.chunked: opaque to torch.compile (no graph break, same kernels).
@torch.library.custom_op("fpa::fox_chunked_forward", mutates_args=())
def _forward_op(q: Tensor, k: Tensor, v: Tensor, log_fgate: Tensor, scale: float, chunk: int) -> tuple[Tensor, Tensor]:
    """-> out (B, Hq, Tq, Dv) and lse (B, Hq, Tq) in the math dtype."""
    dt = _math_dtype(q, log_fgate)
    B, Hq, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    cum = torch.cumsum(log_fgate.to(dt), dim=-1).reshape(B, Hkv, G, Tk)
    bias = _FoXChunkBias(cum, Tq, False)
    out, lse = chunked_forward(q.to(dt).reshape(B, Hkv, G, Tq, D), k.to(dt), v.to(dt), scale, bias, chunk)
    return out.reshape(B, Hq, Tq, -1), lse.reshape(B, Hq, Tq)


@_forward_op.register_fake
def _(q, k, v, log_fgate, scale, chunk):
    dt = _math_dtype(q, log_fgate)
    B, Hq, Tq, _ = q.shape
    return q.new_empty(B, Hq, Tq, v.shape[-1], dtype=dt), q.new_empty(B, Hq, Tq, dtype=dt)


@torch.library.custom_op("fpa::fox_chunked_backward", mutates_args=())
def _backward_op(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_fgate: Tensor,
    out: Tensor,
    lse: Tensor,
    scale: float,
    chunk: int,
    want: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """-> dq, dk, dv, dlog_fgate (zero unless want) in the inputs' dtypes."""
    dt = out.dtype
    B, Hq, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    cum = torch.cumsum(log_fgate.to(dt), dim=-1).reshape(B, Hkv, G, Tk)
    bias = _FoXChunkBias(cum, Tq, want)
    do5 = dout.to(dt).reshape(B, Hkv, G, Tq, -1)
    dq, dk, dv = chunked_backward(
        q.to(dt).reshape(B, Hkv, G, Tq, D),
        k.to(dt),
        v.to(dt),
        out.reshape(do5.shape),
        lse.reshape(do5.shape[:-1]),
        do5,
        scale,
        bias,
        chunk,
        want,
    )
    if want:
        # d/dlogf_u = sum_{t >= u} dcum_t
        dlog = bias.dcum.flip(-1).cumsum(-1).flip(-1).reshape(B, Hq, Tk).to(log_fgate.dtype)
    else:
        dlog = log_fgate.new_zeros(log_fgate.shape)
    return dq.reshape(q.shape).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dlog


@_backward_op.register_fake
def _(dout, q, k, v, log_fgate, out, lse, scale, chunk, want):
    return tuple(
        x.new_empty(x.shape)
        for x in (q, k, v, log_fgate)  # contiguous, like the real outputs
    )


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, log_fgate, scale, chunk = inputs
    ctx.save_for_backward(q, k, v, log_fgate, *output)
    ctx.scale, ctx.chunk = scale, chunk


def _backward(ctx, dout: Tensor, dlse: Tensor | None):
    q, k, v, log_fgate, out, lse = ctx.saved_tensors
    grads = _backward_op(dout, q, k, v, log_fgate, out, lse, ctx.scale, ctx.chunk, ctx.needs_input_grad[3])
    return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad[:4])), None, None)


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def fox_chunked(q: Tensor, k: Tensor, v: Tensor, log_fgate: Tensor, scale: float, chunk: int = DEFAULT_CHUNK) -> Tensor:
    """q (B, Hq, Tq, D); k, v (B, Hkv, Tk, *); log_fgate (B, Hq, Tk) -> (B, Hq, Tq, Dv) in q's dtype."""
    out, _ = _forward_op(q, k, v, log_fgate, float(scale), int(chunk))
    return out.to(q.dtype)
