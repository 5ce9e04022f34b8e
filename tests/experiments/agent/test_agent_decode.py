"""Decoding one agent session (fpa.experiments.agent.decode) on tiny random models: the spans of
the open calls, which of their bytes the cache holds, and the parts of a walk key's penalty."""

import pytest
import torch

from fpa.cache import SlidingWindow
from fpa.experiments.agent.decode import WalkRecorder, call_spans, decode_session, session_with_prompts
from fpa.models import FPAConfig, FPAForCausalLM
from fpa.tasks.agent_sessions import KINDS, SessionSpec

SPEC = SessionSpec(depth=4, length=600, seeds=(0,))
SIZE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, intermediate_size=64)


def tiny(attention: str) -> FPAForCausalLM:
    torch.manual_seed(0)
    fpa = {"fpa": {"level_offset": "token"}} if attention == "fpa" else {}
    return FPAForCausalLM(FPAConfig.from_preset("tiny", attention=attention, **SIZE, **fpa)).eval()


@pytest.mark.parametrize("seed", range(6))
def test_call_spans_point_at_the_open_arguments_and_the_closed_return(seed):
    session, prompts = session_with_prompts(SessionSpec(depth=4, length=3000), seed)
    calls = call_spans(session)
    opened = [c for c in calls if c["role"] == "open"]
    assert [c["depth"] for c in opened] == list(range(1, len(opened) + 1)) and len(opened) == len(session.stack)
    for c in calls:
        a, b = c["arg"]
        assert session.text[a:b] == c["text"].encode()
        line = session.text[c["line"][0] : c["line"][1]]
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert line.startswith(b"call " if c["role"] == "open" else b"ret ")
    closed = [c for c in calls if c["role"] == "closed"]
    answer = {p.kind: p.answer for p in prompts}
    assert len(closed) == 1 and closed[0]["text"] == answer["closed_ret"]
    assert any(c["text"] == answer["open_arg"] for c in opened)


def test_the_full_cache_holds_every_byte_and_a_window_drops_the_outermost_call():
    model = tiny("fox")
    full = decode_session(model, SPEC, 0, lambda: None, chunk_size=128, walk=False)
    assert full["kept_keys"] == full["length"] == SPEC.length
    assert all(min(c["line_kept"]) == 1.0 and min(c["arg_kept"]) == 1.0 for c in full["calls"])
    assert [q["kind"] for q in full["questions"]] == list(KINDS)
    window = decode_session(model, SPEC, 0, lambda: SlidingWindow(64), chunk_size=128, walk=False)
    assert window["kept_keys"] == 64 and window["bytes_held"] < full["bytes_held"]
    outermost = window["calls"][0]  # opened in the first tenth of the session, far more than 64 bytes back
    assert outermost["role"] == "open" and outermost["depth"] == 1 and max(outermost["line_kept"]) == 0.0
    assert window["questions"][0]["answer"] == full["questions"][0]["answer"]  # same prompts under every policy


def test_the_walks_penalty_is_its_offset_plus_its_dip():
    model = tiny("fpa")
    session, _ = session_with_prompts(SPEC, 0)
    ids = torch.tensor([list(session.text)])
    with WalkRecorder(model) as rec, torch.no_grad():
        model(ids)
    assert len(rec.layers) == 2 and all(len(f) == 1 for f in rec.fields)
    for j in range(0, SPEC.length, 7):
        for layer in rec.penalty_parts((j, j + 1)):  # one key: the parts add up before the relu
            for off, dip, pen in zip(layer["offset"], layer["dip"], layer["penalty"]):
                # float32 rounding: measured <= 1.6e-7 x (1 + |offset| + |dip|) over every key; 6x margin
                assert pen == pytest.approx(max(0.0, off + dip), abs=1e-6 * (1 + abs(off) + abs(dip)))
                assert off >= 0  # the token offset is a softplus
    assert "field_level" not in vars(rec.layers[0])  # the wrapper is gone after the block
