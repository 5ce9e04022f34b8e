"""Decoding one agent session with the paged cache: chunked prefill of the session, then each
question answered greedily from its own copy of the cache.

The session's bytes go through ``fpa.cache.prefill.run_chunks`` in chunks (the cache's policy
runs after each), then, per question, a copy of the cache takes the question as one more chunk
and generates the answer one token at a time (the policy after each), stopping at the first byte
that differs from ``answer + "\\n"``: the greedy continuation is correct exactly when every byte
matches, so the early stop changes no score (``generated`` then ends at the first wrong byte).

Recorded per session: keys held per (layer, KV head) and bytes after the prefill, prefill and
decode times, each answer, and which bytes of the open calls' lines (and of the closed control
call's line) the cache still holds, per layer. ``WalkRecorder`` adds, for an FPA walk, the
parts of each open-call key's penalty at the end of the session: the level offset and the dip.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fpa.cache import FPACache, Policy
from fpa.cache.prefill import run_chunks
from fpa.layers.attention import FirstPassageAttention
from fpa.tasks.agent_sessions import (
    CALL,
    RET,
    SEED_TAG,
    Session,
    SessionSpec,
    is_correct,
    make_eval_prompts,
    make_session,
)

ARG_AT = len("call ")  # the tool name starts here in a call line; its argument after "(tool("


def session_with_prompts(spec: SessionSpec, seed: int) -> tuple[Session, list]:
    """The session of ``seed`` under ``spec`` and its evaluation prompts (one per kind), exactly
    as ``make_eval_prompts`` draws them."""
    one = replace(spec, seeds=(seed,))
    session = make_session(np.random.default_rng([SEED_TAG, seed]), one)
    prompts = make_eval_prompts(one)
    if any(not p.prompt.startswith(session.text) for p in prompts):  # pragma: no cover - generator contract
        raise RuntimeError("make_eval_prompts and make_session disagree on the session text")
    return session, prompts


def call_spans(session: Session) -> list[dict]:
    """The lines the open kinds need and the control's line: per open call (outermost first) and
    for the last closed call to the control tool, {"role", "tool", "depth", "text": the argument
    (open) or return value (closed), "line": (start, end), "arg": (start, end) of that text} (byte
    offsets in the session)."""
    out = []
    for i in session.stack:
        c = session.calls[i]
        a = c.start + ARG_AT + len(c.tool) + 1
        line = len(CALL.format(tool=c.tool, arg=c.arg, depth=c.depth))
        span = dict(line=(c.start, c.start + line), arg=(a, a + len(c.arg)))
        out.append(dict(role="open", tool=c.tool, depth=c.depth, text=c.arg, **span))
    closed = [c for c in session.calls if c.tool == session.control_tool and c.end is not None]
    if closed:
        c = max(closed, key=lambda c: c.end or 0)
        end = c.end or 0
        start = end - len(RET.format(tool=c.tool, arg=c.arg, value=c.value, depth=c.depth))
        v = start + len(RET[: RET.index("{value}")].format(tool=c.tool, arg=c.arg))  # the value's offset
        span = dict(line=(start, end), arg=(v, v + len(c.value or "")))
        out.append(dict(role="closed", tool=c.tool, depth=c.depth, text=c.value, **span))
    return out


def held_positions(cache: FPACache, n: int) -> list[Tensor]:
    """Per layer, (Hkv, n) bool: whether each KV head (batch row 0) holds the key at each position < n."""
    out = []
    for lc in cache.layer_caches:
        st = lc.configured()[0]
        pos, valid = st["pos"][0].long(), st["valid"][0]  # (Hkv, C)
        held = torch.zeros(pos.shape[0], n, dtype=torch.bool)
        h = torch.arange(pos.shape[0])[:, None].expand_as(pos)
        ok = valid & (pos >= 0) & (pos < n)
        held[h[ok], pos[ok]] = True
        out.append(held)
    return out


def span_kept(held: list[Tensor], span: tuple[int, int]) -> list[float]:
    """Per layer, the largest share over KV heads of the positions in ``span`` held."""
    a, b = span
    return [float(h[:, a:b].float().mean(-1).max()) for h in held]


class WalkRecorder:
    """Records the field and level every FPA layer of ``model`` computes while active (a context
    manager wrapping each layer's ``field_level``), so that the parts of a key's penalty can be
    read at the end: beta * offset (level - field at the key) and beta * dip (field at the key
    minus the lowest field after it)."""

    def __init__(self, model: torch.nn.Module):
        self.layers = [m for m in model.modules() if isinstance(m, FirstPassageAttention)]
        self.fields: list[list[Tensor]] = [[] for _ in self.layers]
        self.levels: list[list[Tensor]] = [[] for _ in self.layers]

    def __enter__(self) -> WalkRecorder:
        for i, m in enumerate(self.layers):
            inner = m.field_level

            def wrapped(*args: Any, _i: int = i, _inner: Callable = inner, **kwargs: Any) -> tuple[Tensor, Tensor]:
                f, lv = _inner(*args, **kwargs)
                self.fields[_i].append(f[0].detach().float())
                self.levels[_i].append(lv[0].detach().float())
                return f, lv

            m.field_level = wrapped  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        for m in self.layers:
            del m.field_level  # the instance attribute goes; the class method is back

    def penalty_parts(self, span: tuple[int, int]) -> list[dict]:
        """Per FPA layer, for the keys j in ``span``, means over them per head (H,) lists at the end:
        "offset" beta * (level_j - field_j), "dip" beta * (field_j - the lowest field after j; < 0
        where the walk stayed above it) and "penalty" beta * relu(level_j - that lowest field), the
        rule's penalty (a key goes once it passes the threshold)."""
        out = []
        a, b = span
        for m, fs, ls in zip(self.layers, self.fields, self.levels):
            f, lv = torch.cat(fs, -1), torch.cat(ls, -1)  # (H, T)
            after = torch.flip(torch.cummin(torch.flip(f, [-1]), -1).values, [-1])  # min over t >= j
            low = torch.cat([after[:, 1:], f[:, -1:]], -1)[:, a:b]  # over t > j (the newest key: itself)
            beta = m.beta.detach().float()[:, None]
            parts = {
                "offset": beta * (lv[:, a:b] - f[:, a:b]),
                "dip": beta * (f[:, a:b] - low),
                "penalty": beta * torch.relu(lv[:, a:b] - low),
            }
            out.append({k: v.mean(-1).tolist() for k, v in parts.items()})
        return out


@torch.no_grad()
def answer_question(model: Any, cache: FPACache, question: bytes, answer: str, chunk_size: int) -> dict:
    """Feed ``question`` through ``cache`` and generate greedily, one token per forward call, until
    the first byte that differs from ``answer + "\\n"`` (or all of it). Returns {"generated",
    "correct", "steps", "decode_s"} (decode_s: the single-token calls only)."""
    logits, cache = run_chunks(model, torch.tensor([list(question)]), cache, chunk_size)
    target = (answer + "\n").encode("ascii")
    out: list[int] = []
    seconds = 0.0
    for i, want in enumerate(target):
        tok = int(logits[0].argmax())
        out.append(tok)
        if tok != want or i == len(target) - 1:
            break
        t0 = time.perf_counter()
        logits, cache = run_chunks(model, torch.tensor([[tok]]), cache, None)
        seconds += time.perf_counter() - t0
    generated = "".join(chr(t) if t < 256 else "<eos>" for t in out)
    return dict(generated=generated, correct=is_correct(generated, answer), steps=len(out) - 1, decode_s=seconds)


@torch.no_grad()
def decode_session(
    model: Any, spec: SessionSpec, seed: int, make_policy: Callable[[], Policy | None], chunk_size: int, walk: bool
) -> dict:
    """Decode session ``seed`` of ``spec`` under a fresh ``FPACache(make_policy())`` and answer its
    questions; ``walk``: record the FPA walk's penalty parts for the call spans (``WalkRecorder``).

    Returns {"seed", "length", "keys_held": per layer, per KV head after the prefill, "kept_keys":
    their mean, "bytes_held", "bytes_live", "peak_bytes", "prefill_s", "questions": [{"kind",
    "answer", "generated", "correct", "back": bytes from the evidence to the question, "steps",
    "decode_s"}], "calls": call_spans with "line_kept" and "arg_kept" per layer (and "penalty"
    per FPA layer when ``walk``)}."""
    session, prompts = session_with_prompts(spec, seed)
    ids = torch.tensor([list(session.text)])
    cache = FPACache(make_policy())
    recorder = WalkRecorder(model) if walk else None
    t0 = time.perf_counter()
    if recorder is not None:
        with recorder:
            _, cache = run_chunks(model, ids, cache, chunk_size)
    else:
        _, cache = run_chunks(model, ids, cache, chunk_size)
    prefill_s = time.perf_counter() - t0
    keys = [lc.counts()[0].tolist() for lc in cache.layer_caches]
    held = held_positions(cache, len(session.text))
    calls = call_spans(session)
    for c in calls:
        c["line_kept"], c["arg_kept"] = span_kept(held, c["line"]), span_kept(held, c["arg"])
        if recorder is not None:
            c["penalty"] = recorder.penalty_parts(c["arg"])
    out = dict(
        seed=seed,
        length=len(session.text),
        keys_held=keys,
        kept_keys=float(np.mean(keys)),
        bytes_held=cache.bytes_held(),
        bytes_live=cache.bytes_live(),
        peak_bytes=cache.peak_bytes,
        prefill_s=prefill_s,
        calls=calls,
        questions=[],
    )
    for i, p in enumerate(prompts):
        own: FPACache = cache if i == len(prompts) - 1 else copy.deepcopy(cache)  # the last needs no copy
        q = answer_question(model, own, p.prompt[len(session.text) :], p.answer, chunk_size)
        out["questions"].append(dict(kind=p.kind, answer=p.answer, back=len(p.prompt) - p.evidence, **q))
    return out
