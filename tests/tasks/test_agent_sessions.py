import re
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from fpa.data import ByteTokenizer
from fpa.tasks import get_mixer, get_probe
from fpa.tasks.agent_sessions import (
    FILLER_WORDS,
    KINDS,
    TOOLS,
    SessionSpec,
    answer_loss,
    is_correct,
    make_eval_prompts,
    make_question,
    make_session,
    min_length,
    session_training_sample,
    training_sample_with_answer,
)

TOK = ByteTokenizer()
CALL_RE = re.compile(r"call ([a-z]+)\(([a-z]{3}[0-9]{2})\) @([0-9]+)")
RET_RE = re.compile(r"ret ([a-z]+)\(([a-z]{3}[0-9]{2})\) -> ([0-9]{5}) @([0-9]+)")
OBS_RE = re.compile(r"obs: ([A-Za-z ,.:]+)")


@dataclass
class Parsed:
    """The session as its text defines it: open calls (tool, arg, start), outermost first;
    closed calls (tool, arg, value, start, end, ret_start) in closing order; observation texts."""

    open: list = field(default_factory=list)
    closed: list = field(default_factory=list)
    obs: list = field(default_factory=list)
    max_depth: int = 0


def parse(text: bytes) -> Parsed:
    """The oracle: rebuild the call stack from the lines, failing on any malformed line."""
    assert text.endswith(b"\n")
    p, pos = Parsed(), 0
    for raw in text.split(b"\n")[:-1]:
        line = raw.decode("ascii")
        if m := CALL_RE.fullmatch(line):
            p.open.append((m[1], m[2], pos))
            p.max_depth = max(p.max_depth, len(p.open))
            assert int(m[3]) == len(p.open), f"call at depth {len(p.open)} tagged @{m[3]} at byte {pos}"
        elif m := RET_RE.fullmatch(line):
            assert p.open, f"return with no open call at byte {pos}"
            assert int(m[4]) == len(p.open), f"return at depth {len(p.open)} tagged @{m[4]} at byte {pos}"
            tool, arg, start = p.open.pop()
            assert m[1] == tool, f"ret {m[1]} closes a call to {tool} at byte {pos}"
            assert m[2] == arg, f"ret {m[1]}({m[2]}) closes the call {tool}({arg}) at byte {pos}"
            p.closed.append((tool, arg, m[3], start, pos + len(raw) + 1, pos))
        elif m := OBS_RE.fullmatch(line):
            p.obs.append(m[1])
        else:
            raise AssertionError(f"malformed line {line!r} at byte {pos}")
        pos += len(raw) + 1
    return p


def oracle_answer(parsed: Parsed, question: str) -> str:
    if m := re.fullmatch(r"q: arg of innermost open ([a-z]+)\na: call \1\(", question):
        return [arg for tool, arg, _ in parsed.open if tool == m[1]][-1]
    if m := re.fullmatch(r"q: return of last closed ([a-z]+)\na: ", question):
        return max((c for c in parsed.closed if c[0] == m[1]), key=lambda c: c[4])[2]
    return {
        "q: tool of outermost open call\na: ": parsed.open[0][0],
        "q: number of open calls\na: ": str(len(parsed.open)),
        "q: open calls, outermost first\na: ": " ".join(t for t, _, _ in parsed.open),
    }[question]


SPECS = [
    SessionSpec(depth=1, length=300),
    SessionSpec(depth=2, length=1000, open_at_end=2),
    SessionSpec(depth=4, length=1024),
    SessionSpec(depth=8, length=10_000, retire=0.3, max_obs_sentences=20),
    SessionSpec(depth=3, length=100_000, tools=("grep", "omega")),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"D{s.depth}-L{s.length}")
