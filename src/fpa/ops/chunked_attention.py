"""Query-chunked causal softmax attention with a per-chunk additive bias (forward and backward).

The engine shared by the chunked FPA and FoX paths, so the two differ only in their bias.
Layout: queries are grouped by key/value head, q (B, Hkv, G, Tq, D) with G = Hq // Hkv, and
the queries are the last Tq of Tk positions (P = Tk - Tq earlier keys). For the query chunk
[r0, r1) the keys are [0, P + r1), the last (r1 - r0) of them on the diagonal.

The forward keeps only the output and the log-sum-exp (O(B*H*T)); the backward recomputes
each chunk's scores. Peak extra memory is O(B * H * chunk * T), never O(T^2).

Two paths. Fused (float32/float64 on CPU, fpa.ops.cpu_kernels built): per chunk, torch's GEMMs
write raw scores into one preallocated buffer and one C++ pass per row adds the bias, takes the
softmax (and in the backward dS and the bias gradients), in place. Torch ops (any other device or
dtype, or FPA_CPU_KERNEL=0): the bias object builds the (chunk x keys) bias with tensor ops.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from fpa.ops.cpu_kernels import loader


class ChunkBias(Protocol):
    """Additive bias for one query chunk, with its gradient."""

    fused: bool  # True: use rows_forward / rows_backward (fused C++ rows) instead of bias / backward

    def bias(self, r0: int, r1: int, keep: bool) -> Tensor:
        """(B, Hkv, G, r1 - r0, P + r1). With keep=True, the next backward() call is for this chunk."""
        ...

    def backward(self, r0: int, r1: int, ds: Tensor) -> None:
        """Take ds = dLoss/dbias (B, Hkv, G, r1 - r0, P + r1) of the chunk last built with keep=True."""
        ...

    def rows_forward(self, S: Tensor, lse: Tensor, r0: int, r1: int, scale: float) -> None:
        """S (B*Hq, c, K) raw q.k -> softmax probabilities in place; writes lse (B*Hq, Tq) rows r0:r1."""
        ...

    def rows_backward(
        self, S: Tensor, dP: Tensor, lse: Tensor, delta: Tensor, r0: int, r1: int, scale: float, want: bool
    ) -> None:
        """S -> P and dP (raw dO.v) -> dS in place; with want, accumulate the bias's own gradients."""
        ...

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
        """The whole op in C++ (fpa.ops.cpu_kernels.calls.*_whole): forward when dout is None, else backward."""
        ...


def _diagonal_mask(c: int, device: torch.device) -> Tensor:
    return torch.ones(c, c, dtype=torch.bool, device=device).triu(1)


def _chunk_scores(q5: Tensor, k: Tensor, r0: int, r1: int, P: int, scale: float, bias: ChunkBias, keep: bool) -> Tensor:
    B, Hkv, G, _, D = q5.shape
    c, K = r1 - r0, P + r1
    qc = q5[:, :, :, r0:r1].reshape(B, Hkv, G * c, D)
    s = torch.matmul(qc, k[:, :, :K].transpose(-1, -2)).view(B, Hkv, G, c, K)
    s.mul_(scale).add_(bias.bias(r0, r1, keep))
    s[..., K - c :].masked_fill_(_diagonal_mask(c, s.device), float("-inf"))
    return s


def chunked_forward(
    q5: Tensor, k: Tensor, v: Tensor, scale: float, bias: ChunkBias, chunk: int
) -> tuple[Tensor, Tensor]:
    """q5 (B, Hkv, G, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv) -> out (B, Hkv, G, Tq, Dv), lse (B, Hkv, G, Tq)."""
    if bias.fused:
        return _fused_forward(q5, k, v, scale, bias, chunk)
    B, Hkv, G, Tq, _ = q5.shape
    Tk, Dv = k.shape[2], v.shape[3]
    P = Tk - Tq
    out = q5.new_empty(B, Hkv, G, Tq, Dv)
    lse = q5.new_empty(B, Hkv, G, Tq)
    for r0 in range(0, Tq, chunk):
        r1 = min(r0 + chunk, Tq)
        c, K = r1 - r0, P + r1
        s = _chunk_scores(q5, k, r0, r1, P, scale, bias, keep=False)
        m = s.amax(dim=-1, keepdim=True)
        p = s.sub_(m).exp_()
        denom = p.sum(dim=-1, keepdim=True)
        o = torch.matmul(p.view(B, Hkv, G * c, K), v[:, :, :K]).view(B, Hkv, G, c, Dv)
        out[:, :, :, r0:r1] = o / denom
        lse[:, :, :, r0:r1] = (m + denom.log()).squeeze(-1)
    return out, lse


