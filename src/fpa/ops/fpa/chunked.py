"""Query-chunked FPA (docs/fpa.md, "Computing it fast") with a hand-written backward. CPU path and GPU fallback.

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

from fpa.ops.chunked_attention import chunked_backward, chunked_forward
from fpa.ops.cpu_kernels import calls, loader

DEFAULT_CHUNK = 64


class _FPAChunkBias:
    """-beta * dip for one query chunk. Tensors in the grouped layout (B, Hkv, G, ...)."""

    def __init__(
        self,
        field: Tensor,
        past_min: Tensor,
        level: Tensor,
        beta: Tensor,
        want_grad: bool,
        hide: Tensor | None = None,
    ):
        self.field = field  # (B, Hkv, G, Tq): the field at the query positions
        self.past_min = past_min  # (B, Hkv, G, P)
        self.level = level  # (B, Hkv, G, Tk)
        self.beta = beta  # (1, Hkv, G, 1, 1)
        self.hide = hide  # (B, Hkv, G, Tk) int64 or None: key j hidden from queries at positions >= hide[j]
        self.Tq, self.P = field.shape[-1], past_min.shape[-1]
        self.fused = loader.usable(field, past_min, level, beta)
        self.hide_rows = None
        if self.fused:  # row-block layout (B * Hq, n) of the C++ rows
            bh = field.shape[0] * field.shape[1] * field.shape[2]
            self.rows = [x.reshape(bh, x.shape[-1]).contiguous() for x in (field, past_min, level)]
            self.beta_h = beta.reshape(-1).contiguous()  # (Hq,)
            if hide is not None:
                self.hide_rows = hide.reshape(bh, hide.shape[-1]).contiguous()
        if want_grad:
            # Gradient of the "virtual" vector [field | past_min]: every minimum comes from one of them.
            self.dvirtual = field.new_zeros(*field.shape[:-1], self.Tq + self.P)
            self.dlevel = level.new_zeros(level.shape)  # contiguous (level may be a strided view)
            self.dbeta = torch.zeros_like(beta)
            if self.fused:
                self.dbeta_bh = torch.zeros(self.rows[0].shape[0], dtype=torch.float64)
        self._kept: tuple[int, int, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor] | None = None

    def rows_forward(self, S: Tensor, lse: Tensor, r0: int, r1: int, scale: float) -> None:
        f, pm, lv = self.rows
        calls.fpa_rows(
            S,
            None,
            lse,
            None,
            f,
            pm,
            lv,
            self.beta_h,
            self.beta_h.shape[0],
            r0,
            r1,
            scale,
            hide=self.hide_rows,
            lib=loader.require(),
        )

    def rows_backward(
        self, S: Tensor, dP: Tensor, lse: Tensor, delta: Tensor, r0: int, r1: int, scale: float, want: bool
    ) -> None:
        f, pm, lv = self.rows
        grads = None
        if want:
            grads = (self.dvirtual.view(lv.shape[0], -1), self.dlevel.view(lv.shape), self.dbeta_bh)
        calls.fpa_rows(
            S,
            dP,
            lse,
            delta,
            f,
            pm,
            lv,
            self.beta_h,
            self.beta_h.shape[0],
            r0,
            r1,
            scale,
            grads,
            hide=self.hide_rows,
            lib=loader.require(),
        )

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
        f, pm, lv = self.rows
        dq, dk, dv = grads if grads is not None else (None, None, None)
        bias_grads = (self.dvirtual.view(lv.shape[0], -1), self.dlevel.view(lv.shape), self.dbeta_bh) if want else None
        calls.fpa_whole(
            q5,
            k,
            v,
            out,
            dout,
            lse,
            delta,
            dq,
            dk,
            dv,
            f,
            pm,
            lv,
            self.beta_h,
            chunk,
            scale,
            bias_grads,
            hide=self.hide_rows,
            lib=loader.require(),
        )

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
        x = torch.where(
            after,
            chunk_field[..., None, :],
            torch.full((), float("inf"), dtype=chunk_field.dtype, device=chunk_field.device),
        )
        local_vals, local_idx = torch.cummin(x, dim=-1)
        local_vals, local_idx = local_vals.transpose(-1, -2), local_idx.transpose(-1, -2)
        m = torch.empty(*chunk_field.shape[:-1], c, K, dtype=chunk_field.dtype, device=chunk_field.device)
        torch.minimum(a_vals[..., None, :], pc.values[..., :, None], out=m[..., :n_before])
        m[..., n_before:] = local_vals
        neg_dip = m.sub_(self.level[..., None, :K]).clamp_(max=0)  # -dip, in place
        if keep:
            self._kept = (r0, r1, neg_dip, a_vals, a_src, pc.values, pc.indices, local_idx)
            return self._hidden(neg_dip * self.beta, r0, r1)
        return self._hidden(neg_dip.mul_(self.beta), r0, r1)

    def _hidden(self, bias: Tensor, r0: int, r1: int) -> Tensor:
        """``bias`` (..., r1 - r0, P + r1) with -inf at the hidden (query, key) pairs, in place
        (the kept -dip stays finite: its gradient terms are 0 * finite there)."""
        if self.hide is None:
            return bias
        pos = self.P + torch.arange(r0, r1, device=bias.device)
        return bias.masked_fill_(pos[:, None] >= self.hide[..., None, : self.P + r1], float("-inf"))

    def backward(self, r0: int, r1: int, ds: Tensor) -> None:
        if self._kept is None or self._kept[:2] != (r0, r1):
            raise RuntimeError(f"backward({r0}, {r1}) must follow bias({r0}, {r1}, keep=True)")
        _, _, neg_dip, a_vals, a_src, pc_vals, pc_idx, local_idx = self._kept
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


def _math_dtype(q: Tensor, field: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 or field.dtype == torch.float64 else torch.float32


def _prepare(
    q: Tensor,
    k: Tensor,
    field: Tensor,
    past_min: Tensor,
    level: Tensor,
    beta: Tensor,
    hide: Tensor | None,
    dt: torch.dtype,
    want_grad: bool,
) -> tuple[Tensor, _FPAChunkBias]:
    """q5 (B, Hkv, G, Tq, D) in dt, and the chunk bias over (field, past_min, level, hide) as
    (B, Hkv, G, n) and beta as (1, Hkv, G, 1, 1), in dt (hide stays int64)."""
    B, Hq, Tq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    f, pm, lv = (x.to(dt).reshape(B, Hkv, G, x.shape[-1]) for x in (field, past_min, level))
    h = None if hide is None else hide.reshape(lv.shape)
    bias = _FPAChunkBias(f, pm, lv, beta.to(dt).reshape(1, Hkv, G, 1, 1), want_grad, hide=h)
    return q.to(dt).reshape(B, Hkv, G, Tq, D), bias


# Custom ops (not an autograd.Function): opaque to torch.compile, so a compiled model runs the
# same kernels as eager, with no graph break and no recompilation (the shapes are symbolic).
# ``hide`` (None: nothing hidden, no work) masks (query, key) pairs, e.g. the keys an eviction
# rule has dropped (fpa.ops.fpa.evicting); it takes no gradient.
@torch.library.custom_op("fpa::chunked_forward", mutates_args=())
def _forward_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    field: Tensor,
    level: Tensor,
    past_min: Tensor,
    beta: Tensor,
    hide: Tensor | None,
    scale: float,
    chunk: int,
) -> tuple[Tensor, Tensor]:
    """-> out (B, Hq, Tq, Dv) and lse (B, Hq, Tq), both in the math dtype (float32 or float64)."""
    dt = _math_dtype(q, field)
    B, Hq, Tq, _ = q.shape
    q5, bias = _prepare(q, k, field, past_min, level, beta, hide, dt, want_grad=False)
    out, lse = chunked_forward(q5, k.to(dt), v.to(dt), scale, bias, chunk)
    return out.reshape(B, Hq, Tq, -1), lse.reshape(B, Hq, Tq)


@_forward_op.register_fake
def _(q, k, v, field, level, past_min, beta, hide, scale, chunk):
    dt = _math_dtype(q, field)
    B, Hq, Tq, _ = q.shape
    return q.new_empty(B, Hq, Tq, v.shape[-1], dtype=dt), q.new_empty(B, Hq, Tq, dtype=dt)


@torch.library.custom_op("fpa::chunked_backward", mutates_args=())
def _backward_op(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    field: Tensor,
    level: Tensor,
    past_min: Tensor,
    beta: Tensor,
    hide: Tensor | None,
    out: Tensor,
    lse: Tensor,
    scale: float,
    chunk: int,
    bias_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """-> dq, dk, dv, dfield, dlevel, dpast_min, dbeta in the inputs' dtypes (the last four zero
    unless bias_grad)."""
    dt = out.dtype
    B, Hq, Tq, _ = q.shape
    Hkv = k.shape[1]
    q5, bias = _prepare(q, k, field, past_min, level, beta, hide, dt, want_grad=bias_grad)
    do5 = dout.to(dt).reshape(B, Hkv, Hq // Hkv, Tq, -1)
    out5 = out.reshape(do5.shape)
    lse5 = lse.reshape(do5.shape[:-1])
    dq, dk, dv = chunked_backward(q5, k.to(dt), v.to(dt), out5, lse5, do5, scale, bias, chunk, bias_grad)
    if bias_grad:
        bias.finish_grads()
        # copies: two views of one buffer may not both be returned from a custom op
        dfield = bias.dvirtual[..., :Tq].reshape(B, Hq, Tq).to(field.dtype, copy=True)
        dpast = bias.dvirtual[..., Tq:].reshape(B, Hq, -1).to(past_min.dtype, copy=True)
        dlevel = bias.dlevel.reshape(B, Hq, -1).to(level.dtype)
        dbeta = bias.dbeta.reshape(Hq).to(beta.dtype)
    else:
        dfield, dpast, dlevel, dbeta = (x.new_zeros(x.shape) for x in (field, past_min, level, beta))
    return dq.reshape(q.shape).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dfield, dlevel, dpast, dbeta


@_backward_op.register_fake
def _(dout, q, k, v, field, level, past_min, beta, hide, out, lse, scale, chunk, bias_grad):
    return tuple(
        x.new_empty(x.shape)
        for x in (q, k, v, field, level, past_min, beta)  # contiguous, like the real outputs
    )


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, field, level, past_min, beta, hide, scale, chunk = inputs
    ctx.save_for_backward(q, k, v, field, level, past_min, beta, hide, *output)
    ctx.scale, ctx.chunk = scale, chunk


def _backward(ctx, dout: Tensor, dlse: Tensor | None):
    q, k, v, field, level, past_min, beta, hide, out, lse = ctx.saved_tensors
    bias_grad = any(ctx.needs_input_grad[3:7])
    grads = _backward_op(dout, q, k, v, field, level, past_min, beta, hide, out, lse, ctx.scale, ctx.chunk, bias_grad)
    grads = [g if need else None for g, need in zip(grads, ctx.needs_input_grad[:7])]
    return (*grads, None, None, None)  # hide, scale, chunk


_forward_op.register_autograd(_backward, setup_context=_setup_context)


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
    hide: Tensor | None = None,
) -> Tensor:
    """Chunked FPA in the cache form.

    Args:
        q: (B, Hq, Tq, D), the queries at the last Tq of the Tk positions.
        k: (B, Hkv, Tk, D), Hq % Hkv == 0.
        v: (B, Hkv, Tk, Dv).
        field: (B, Hq, Tq), the field at the query positions.
        level: (B, Hq, Tk).
        past_min: (B, Hq, Tk - Tq), the field's minimum after each earlier key up to just before
            the first query.
        beta: (Hq,) penalty strength per query head.
        scale: Logit scale.
        chunk: Query chunk (memory O(B * Hq * chunk * Tk)).
        hide: None (nothing hidden, at no cost), or (B, Hq, Tk) int64: key j is hidden from every
            query at position >= hide[..., j] (positions 0..Tk - 1; the same value for every head
            of a KV group where the keys are shared, e.g. fpa.ops.fpa.evicting.hide_from). A
            hidden pair has weight 0 and sends no gradient; every query must see at least one
            key (its own: hide[..., j] > j). Not differentiable.

    Returns:
        (B, Hq, Tq, Dv) in q's dtype.
    """
    if hide is not None and (hide.dtype != torch.int64 or hide.shape != level.shape or hide.device != level.device):
        raise ValueError(
            f"hide must be None or an int64 tensor of level's shape {tuple(level.shape)} on {level.device}, "
            f"got {hide.dtype} {tuple(hide.shape)} on {hide.device}"
        )
    out, _ = _forward_op(q, k, v, field, level, past_min, beta, hide, float(scale), int(chunk))
    return out.to(q.dtype)