def test_session_is_well_formed_and_matches_the_parsed_text(spec):
    for seed in range(6 if spec.length <= 10_000 else 1):
        s = make_session(np.random.default_rng(seed), spec)
        assert len(s.text) == spec.length  # exact: the last observation is cut to fit
        p = parse(s.text)
        assert 1 <= len(p.open) <= spec.depth and p.max_depth <= spec.depth
        if spec.open_at_end is not None:
            assert len(p.open) == spec.open_at_end
        assert [(s.calls[i].tool, s.calls[i].arg, s.calls[i].start) for i in s.stack] == p.open
        closed = sorted((c.tool, c.arg, c.value, c.start, c.end) for c in s.calls if c.end is not None)
        assert closed == sorted(c[:5] for c in p.closed)
        assert len(s.calls) == len(p.open) + len(p.closed)
        # the outermost open call opens in the first tenth (plus the planned lines before it)
        assert p.open[0][2] <= 0.1 * spec.length + 40  # + the control call, if it came first
        # every call to the control tool closed before retire * length, and none is open
        ctrl = [c for c in p.closed if c[0] == s.control_tool]
        assert ctrl and max(c[4] for c in ctrl) <= spec.retire * spec.length
        assert s.control_tool not in [t for t, _, _ in p.open]
        # answers never in the filler: no digits, no tool name among its words
        words = {w.strip(".,:").lower() for o in p.obs for w in o.split()}
        assert not words & set(spec.tools)
        # a closed call's argument occurs on its call and return lines, an open call's on its
        # call line only, every return value once
        for _, arg, value, *_ in p.closed:
            assert s.text.count(arg.encode()) == 2 and s.text.count(value.encode()) == 1
        for _, arg, _ in p.open:
            assert s.text.count(arg.encode()) == 1


def test_long_sessions_accumulate_closed_calls_and_varied_observations_at_bounded_depth():
    s = make_session(np.random.default_rng(0), SessionSpec(depth=4, length=100_000))
    p = parse(s.text)
    assert p.max_depth <= 4 and len(p.closed) > 200
    sizes = [len(o) for o in p.obs]
    assert min(sizes) < 40 and max(sizes) > 150 and len({o.split(":")[0] for o in p.obs}) > 3
    assert {c[0] for c in p.closed} == set(TOOLS)


def test_arguments_and_values_are_distinct_even_with_a_thousand_calls():
    for seed in range(3):
        s = make_session(np.random.default_rng(seed), SessionSpec(depth=6, length=130_000, max_obs_sentences=1))
        p = parse(s.text)
        args = [c[1] for c in p.closed] + [arg for _, arg, _ in p.open]
        values = [c[2] for c in p.closed]
        assert len(args) > 1000 and len(set(args)) == len(args) and len(set(values)) == len(values)


def test_sessions_are_deterministic_per_seed():
    spec = SessionSpec(depth=3, length=2000)
    a, b = make_session(np.random.default_rng(5), spec), make_session(np.random.default_rng(5), spec)
    assert a == b
    assert make_session(np.random.default_rng(6), spec).text != a.text
    assert make_question(np.random.default_rng(1), a, "open_arg") == make_question(
        np.random.default_rng(1), b, "open_arg"
    )
    assert make_eval_prompts(spec) == make_eval_prompts(spec)


def test_open_count_covers_every_depth():
    spec = SessionSpec(depth=4, length=1000)
    counts = {len(make_session(np.random.default_rng(i), spec).stack) for i in range(40)}
    assert counts == {1, 2, 3, 4}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("spec", SPECS[:4], ids=lambda s: f"D{s.depth}-L{s.length}")
def test_answers_are_what_the_parsed_text_implies(spec, kind):
    for seed in range(5):
        s = make_session(np.random.default_rng(seed), spec)
        prompt, answer = make_question(np.random.default_rng([seed, 1]), s, kind)
        assert prompt.startswith(s.text)
        question = prompt[len(s.text) :].decode("ascii")
        assert question.startswith("q: ") and re.search(r"\na: (call [a-z]+\()?$", question)
        assert answer == oracle_answer(parse(s.text), question)
        if kind in ("open_arg", "closed_ret"):
            assert s.text.count(answer.encode()) == 1


