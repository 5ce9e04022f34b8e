"""The shared pieces of the attention family: RMSNorm, SwiGLU and the projection base class.

Every attention module takes hidden states (B, T, hidden) and an optional per-layer cache state
(a fpa.cache.store.LayerState, e.g. an fpa.cache.LayerCache, filled in place) and returns
(B, T, hidden). With a state, the T new tokens are
appended after the cached ones (incremental decoding or chunked prefill).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fpa.cache.store.state import LayerInfo, LayerState
from fpa.checks import check_number, spread_over_heads
from fpa.layers.key_shift import shift_keys


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension with a learned per-channel weight, computed in float32.

    Args:
        dim: The size of the last dimension.
        eps: Added to the mean square before the root.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """x (..., dim) -> x / rms(x) * weight, (..., dim) in x's dtype."""
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class SwiGLU(nn.Module):
    """The gated feed-forward block down(silu(gate(x)) * up(x)), no biases.

    Args:
        hidden_size: Input and output width.
        intermediate_size: Width of the gate and up projections.
    """

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., hidden_size) -> (..., hidden_size)."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class AttentionBase(nn.Module):
    """q, k, v, o projections (+ optional per-head RMS qk-norm, a sigmoid output gate and a key
    shift, fpa.layers.key_shift: ``key_shift_proj``, one gate per KV head and token, weights
    ~ N(0, 0.02^2) and bias ``key_shift_bias_init``: at 0 every key starts as the mean of its own
    and its predecessor's, at b > 0 as sigmoid(b) of the predecessor's).

    Subclasses implement ``_attend(q, k, v, x, state, offset, mask, pos, need_weights)`` with
    q (B, Hq, T, D), k, v (B, Hkv, T, D) for the new tokens only; ``offset`` is the number of tokens
    seen before; mask (B, T) bool (False = padding) or None; pos (B, T) positions or None; they
    return (output (B, Hq, T, D), weights (B, Hq, T, Tk) or None). ``state`` is a
    fpa.cache.store.LayerState (an fpa.cache.LayerCache inside an FPACache) or None: the subclass
    attends over the cached keys and appends the new ones (LayerState.attend), which advances its
    length.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        qk_norm: bool = False,
        output_gate: bool = False,
        bias: bool = False,
        key_shift: bool = False,
        key_shift_bias_init: float = 0.0,
    ):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if hidden_size <= 0 or num_heads <= 0 or num_kv_heads <= 0:
            raise ValueError("hidden_size, num_heads and num_kv_heads must be positive")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        if head_dim is None:
            if hidden_size % num_heads:
                raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
            head_dim = hidden_size // num_heads
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.q_norm = RMSNorm(head_dim) if qk_norm else None
        self.k_norm = RMSNorm(head_dim) if qk_norm else None
        self.gate_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False) if output_gate else None
        if not isinstance(key_shift, bool):
            raise ValueError(f"key_shift must be True or False, got {key_shift!r}")
        check_number("key_shift_bias_init", key_shift_bias_init)
        if key_shift_bias_init != 0 and not key_shift:
            raise ValueError(f"key_shift_bias_init={key_shift_bias_init!r} needs key_shift=True")
        self.key_shift_proj = nn.Linear(hidden_size, num_kv_heads) if key_shift else None
        if self.key_shift_proj is not None:
            nn.init.normal_(self.key_shift_proj.weight, std=0.02)
            nn.init.constant_(self.key_shift_proj.bias, float(key_shift_bias_init))

    def _heads(self, x: Tensor, n: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)

    def project(
        self, x: Tensor, state: LayerState | None = None, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The query, key and value heads of hidden states x (B, T, hidden), as ``forward`` hands
        them to the attention: q (B, Hq, T, D), k and v (B, Hkv, T, D), in the projections' dtype,
        with the key shift and the qk-norm applied if the layer has them. With a key shift, a
        ``state`` (decoding) supplies the previous call's last key and takes this call's; mask
        (B, T) bool marks padding (False), which is never a key's predecessor. No position
        encoding: a RoPE layer rotates q and k at the positions it attends at
        (``fpa.layers.attention.rope``). An FPA layer's field and level come from ``field_level(x)``."""
        q = self._heads(self.q_proj(x), self.num_heads)
        k = self._heads(self.k_proj(x), self.num_kv_heads)
        v = self._heads(self.v_proj(x), self.num_kv_heads)
        if self.key_shift_proj is not None:
            logit = self.key_shift_proj(x).to(torch.promote_types(x.dtype, torch.float32))
            gate = torch.sigmoid(logit).transpose(1, 2)  # (B, Hkv, T)
            raw = k
            k, carry = shift_keys(raw, gate, None if state is None else state.key_carry, mask)
            if state is not None:
                state.carry_keys(raw, carry)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def _init_bias_per_head(self, lin: nn.Linear, name: str, value: float | tuple[float, ...]) -> None:
        """Set ``lin``'s bias (one per query head) from a per-head setting ``value``
        (fpa.checks.spread_over_heads; ``name`` is the setting's name in its error)."""
        with torch.no_grad():
            lin.bias.copy_(torch.tensor(spread_over_heads(name, value, self.num_heads)))

    def _per_head(self, lin: nn.Linear, x: Tensor) -> Tensor:
        """Linear head with one scalar per (query or KV) head -> (B, H, T), float32."""
        return lin(x).float().transpose(1, 2)

    @property
    def scale(self) -> float:
        """The softmax scale, head_dim ** -0.5."""
        return self.head_dim**-0.5

    def content_bound(self) -> float | None:
        """c with |scale <q, k>| <= c for every query/key, or None without qk-norm.

        RMS norm gives a vector of RMS <= 1 times the weight w, so ||q|| <= sqrt(D) max|w_q|,
        ||k|| <= sqrt(D) max|w_k| and |scale <q, k>| <= scale * D * max|w_q| * max|w_k|.
        """
        if self.q_norm is None or self.k_norm is None:
            return None
        wq, wk = self.q_norm.weight.detach().abs().max(), self.k_norm.weight.detach().abs().max()
        return float(self.scale * self.head_dim * wq * wk)

    def cache_info(self) -> LayerInfo:
        """What a decoding cache needs to know of this layer (kind "softmax", the head groups, the
        content bound)."""
        return LayerInfo(kind="softmax", groups=self.num_heads // self.num_kv_heads, content_bound=self.content_bound())

    def forward(
        self,
        x: Tensor,
        state: LayerState | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_attentions: bool = False,
    ):
        """x (B, T, hidden) -> (B, T, hidden), or (that, weights (B, Hq, T, Tk)) with output_attentions.

        attention_mask (B, T), for the T new tokens: 0/False marks padding, which is no key, moves
        no walk and adds no decay (a padded row computes what the row alone computes). position_ids
        (B, T): the positions RoPE/ALiBi and the cache use (default: each row counts its real tokens).
        """
        if state is not None and not isinstance(state, LayerState):
            raise ValueError(
                f"state must be a fpa.cache.LayerCache (a fpa.cache.store.LayerState) or None, "
                f"got {type(state).__name__}"
            )
        B, T, _ = x.shape
        mask = None if attention_mask is None else attention_mask.to(device=x.device, dtype=torch.bool)
        q, k, v = self.project(x, state, mask)
        if state is not None and state.info is None:
            state.configure(self.cache_info())
        offset = 0 if state is None else state.length
        o, w = self._attend(
            q, k, v, x, state, offset, mask=mask, pos=position_ids, need_weights=output_attentions
        )  # (B, Hq, T, D)
        o = o.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)
        if self.gate_proj is not None:
            o = o * torch.sigmoid(self.gate_proj(x))
        return (self.o_proj(o), w) if output_attentions else self.o_proj(o)

    def _attend(self, q, k, v, x, state, offset, mask=None, pos=None, need_weights=False):  # pragma: no cover
        raise NotImplementedError
