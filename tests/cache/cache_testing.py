"""Shared builders for the cache tests: small random layers and models (a uniquely named module,
so that `from cache_testing import ...` cannot pick up another folder's conftest)."""

import torch

from fpa.layers.attention import make_attention
from fpa.layers.options import FPAOptions
from fpa.models import FPAConfig, FPAForCausalLM
from fpa.ops import dip

TYPES = [
    ("fpa", "free"),
    ("fpa", "walk"),
    ("fox", "free"),
    ("softmax_rope", "free"),
    ("softmax_alibi", "free"),
    ("softmax_nope", "free"),
]


def tiny_model(att="fpa", mode="free", seed=0, **kw):
    """A 2-layer random model, GQA (4 query heads, 2 KV heads), vocab 37."""
    torch.manual_seed(seed)
    kw.setdefault("num_key_value_heads", 2)
    c = FPAConfig(
        vocab_size=37,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        attention=att,
        fpa={"mode": mode, **kw.pop("fpa", {})},
        **kw,
    )
    return FPAForCausalLM(c).eval()


def forgetful_layer(kind, seed=0, num_kv_heads=2, qk_norm=False, hidden=32, heads=4):
    """A single attention layer whose field actually forgets (large field weights / small gates).
    kind: "fox", an FPA mode ("free", "walk") or "walk-token" (walk with level_offset="token")."""
    torch.manual_seed(seed)
    if kind == "fox":
        layer = make_attention("fox", hidden, heads, num_kv_heads, qk_norm=qk_norm, fgate_bias_init=1.0)
        torch.nn.init.normal_(layer.fgate_proj.weight, std=0.5)
    else:
        mode, _, offset = kind.partition("-")
        layer = make_attention(
            "fpa",
            hidden,
            heads,
            num_kv_heads,
            fpa=FPAOptions(mode=mode, field_init_std=0.5, beta_init=1.0, level_offset=offset or "none"),
            qk_norm=qk_norm,
        )
    if qk_norm:
        with torch.no_grad():
            layer.q_norm.weight.uniform_(0.5, 1.5)
            layer.k_norm.weight.uniform_(0.5, 1.5)
    return layer.eval()


def full_qkv(layer, x):
    """q (B, Hq, T, D), k, v (B, Hkv, T, D) of a whole sequence, as the layer's forward computes them."""
    return layer.project(x)


def full_penalty(layer, x):
    """Dense beta * dip (B, Hq, T, T) [query i, key j] for the whole sequence x (B, T, hidden)."""
    if hasattr(layer, "fgate_proj"):
        field = torch.cumsum(layer.log_forget(x), -1)
        return dip(field, field)
    field, level = layer.field_level(x)
    return layer.beta.detach()[None, :, None, None] * dip(field, level)


# A threshold decision (evict key j after query i) made on two computation paths (the cache's
# penalties against the dense penalty of fpa.ops.dip, token by token against chunks) can differ
# only where a penalty lies near tau: the penalties of such paths differ by at most 1.3e-5
# (measured: FPA walk over 45 tokens, the cache's kept keys token by token against in chunks of 7;
# 2.5e-6 for FoX, 7.6e-6 cache against dense; float32 sums in another order). Decisions are
# compared only where they hold by PEN_TOL = 1e-4 (7.5x that) or more.
PEN_TOL = 1e-4


def decision_margin(pen, tau, groups):
    """(B, Hkv, T, T): by how much the threshold rule's decision for (query i, key j) holds, given
    the dense penalty ``pen`` (B, Hq, T, T): the smallest penalty - tau of the group's query heads
    where all exceed tau (evict), else the largest tau - penalty of the heads that do not (keep);
    +inf above the diagonal."""
    B, Hq, T, _ = pen.shape
    p = pen.reshape(B, Hq // groups, groups, T, T) - tau
    evict = (p > 0).all(2)
    m = torch.where(evict, p.min(2).values, (-p).masked_fill(p > 0, float("-inf")).max(2).values)
    return m.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("inf"))


def kept_positions(lc, b, g):
    """Sorted positions held by row b, KV head g of a LayerCache."""
    st = lc.store
    return sorted(st["pos"][b, g][st["valid"][b, g]].tolist())


class HostReads:
    """Records every read of a tensor's values by the host while active: ``item``/``int``/``bool``
    (``aten._local_scalar_dense``), ``tolist``, and the ops whose output size depends on values
    (``nonzero``, boolean-mask indexing, ``masked_select``, ``repeat_interleave`` without
    ``output_size``). On an accelerator each one is a host sync; on the CPU they are counted the same
    way, so a CPU test can show that a code path has none. ``sites`` holds, per read, the
    "file:line function" frames under src/fpa, innermost last."""

    def __init__(self) -> None:
        self.sites: list[list[str]] = []

    def _record(self) -> None:
        import sys
        from types import FrameType

        frames: list[str] = []
        f: FrameType | None = sys._getframe(1)
        while f is not None:
            name = f.f_code.co_filename
            if "/src/fpa/" in name:
                frames.append(f"{name.rsplit('/src/', 1)[-1]}:{f.f_lineno} {f.f_code.co_name}")
            f = f.f_back
        self.sites.append(frames[::-1])

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        reads = self
        aten = torch.ops.aten
        sized = {aten.nonzero.default, aten.masked_select.default, aten.repeat_interleave.Tensor}
        indexing = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is aten._local_scalar_dense.default or (func in sized and kwargs.get("output_size") is None):
                    reads._record()
                elif func in indexing and any(
                    torch.is_tensor(i) and i.dtype == torch.bool for i in args[1] if i is not None
                ):
                    reads._record()
                return func(*args, **kwargs)

        self._mode = Mode()
        self._tolist = torch.Tensor.tolist

        def tolist(t):
            reads._record()
            return reads._tolist(t)

        torch.Tensor.tolist = tolist
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        torch.Tensor.tolist = self._tolist
        return False
