"""Fixtures for the cache tests; plain builders live in cache_testing.py."""

import pytest


@pytest.fixture
def capture_attention():
    """Attach to a layer: records the attention output (input of o_proj) of every call."""
    handles, outs = [], []

    def attach(layer):
        handles.append(layer.o_proj.register_forward_pre_hook(lambda mod, args: outs.append(args[0].detach())))
        return outs

    yield attach
    for h in handles:
        h.remove()