def test_closed_ret_asks_for_the_call_closed_last_not_the_one_opened_last():
    spec = SessionSpec(depth=4, length=3000, tools=("grep", "omega"))  # the control tool nests in itself
    nested = 0
    for seed in range(30):
        s = make_session(np.random.default_rng(seed), spec)
        p = parse(s.text)
        ctrl = [c for c in p.closed if c[0] == s.control_tool]
        nested += max(ctrl, key=lambda c: c[4]) != max(ctrl, key=lambda c: c[3])
        prompt, answer = make_question(np.random.default_rng(seed), s, "closed_ret")
        assert answer == oracle_answer(p, prompt[len(s.text) :].decode())
    assert nested > 0


def test_eval_prompts_record_seed_kind_and_how_far_back_the_evidence_lies():
    spec = SessionSpec(depth=3, length=5000, retire=0.4, seeds=(3, 11))
    prompts = make_eval_prompts(spec)
    assert [(x.seed, x.kind) for x in prompts] == [(sd, k) for sd in (3, 11) for k in KINDS]
    for x in prompts:
        line = x.prompt[x.evidence :].split(b"\n", 1)[0].decode()
        assert line.startswith("ret " if x.kind == "closed_ret" else "call ")
        if x.kind in ("open_arg", "closed_ret"):
            assert x.answer in line
        if x.kind == "closed_ret":
            assert len(x.prompt) - x.evidence >= (1 - spec.retire) * spec.length
    # a subset of kinds gives the same questions as the full set
    assert make_eval_prompts(spec, ("closed_ret",)) == [x for x in prompts if x.kind == "closed_ret"]


def _split_answer(tail: str) -> tuple[str, str]:
    """A question line and its answer line "q: ...\na: ANSWER\n" -> (the question up to where the
    answer starts: after "a: ", or after the echoed "a: call X(" of open_arg, and the rest)."""
    m = re.search(r"\na: (call [a-z]+\()?", tail)
    assert m is not None, tail
    return tail[: m.end()], tail[m.end() :]


@pytest.mark.parametrize("seq_len", [512, 1024, 2048])
def test_training_sample_has_shape_and_answer_in_place(seq_len):
    assert get_mixer("agent-sessions") is session_training_sample
    kinds = set()
    for seed in range(20):
        ids, n = training_sample_with_answer(np.random.default_rng([seq_len, seed]), seq_len, TOK)
        assert ids.shape == (seq_len + 1,) and ids.dtype == np.int64
        assert np.array_equal(ids, session_training_sample(np.random.default_rng([seq_len, seed]), seq_len, TOK))
        text = bytes(ids.tolist())
        body, question = text[: text.rindex(b"q: ")], text[text.rindex(b"q: ") :].decode()
        question, answer = _split_answer(question)
        assert answer.endswith("\n") and bytes(ids[-n - 1 : -1].tolist()).decode() == answer[:-1]
        assert answer[:-1] == oracle_answer(parse(body), question)
        kinds.add(question)
    assert len(kinds) >= 5


class _ByteValueModel(torch.nn.Module):
    """per_token_loss[r, t] = the value of the target byte labels[r, t + 1] (0 at the end)."""

    def forward(self, input_ids, labels, return_per_token_loss):
        out = torch.zeros(labels.shape, dtype=torch.float32)
        out[:, :-1] = labels[:, 1:].float()
        return type("Out", (), {"per_token_loss": out})()


def test_answer_loss_is_the_mean_over_the_answer_bytes():
    assert get_probe("agent-sessions") is answer_loss
    model = _ByteValueModel().train()
    got = answer_loss(model, TOK, 512, n=6, seed=9)
    answers = []
    for i in range(6):
        text = bytes(session_training_sample(np.random.default_rng([9, i]), 512, TOK).tolist()).decode()
        answers.append(_split_answer(text[text.rindex("q: ") :])[1][:-1])
    want = np.mean([b for a in answers for b in a.encode()])
    assert got == pytest.approx(want, rel=1e-6) and model.training


@pytest.mark.parametrize(
    "text, ok",
    [
        ("kiv27\n", True),
        ("kiv27", True),
        ("kiv27\nq: x", True),
        ("kiv2", False),
        ("kiv271\n", False),
        (" kiv27\n", False),
    ],
)
def test_scoring_is_exact_match_up_to_the_newline(text, ok):
    assert is_correct(text, "kiv27") is ok


