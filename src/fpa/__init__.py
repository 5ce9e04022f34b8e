"""fpa: First Passage Attention for PyTorch.

``import fpa`` stays light: it imports neither torch nor transformers. ``import fpa.models``
registers the FPA classes with the transformers Auto classes (``AutoConfig``, ``AutoModel``,
``AutoModelForCausalLM``), after which ``AutoModelForCausalLM.from_pretrained(folder)`` loads a
saved FPA model.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["first_passage_attention", "forgetting_attention", "__version__"]


def __getattr__(name: str):
    # lazy, so that `import fpa.cli` (and `fpa --help`) does not import torch
    if name in ("first_passage_attention", "forgetting_attention"):
        import fpa.ops

        return getattr(fpa.ops, name)
    raise AttributeError(f"module 'fpa' has no attribute {name!r}")
