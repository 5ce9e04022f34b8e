"""S independent one-layer, one-head models run as the S heads of one attention layer.

Each model is: token embedding (V, E) -> one attention head of dimension d (from
``fpa.layers.make_attention``, so every method shares the library's layer code) -> a linear
readout of the output at the last position (the query) to one scalar.

Packing: the layer has hidden size S * E and S heads; every projection is block-diagonal (the
off-block weights start at zero and their gradients are masked to zero, so with Adam they stay
zero), and block s of the hidden state holds model s's embedding of its own tokens. Each head then
sees only its own model's inputs: the S models are independent, but run in one forward pass.
Per-block initialisation matches a single model's: nn.Linear's fan-in scaling is undone for the
S-times wider input, and ALiBi uses the one-head slope for every head.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from fpa.checks import positive_int
from fpa.layers.attention import SoftmaxAttention, alibi_slopes, make_attention
from fpa.layers.options import FPAOptions

# The synthetic heads' FPA walk: one learned constant offset per head from 1 (not the library
# default, level = field): with level = field a one-head walk whose steps are all >= 0 is stuck in
# the dead zone (docs/design.md, "One FPA options object").
SYNTH_WALK = FPAOptions(mode="walk", level_offset="head", level_offset_init=1.0)

# method name -> (attention type, the FPA options for attention "fpa", else None)
METHODS: dict[str, tuple[str, FPAOptions | None]] = {
    "fpa-free": ("fpa", FPAOptions(mode="free")),
    "fpa-walk": ("fpa", SYNTH_WALK),
    "fox": ("fox", None),
    "softmax-alibi": ("softmax_alibi", None),
    "softmax-rope": ("softmax_rope", None),
    "softmax-nope": ("softmax_nope", None),
}


def check_method(name: str) -> None:
    """Raise ValueError unless ``name`` is one of ``METHODS`` (a former spelling such as
    "fpa_walk" gets a did-you-mean)."""
    if name not in METHODS:
        alt = str(name).replace("_", "-")
        hint = f" (did you mean {alt!r}?)" if alt in METHODS else ""
        raise ValueError(f"method must be one of {tuple(METHODS)}, got {name!r}{hint}")


def method_options(method: str, fpa_kwargs: dict | None = None) -> FPAOptions:
    """The FPA options a method's layer trains with: the method's own, with ``fpa_kwargs``
    (FPAOptions fields, ``fpa synth --fpa-kwargs``; ValueError for any other name) on top.
    ValueError for a method without an FPA layer."""
    check_method(method)
    opts = METHODS[method][1]
    if opts is None:
        raise ValueError(f"method {method!r} has no FPA layer")
    return opts.replace(**(fpa_kwargs or {}))


def block_diagonal_(lin: nn.Linear, n: int, rescale: bool) -> None:
    """Zero lin's off-diagonal blocks (n x n blocks) and keep them zero by masking the gradient."""
    out_f, in_f = lin.weight.shape
    if out_f % n or in_f % n:
        raise ValueError(f"a {out_f}x{in_f} weight cannot be split into {n} x {n} blocks")
    mask = torch.block_diag(*[torch.ones(out_f // n, in_f // n)] * n)
    with torch.no_grad():
        lin.weight.mul_(mask * (math.sqrt(n) if rescale else 1.0))
    lin.weight.register_hook(lambda g: g * mask)


class PackedModels(nn.Module):
    """``n_models`` independent one-head models of one method. tokens (B, S, T) -> prediction (B, S).
    ``layer_kwargs``: FPAOptions fields that override the method's FPA options (FPA methods only)."""

    def __init__(
        self,
        method: str,
        n_models: int,
        vocab_size: int,
        dim: int,
        embed_dim: int = 16,
        layer_kwargs: dict | None = None,
    ):
        super().__init__()
        check_method(method)
        positive_int("dim", dim, "head dimension d")
        positive_int("n_models", n_models)
        attention = METHODS[method][0]
        fpa = method_options(method, layer_kwargs) if attention == "fpa" else None
        if layer_kwargs and fpa is None:
            raise ValueError(f"layer_kwargs are FPA options; method {method!r} has no FPA layer")
        S, E = n_models, embed_dim
        self.n_models, self.embed_dim = S, E
        self.embed = nn.Parameter(torch.randn(S, vocab_size, E))
        self.attn = make_attention(attention, S * E, S, head_dim=dim, fpa=fpa)
        for name, lin in self.attn.named_children():
            if isinstance(lin, nn.Linear):
                # q, k, v, o have nn.Linear's default fan-in init; the scalar heads are N(0, std^2)
                block_diagonal_(lin, S, rescale=name in ("q_proj", "k_proj", "v_proj", "o_proj"))
        if isinstance(self.attn, SoftmaxAttention) and self.attn.position == "alibi":
            self.attn.alibi_slope_override = float(alibi_slopes(1)[0])
        self.readout = nn.Parameter(torch.randn(S, E) / math.sqrt(E))
        self.readout_bias = nn.Parameter(torch.zeros(S))

    def hidden(self, tokens: Tensor) -> Tensor:
        """tokens (B, S, T) -> layer input (B, T, S * E), block s = model s's embedding."""
        if tokens.dim() != 3 or tokens.shape[1] != self.n_models:
            raise ValueError(f"tokens must have shape (B, {self.n_models}, T), got {tuple(tokens.shape)}")
        S = torch.arange(self.n_models)[None, :, None]
        x = self.embed[S, tokens]  # (B, S, T, E)
        B, _, T, E = x.shape
        return x.permute(0, 2, 1, 3).reshape(B, T, self.n_models * E)

    def readout_last(self, y: Tensor) -> Tensor:
        """Layer output (B, T, S * E) -> one scalar per model at the last position (B, S)."""
        last = y[:, -1].view(y.shape[0], self.n_models, self.embed_dim)
        return (last * self.readout).sum(-1) + self.readout_bias

    def readout_all(self, y: Tensor) -> Tensor:
        """Layer output (B, T, S * E) -> one scalar per model at every position (B, S, T)."""
        B, T, _ = y.shape
        per = y.view(B, T, self.n_models, self.embed_dim)
        return ((per * self.readout).sum(-1) + self.readout_bias).transpose(1, 2)

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> Tensor:
        """Clip each model's gradient to norm <= max_norm on its own (global clipping would couple
        the packed models). Every parameter's dim 0 is S contiguous per-model blocks. Returns the
        per-model norms before clipping (S,)."""
        S = self.n_models
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        sq = torch.zeros(S)
        for g in grads:
            if g.shape[0] % S:
                raise ValueError(f"a gradient of shape {tuple(g.shape)} has no {S} blocks along dim 0")
            sq += g.reshape(S, -1).pow(2).sum(1)
        norms = sq.sqrt()
        scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.view(S, -1).mul_(scale[:, None])
        return norms

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens (B, S, T) -> each model's prediction at the last position (B, S)."""
        return self.readout_last(self.attn(self.hidden(tokens)))