class _MergingTokenizer:
    def encode(self, text):
        return [300] * (len(text) // 2)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"depth": 0}, "depth"),
        ({"depth": 2.0}, "depth"),
        ({"length": 50}, "length"),
        ({"tools": ("search",)}, "tools"),
        ({"tools": ("search", "search")}, "tools"),
        ({"tools": ("search", "Fetch")}, "tools"),
        ({"tools": ("search", "sky")}, "tools"),
        ({"open_at_end": 5}, "open_at_end"),
        ({"open_at_end": 0}, "open_at_end"),
        ({"retire": 1.0}, "retire"),
        ({"max_obs_sentences": 0}, "max_obs_sentences"),
        ({"seeds": [1, 2]}, "seeds"),
    ],
)
def test_spec_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SessionSpec(**kwargs)


def test_functions_reject_bad_arguments():
    s = make_session(np.random.default_rng(0), SessionSpec())
    with pytest.raises(ValueError, match="rng"):
        make_session(0, SessionSpec())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="spec"):
        make_session(np.random.default_rng(0), {"depth": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kind"):
        make_question(np.random.default_rng(0), s, "open_args")
    with pytest.raises(ValueError, match="kinds"):
        make_eval_prompts(SessionSpec(), ("open",))
    for bad in (0, 2.5, True, 100):
        with pytest.raises(ValueError, match="seq_len"):
            session_training_sample(np.random.default_rng(0), bad, TOK)
    with pytest.raises(ValueError, match="tokenizer"):
        session_training_sample(np.random.default_rng(0), 1024, _MergingTokenizer())


def test_min_length_is_exact():
    spec = SessionSpec(depth=5, length=2000)
    m = min_length(spec)
    SessionSpec(depth=5, length=m)
    with pytest.raises(ValueError, match="length"):
        SessionSpec(depth=5, length=m - 1)
    for seed in range(20):
        assert len(make_session(np.random.default_rng(seed), SessionSpec(depth=5, length=m)).text) == m


def test_filler_holds_no_tool_name_and_no_digit():
    assert not FILLER_WORDS & set(TOOLS)
    assert not any(ch.isdigit() for w in FILLER_WORDS for ch in w)


def test_sessions_with_copy_draw_copy_lines_at_their_share():
    from fpa.tasks import TASK_PROBES, get_mixer
    from fpa.tasks.agent_sessions import session_or_copy_sample
    from fpa.tasks.copy import COPY_SHARE

    assert get_mixer("agent-sessions+copy") is session_or_copy_sample and "agent-sessions+copy" in TASK_PROBES
    n, copies = 300, 0
    for i in range(n):
        ids = session_or_copy_sample(np.random.default_rng([9, i]), 384, ByteTokenizer())
        assert ids.shape == (385,)
        copies += "q: " not in bytes(ids.tolist()).decode()
    # binomial(300, 1/3): sd 8.2; 4 sd either side
    assert abs(copies - n * COPY_SHARE) < 4 * (n * COPY_SHARE * (1 - COPY_SHARE)) ** 0.5


def test_training_draws_each_kind_at_its_share():
    from fpa.tasks.agent_sessions import KINDS, QUESTIONS, TRAIN_KIND_SHARES

    assert set(TRAIN_KIND_SHARES) == set(KINDS) and abs(sum(TRAIN_KIND_SHARES.values()) - 1) < 1e-12
    starts = {k: QUESTIONS[k].split("{")[0].split("\n")[0] for k in KINDS}
    n, counts = 400, dict.fromkeys(KINDS, 0)
    for i in range(n):
        ids, _ = training_sample_with_answer(np.random.default_rng([11, i]), 384, TOK)
        text = bytes(ids.tolist()).decode()
        q = text[text.rindex("q: ") :]
        (kind,) = [k for k in KINDS if q.startswith(starts[k])]
        counts[kind] += 1
    for k, p in TRAIN_KIND_SHARES.items():  # binomial(400, p): 4 sd either side
        assert abs(counts[k] - n * p) < 4 * (n * p * (1 - p)) ** 0.5, (k, counts)
