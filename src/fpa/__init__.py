"""fpa: First Passage Attention for PyTorch."""

from fpa.ops import first_passage_attention, forgetting_attention

__version__ = "0.1.0"
__all__ = ["first_passage_attention", "forgetting_attention", "__version__"]
