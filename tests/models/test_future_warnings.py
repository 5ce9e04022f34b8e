"""The suite fails on a FutureWarning raised by our own calls into transformers (pyproject.toml's
filterwarnings): one attributed to an fpa module and one attributed to a test module are errors.
On transformers 5.2, which has no ``cache`` argument yet, there is no such warning to catch."""

import pytest
import torch
from transformers import GenerationMixin

from fpa.compat import CACHE_ARG
from fpa.models import FPACache, FPAConfig, FPAForCausalLM

pytestmark = pytest.mark.skipif(CACHE_ARG != "cache", reason="transformers < 5.3 takes past_key_values")


def _model():
    torch.manual_seed(0)
    return FPAForCausalLM(FPAConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64)).eval()


def test_a_deprecated_argument_through_fpa_code_is_an_error():
    """FPAForCausalLM.generate passes its arguments on: the warning is attributed to fpa.models."""
    x = torch.randint(0, 257, (1, 4))
    with pytest.raises(FutureWarning, match="`past_key_values` is deprecated"):
        _model().generate(x, past_key_values=FPACache(), max_new_tokens=1, do_sample=False)


def test_a_deprecated_argument_from_a_test_is_an_error():
    """transformers' generate called straight from this module: the warning is attributed here."""
    x = torch.randint(0, 257, (1, 4))
    with pytest.raises(FutureWarning, match="`past_key_values` is deprecated"):
        GenerationMixin.generate(_model(), x, past_key_values=FPACache(), max_new_tokens=1, do_sample=False)


def test_cache_gives_what_past_key_values_gave():
    m, x = _model(), torch.randint(0, 257, (1, 4))
    with torch.no_grad():
        a = m.generate(x, cache=FPACache(), max_new_tokens=3, do_sample=False)
        with pytest.warns(FutureWarning):  # a local catch_warnings: the filter under test allows it here
            import warnings

            warnings.simplefilter("always", FutureWarning)
            b = m.generate(x, past_key_values=FPACache(), max_new_tokens=3, do_sample=False)
    assert torch.equal(a, b)
