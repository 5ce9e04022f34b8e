"""The decoding paths (fpa.cache.prefill: run_chunks, prefill, generate; the model's own forward
and generate) pass and read the cache under the installed transformers' name (fpa.compat.CACHE_ARG):
none logs transformers' "`past_key_values`/`cache_params` are deprecated" (transformers >= 5.3).
That message goes through transformers' logger once per process (``warning_once``), not through
the warnings module, so the suite's FutureWarning filter does not see it: it is captured here,
and the capture is shown to catch a call that does log it."""

import logging
from types import SimpleNamespace

import pytest
import torch
from cache_testing import tiny_model
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils import logging as hf_logging

from fpa.cache import FPACache, FPAEviction, generate, prefill
from fpa.cache.prefill import run_chunks
from fpa.compat import CACHE_ARG, output_cache

DEPRECATED = "`past_key_values`/`cache_params` are deprecated"


@pytest.fixture
def hf_log():
    """The messages transformers' loggers emit inside the test (warning level on), each
    ``warning_once`` message emitted again even if an earlier test printed it."""
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler, lib, was = Keep(logging.WARNING), logging.getLogger("transformers"), hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    lib.addHandler(handler)
    hf_logging.warning_once.cache_clear()
    try:
        yield records
    finally:
        lib.removeHandler(handler)
        hf_logging.set_verbosity(was)


@pytest.mark.skipif(CACHE_ARG != "cache", reason="transformers < 5.3 has no such message")
def test_the_capture_sees_the_message(hf_log):
    out = tiny_model()(torch.randint(1, 37, (1, 4)), use_cache=True)
    assert not [m for m in hf_log if DEPRECATED in m]
    assert isinstance(out.past_key_values, FPACache)  # the old name, read: logs it
    assert [m for m in hf_log if DEPRECATED in m]


def test_no_decoding_path_logs_the_deprecation(hf_log):
    m, x = tiny_model(), torch.randint(1, 37, (2, 7))
    with torch.no_grad():
        m(x, use_cache=False)  # no cache in the output: read under the installed name only
        m.train()(x, labels=x)
        m.eval()
        m(x, cache=FPACache(), use_cache=True)
        prefill(m, x, FPACache(FPAEviction(1.0)), chunk_size=3)
        run_chunks(m, x, None, 3)  # the model makes the cache
        generate(m, x, FPACache(FPAEviction(1.0)), max_new_tokens=2, chunk_size=3)
        m.generate(x, max_new_tokens=2, do_sample=False, pad_token_id=0)  # starts its own FPACache
    assert not [r for r in hf_log if "deprecated" in r], hf_log


def test_output_cache_reads_the_installed_name_and_other_objects():
    cache = FPACache()
    assert output_cache(CausalLMOutputWithPast(logits=torch.zeros(1), **{CACHE_ARG: cache})) is cache
    assert output_cache(CausalLMOutputWithPast(logits=torch.zeros(1))) is None
    assert output_cache(SimpleNamespace(past_key_values=cache)) is cache  # another library's output
    assert output_cache({"cache": cache}) is cache
    assert output_cache(SimpleNamespace(logits=None)) is None
