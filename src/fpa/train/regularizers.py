"""Training-time regularisers that read the attention layers through forward hooks.

``LiveFractionRegularizer`` pushes FPA heads to forget: it adds ``weight`` times the mean soft
live fraction of every FPA head, sigmoid((threshold - beta * dip(i, j)) / temperature) averaged
over the causal pairs j < i of the training batch, to the loss. A key with penalty beta * dip
below the threshold counts as live (it would survive ``FPAEviction(threshold)``); the regulariser is the differentiable
version of the kept fraction that the eviction rule would achieve, so a head that keeps every key
live (a "global" head) pays for it unless the language-model loss needs those keys.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fpa.checks import check_number
from fpa.layers.attention import FirstPassageAttention
from fpa.ops.field import dip


class LiveFractionRegularizer:
    """Attach to ``model``; after each forward in training mode, ``penalty()`` returns the term to
    add to the loss (and clears it). While ``active`` is False (the trainer's steps before
    ``live_reg_from_step``) the hooks compute nothing and the term is zero. ``close()`` removes
    the hooks."""

    active: bool = True

    def __init__(self, model: nn.Module, weight: float, threshold: float, temperature: float = 1.0):
        for name, val in (("weight", weight), ("threshold", threshold), ("temperature", temperature)):
            check_number(name, val, low=0, low_open=True)
        self.weight, self.threshold, self.temperature = float(weight), float(threshold), float(temperature)
        self._values: list[Tensor] = []
        layers = [m for m in model.modules() if isinstance(m, FirstPassageAttention)]
        if not layers:
            raise ValueError("the live-fraction regulariser needs a model with FPA attention layers")
        self._handles = [m.register_forward_hook(self._hook) for m in layers]

    def _hook(self, module: FirstPassageAttention, args: tuple, output) -> None:
        if not module.training or not self.active:
            return
        x = args[0]  # (B, T, hidden): the layer's input
        field, level = module.field_level(x)  # (B, H, T) each
        pen = module.beta.float()[None, :, None, None] * dip(field, level)  # (B, H, T(query), T(key))
        T = x.shape[1]
        before = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(-1)  # j < i
        soft = torch.sigmoid((self.threshold - pen) / self.temperature)
        self._values.append(soft.masked_select(before.expand_as(soft)).mean())

    def penalty(self) -> Tensor:
        """weight * the mean soft live fraction over the FPA layers seen since the last call."""
        if not self._values:
            return torch.zeros(())
        out = self.weight * torch.stack(self._values).mean()
        self._values.clear()
        return out

    def close(self) -> None:
        """Remove the forward hooks from the model's FPA layers."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
