"""An independent float64 oracle for FPA and FoX, written from the definition alone.

    dip(i, j) = max(0, level_j - min_{j < t <= i} field_t),   dip(i, i) = 0
    o_i = sum_{j <= i} softmax_j(scale <q_i, k_j> - beta_h dip(i, j)) v_j

Plain Python floats and explicit loops over i, j, t (and d); nothing from fpa is imported, and
torch only converts lists in and out. Gradients are written out by hand (softmax backward):
with w_i = dL/do_i, p_ij the weights, dp_ij = <w_i, v_j>, ds_ij = p_ij (dp_ij - sum_j' p_ij' dp_ij'):
    dv_j += p_ij w_i;  dq_i += scale ds_ij k_j;  dk_j += scale ds_ij q_i;  dbeta_h -= ds_ij dip(i, j)
and only where dip(i, j) > 0 STRICTLY (relu at 0 has gradient 0, like torch.relu):
    dlevel_j -= beta ds_ij;  dfield_{t*} += beta ds_ij,  t* = tie(i, j, argmins) one argmin in (j, i].

Shapes: q (B, Hq, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv), field/level (B, Hq, Tk), beta (Hq,);
query row r is position i = Tk - Tq + r; head h reads key/value head h // (Hq // Hkv).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

TieRule = Callable[[int, int, list[int]], int]


def latest(i: int, j: int, argmins: list[int]) -> int:
    """The convention of the reference backend: the latest position attaining the minimum."""
    return max(argmins)


def chunked_rule(P: int, chunk: int) -> TieRule:
    """The convention of the chunked backend with query chunk `chunk` and P = Tk - Tq cached keys.

    For query i (row r = i - P, chunk start c0 = P + (r // chunk) * chunk): the latest argmin at or
    after c0 if there is one, else the earliest argmin (they all lie before c0).
    """

    def rule(i: int, j: int, argmins: list[int]) -> int:
        c0 = P + ((i - P) // chunk) * chunk
        late = [t for t in argmins if t >= c0]
        return max(late) if late else min(argmins)

    return rule


def _l(x: torch.Tensor) -> list:
    return x.detach().to(torch.float64).tolist()


def fpa_oracle(q, k, v, field, level, beta, scale: float, w=None, tie: TieRule = latest) -> dict[str, torch.Tensor]:
    """Forward ("out") and, when w (dL/dout, (B, Hq, Tq, Dv)) is given, the gradients of
    L = sum(out * w) w.r.t. "q", "k", "v", "field", "level", "beta", all float64 tensors."""
    Q, K, V, F, L, Bt = _l(q), _l(k), _l(v), _l(field), _l(level), _l(beta)
    B, Hq, Tq, D = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[-1]
    G, P = Hq // Hkv, Tk - Tq
    W = _l(w) if w is not None else None
    out = [[[[0.0] * Dv for _ in range(Tq)] for _ in range(Hq)] for _ in range(B)]
    z = lambda *s: torch.zeros(*s, dtype=torch.float64).tolist()  # noqa: E731
    dq, dk, dv = z(B, Hq, Tq, D), z(B, Hkv, Tk, D), z(B, Hkv, Tk, Dv)
    dF, dL, dB = z(B, Hq, Tk), z(B, Hq, Tk), [0.0] * Hq
    for b in range(B):
        for h in range(Hq):
            g = h // G
            for r in range(Tq):
                i = P + r
                logits, dips, mins = [], [], []
                for j in range(i + 1):
                    if j == i:
                        d, am = 0.0, []
                    else:
                        m = math.inf
                        for t in range(j + 1, i + 1):
                            m = min(m, F[b][h][t])
                        am = [t for t in range(j + 1, i + 1) if F[b][h][t] == m]
                        d = max(0.0, L[b][h][j] - m)
                    dot = sum(Q[b][h][r][e] * K[b][g][j][e] for e in range(D))
                    logits.append(scale * dot - Bt[h] * d)
                    dips.append(d)
                    mins.append(am)
                mx = max(logits)
                ex = [math.exp(s - mx) for s in logits]
                tot = sum(ex)
                p = [e / tot for e in ex]
                for e in range(Dv):
                    out[b][h][r][e] = sum(p[j] * V[b][g][j][e] for j in range(i + 1))
                if W is None:
                    continue
                wi = W[b][h][r]
                dp = [sum(wi[e] * V[b][g][j][e] for e in range(Dv)) for j in range(i + 1)]
                avg = sum(p[j] * dp[j] for j in range(i + 1))
                for j in range(i + 1):
                    ds = p[j] * (dp[j] - avg)
                    for e in range(Dv):
                        dv[b][g][j][e] += p[j] * wi[e]
                    for e in range(D):
                        dq[b][h][r][e] += scale * ds * K[b][g][j][e]
                        dk[b][g][j][e] += scale * ds * Q[b][h][r][e]
                    dB[h] -= ds * dips[j]
                    if dips[j] > 0:
                        dL[b][h][j] -= Bt[h] * ds
                        dF[b][h][tie(i, j, mins[j])] += Bt[h] * ds
    f64 = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    res = {"out": f64(out).reshape(B, Hq, Tq, Dv)}
    if W is not None:
        res.update(
            q=f64(dq).reshape(q.shape),
            k=f64(dk).reshape(k.shape),
            v=f64(dv).reshape(v.shape),
            field=f64(dF).reshape(field.shape),
            level=f64(dL).reshape(level.shape),
            beta=f64(dB),
        )
    return res


def fox_oracle(q, k, v, log_f, scale: float, w=None) -> dict[str, torch.Tensor]:
    """FoX from its definition: logit = scale <q_i, k_j> + sum_{j < u <= i} log f_u; same outputs
    as fpa_oracle with "log_fgate" for the gate gradient (d logit_ij / d log f_u = 1 for j < u <= i)."""
    Q, K, V, LF = _l(q), _l(k), _l(v), _l(log_f)
    B, Hq, Tq, D = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[-1]
    G, P = Hq // Hkv, Tk - Tq
    W = _l(w) if w is not None else None
    z = lambda *s: torch.zeros(*s, dtype=torch.float64).tolist()  # noqa: E731
    out, dq, dk, dv, dlf = z(B, Hq, Tq, Dv), z(B, Hq, Tq, D), z(B, Hkv, Tk, D), z(B, Hkv, Tk, Dv), z(B, Hq, Tk)
    for b in range(B):
        for h in range(Hq):
            g = h // G
            for r in range(Tq):
                i = P + r
                logits = []
                for j in range(i + 1):
                    gate = 0.0
                    for u in range(j + 1, i + 1):
                        gate += LF[b][h][u]
                    logits.append(scale * sum(Q[b][h][r][e] * K[b][g][j][e] for e in range(D)) + gate)
                mx = max(logits)
                ex = [math.exp(s - mx) for s in logits]
                p = [e / sum(ex) for e in ex]
                for e in range(Dv):
                    out[b][h][r][e] = sum(p[j] * V[b][g][j][e] for j in range(i + 1))
                if W is None:
                    continue
                wi = W[b][h][r]
                dp = [sum(wi[e] * V[b][g][j][e] for e in range(Dv)) for j in range(i + 1)]
                avg = sum(p[j] * dp[j] for j in range(i + 1))
                for j in range(i + 1):
                    ds = p[j] * (dp[j] - avg)
                    for e in range(Dv):
                        dv[b][g][j][e] += p[j] * wi[e]
                    for e in range(D):
                        dq[b][h][r][e] += scale * ds * K[b][g][j][e]
                        dk[b][g][j][e] += scale * ds * Q[b][h][r][e]
                    for u in range(j + 1, i + 1):
                        dlf[b][h][u] += ds
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    res = {"out": t(out)}
    if W is not None:
        res.update(q=t(dq), k=t(dk), v=t(dv), log_fgate=t(dlf))
    return res