def chunked_backward(
    q5: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    dout: Tensor,
    scale: float,
    bias: ChunkBias,
    chunk: int,
    bias_needs_grad: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (dq5, dk, dv) in the layouts of q5, k, v; the bias's own gradients go to bias.backward()."""
    if bias.fused:
        return _fused_backward(q5, k, v, out, lse, dout, scale, bias, chunk, bias_needs_grad)
    B, Hkv, G, Tq, D = q5.shape
    Tk, Dv = k.shape[2], v.shape[3]
    P = Tk - Tq
    delta = (dout * out).sum(dim=-1)  # (B, Hkv, G, Tq)
    dq = q5.new_empty(q5.shape)  # contiguous whatever the inputs' strides (the custom ops' fakes say so)
    dk = k.new_zeros(k.shape)
    dv = v.new_zeros(v.shape)
    for r0 in range(0, Tq, chunk):
        r1 = min(r0 + chunk, Tq)
        c, K = r1 - r0, P + r1
        s = _chunk_scores(q5, k, r0, r1, P, scale, bias, keep=bias_needs_grad)
        p = s.sub_(lse[:, :, :, r0:r1, None]).exp_()  # (B, Hkv, G, c, K)
        do_c = dout[:, :, :, r0:r1].reshape(B, Hkv, G * c, Dv)
        p_flat = p.view(B, Hkv, G * c, K)
        dv[:, :, :K] += torch.matmul(p_flat.transpose(-1, -2), do_c)
        dp = torch.matmul(do_c, v[:, :, :K].transpose(-1, -2)).view(B, Hkv, G, c, K)
        ds = dp.sub_(delta[:, :, :, r0:r1, None]).mul_(p)
        ds_flat = ds.view(B, Hkv, G * c, K)
        dq[:, :, :, r0:r1] = torch.matmul(ds_flat, k[:, :, :K]).view(B, Hkv, G, c, D) * scale
        qc = q5[:, :, :, r0:r1].reshape(B, Hkv, G * c, D)
        dk[:, :, :K] += torch.matmul(ds_flat.transpose(-1, -2), qc) * scale
        if bias_needs_grad:
            bias.backward(r0, r1, ds)
    return dq, dk, dv


# ---- fused path: GEMMs in torch, everything between them in one C++ pass per row ----


def _flat(x: Tensor, n: int) -> Tensor:
    """(B, Hkv, T, n) -> (B * Hkv, T, n), a view when possible."""
    return x.reshape(-1, x.shape[-2], n)


def _fused_forward(
    q5: Tensor, k: Tensor, v: Tensor, scale: float, bias: ChunkBias, chunk: int
) -> tuple[Tensor, Tensor]:
    B, Hkv, G, Tq, D = q5.shape
    Tk, Dv = k.shape[2], v.shape[3]
    P, BH = Tk - Tq, B * Hkv * G
    out = q5.new_empty(B, Hkv, G, Tq, Dv)
    lse = q5.new_empty(BH, Tq)
    if loader.whole_usable(B * Hkv):  # one parallel region for the whole op, GEMMs per (batch, kv head)
        bias.whole(q5.contiguous(), k.contiguous(), v.contiguous(), out, None, lse, None, None, chunk, scale, False)
        return out, lse.view(B, Hkv, G, Tq)
    k3, v3 = _flat(k, D), _flat(v, Dv)
    buf = q5.new_empty(BH * min(chunk, Tq) * Tk)
    for r0 in range(0, Tq, chunk):
        r1 = min(r0 + chunk, Tq)
        c, K = r1 - r0, P + r1
        qc = q5[:, :, :, r0:r1].reshape(B * Hkv, G * c, D)
        S = buf[: BH * c * K].view(B * Hkv, G * c, K)
        torch.bmm(qc, k3[:, :K].transpose(1, 2), out=S)
        bias.rows_forward(S.view(BH, c, K), lse, r0, r1, scale)
        out[:, :, :, r0:r1] = torch.bmm(S, v3[:, :K]).view(B, Hkv, G, c, Dv)
    return out, lse.view(B, Hkv, G, Tq)


def _fused_backward(
    q5: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    dout: Tensor,
    scale: float,
    bias: ChunkBias,
    chunk: int,
    want: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    B, Hkv, G, Tq, D = q5.shape
    Tk, Dv = k.shape[2], v.shape[3]
    P, BH = Tk - Tq, B * Hkv * G
    delta = (dout * out).sum(dim=-1).reshape(BH, Tq)
    lse2 = lse.reshape(BH, Tq).contiguous()
    if loader.whole_usable(B * Hkv):
        dq, dk, dv = q5.new_empty(q5.shape), k.new_zeros(k.shape), v.new_zeros(v.shape)
        bias.whole(
            q5.contiguous(),
            k.contiguous(),
            v.contiguous(),
            None,
            dout.contiguous(),
            lse2,
            delta,
            (dq, dk, dv),
            chunk,
            scale,
            want,
        )
        return dq, dk, dv
    k3, v3 = _flat(k, D), _flat(v, Dv)
    dq = q5.new_empty(B, Hkv, G, Tq, D)
    dk = q5.new_zeros(B * Hkv, Tk, D)
    dv = q5.new_zeros(B * Hkv, Tk, Dv)
    n = BH * min(chunk, Tq) * Tk
    buf = q5.new_empty(2 * n)
    for r0 in range(0, Tq, chunk):
        r1 = min(r0 + chunk, Tq)
        c, K = r1 - r0, P + r1
        qc = q5[:, :, :, r0:r1].reshape(B * Hkv, G * c, D)
        doc = dout[:, :, :, r0:r1].reshape(B * Hkv, G * c, Dv)
        S = buf[: BH * c * K].view(B * Hkv, G * c, K)
        dP = buf[n : n + BH * c * K].view(B * Hkv, G * c, K)
        torch.bmm(qc, k3[:, :K].transpose(1, 2), out=S)
        torch.bmm(doc, v3[:, :K].transpose(1, 2), out=dP)
        bias.rows_backward(S.view(BH, c, K), dP.view(BH, c, K), lse2, delta, r0, r1, scale, want)
        dv[:, :K].baddbmm_(S.transpose(1, 2), doc)
        dk[:, :K].baddbmm_(dP.transpose(1, 2), qc, alpha=scale)
        dq[:, :, :, r0:r1] = torch.bmm(dP, k3[:, :K]).mul_(scale).view(B, Hkv, G, c, D)
    return dq, dk.view(k.shape), dv.view(v.shape)
