"""fpa: First Passage Attention for PyTorch.

``import fpa`` stays light (no transformers import), yet makes the models loadable through the
transformers Auto classes: if transformers is already imported the FPA classes are registered now,
otherwise as soon as it is (``AutoModelForCausalLM.from_pretrained(folder)`` then just works).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"
__all__ = ["first_passage_attention", "forgetting_attention", "__version__"]


def __getattr__(name: str):
    # lazy, so that `import fpa.cli` (and `fpa --help`) does not import torch
    if name in ("first_passage_attention", "forgetting_attention"):
        import fpa.ops

        return getattr(fpa.ops, name)
    raise AttributeError(f"module 'fpa' has no attribute {name!r}")


_pending = False


def _register_auto_classes() -> None:
    global _pending
    try:
        import fpa.models  # noqa: F401  (registers FPAConfig / FPAModel / FPAForCausalLM)
        _pending = False
    except ImportError:  # fpa.cache was importing transformers itself: fpa.cache retries at its end
        _pending = True


def _finish_registration() -> None:
    """Called at the end of fpa.cache's import: registers if the first attempt came too early."""
    if _pending:
        _register_auto_classes()


class _RegisterWhenTransformersLoads(importlib.abc.MetaPathFinder):
    """Runs the Auto-class registration right after ``import transformers`` completes."""

    def find_spec(self, name, path=None, target=None):
        if name != "transformers":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            run(module)
            _register_auto_classes()

        loader.exec_module = exec_module
        return spec


if "transformers" in sys.modules:
    _register_auto_classes()
elif importlib.util.find_spec("transformers") is not None:
    sys.meta_path.insert(0, _RegisterWhenTransformersLoads())
