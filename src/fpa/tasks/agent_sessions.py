"""Agent sessions as text: tool-call logs in bytes whose questions need the calls still open.

A session is ASCII lines, one event per line; calls open and close in stack order, and the
return line names the call it closes:

    call search(kiv27) @2           opens a call to tool ``search`` with argument ``kiv27`` at depth 2
    obs: The sky is blue.           an observation (filler sentences, no digits, no tool names)
    ret search(kiv27) -> 40917 @2   closes the innermost open call (it must be that one)

Arguments are 3 letters and 2 digits, return values 5 digits, all distinct within a session:
an open call's argument occurs once (on its call line), a closed call's twice (call and return
lines), a return value once, and none in the filler. The return line's echo is how real tool
logs name what returned, and the depth tag ``@d`` (1 for a call opened with none open; a return
carries its call's) is how a trace viewer shows nesting. They make the session itself teach the
skills the questions need: every return copies the argument of the innermost open call
(``open_arg``), every tag counts the calls open (``open_count``).

At most ``depth`` calls are open at once. A session of ``length`` bytes is built around a planned
spine: the calls left open at the end (1 to ``depth`` of them, the outermost opened in the first
tenth of the session), and one closed call to the session's control tool, whose calls all close
before ``retire * length`` bytes. Between them come observations of 1 to ``max_obs_sentences``
sentences and closed sub-calls (nested, within the depth bound); the last line is an observation
cut to make the length exact. So a long session keeps its depth bounded while observations and
closed calls accumulate (once all ``depth`` calls of the spine are open, only observations follow).

A question follows the session as ``q: <question>`` and ``a: ``; the answer is a short string
ended by a newline (exact match, ``is_correct``). Kinds:

- ``open_arg``: the argument of the innermost open call to tool X (X on the open stack); the
  answer line starts by echoing that call's line up to its argument, ``a: call X(``, so that the
  answer is a copy of what follows the matching call line (a plain induction step) and what the
  question tests is which of the calls to X the memory still finds: the innermost open one;
- ``outer_tool``: the tool of the outermost open call;
- ``open_count``: the number of open calls;
- ``open_tools``: the tools of the open calls, outermost first, separated by spaces;
- ``closed_ret`` (the control): the return value of the most recent closed call to the control
  tool, closed at least ``(1 - retire) * length`` bytes before the question.

The open kinds need only the call lines of the open calls (at most ``depth`` lines): a memory
bounded by the nesting depth, one that keeps the open calls and drops the closed ones, should
answer them at any length. ``closed_ret`` needs a line of a closed call far back: such a memory
is expected to have forgotten it (chance is 1e-5), while a full cache can answer it. It tells
whether the memory of the closed part is really gone (an evicting rule) or really kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from fpa.checks import check_number, non_negative_int, positive_int

TOOLS = ("search", "fetch", "read", "run", "ask", "write")
CALL = "call {tool}({arg}) @{depth}\n"
RET = "ret {tool}({arg}) -> {value} @{depth}\n"
OBS = "obs: {text}\n"
QUESTIONS = {
    "open_arg": "q: arg of innermost open {tool}\na: call {tool}(",
    "outer_tool": "q: tool of outermost open call\na: ",
    "open_count": "q: number of open calls\na: ",
    "open_tools": "q: open calls, outermost first\na: ",
    "closed_ret": "q: return of last closed {tool}\na: ",
}
OPEN_KINDS = ("open_arg", "outer_tool", "open_count", "open_tools")
CLOSED_KINDS = ("closed_ret",)
KINDS = OPEN_KINDS + CLOSED_KINDS
ARG_LETTERS, ARG_DIGITS, VALUE_DIGITS = 3, 2, 5
FILLER = {  # three kinds of observation text, split into sentences; no digits, no tool names
    name: tuple(x if x.endswith(".") else x + "." for x in text.split(". "))
    for name, text in {
        "prose": "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
        "A bird sings in the old oak tree. The river winds slowly toward the sea. Clouds drift over the quiet hills.",
        "report": "Status: done. No errors were reported. Found several matching pages. The page has a title and "
        "a short summary. Warning: the response was truncated. Results: alpha, beta, gamma. The list is sorted by "
        "name. Nothing changed since the last check.",
        "code": "def main: pass. import os and sys. if ready then start else wait. for each item in the list print "
        "the item. class Node holds a value and a next pointer. assert the buffer is empty. let total be the sum "
        "of the parts. raise an error when the key is missing.",
    }.items()
}
FILLER_WORDS = frozenset(w.strip(".,:").lower() for pool in FILLER.values() for s in pool for w in s.split())
OUTER_SPAN = 0.1  # the outermost open call opens within the first tenth of the session
P_CALL = 0.4  # chance that an item is a closed sub-call, where the depth allows one
P_STOP = 0.35  # chance that a sub-call closes before each next child
MAX_SUBCALL = 800  # bytes: sub-call sizes are log-uniform up to this, at any session length
PAD_MIN = 16  # bytes: the final observation is at least this long
SEED_TAG = 7_140_501  # first word of every seed sequence drawn here, apart from other tasks


@dataclass(frozen=True)
class SessionSpec:
    """The shape of the sessions to draw; validates itself.

    Args:
        depth: D, the most calls open at once (>= 1).
        length: Bytes of the session (the question not included); at least ``min_length(spec)``.
        tools: Tool names (>= 2, distinct, lowercase letters, not words of the filler).
        open_at_end: Calls open at the end, in [1, depth]; None draws it uniformly.
        retire: Calls to the control tool close within the first ``retire`` share, in (0, 1).
        max_obs_sentences: The most sentences in one observation (>= 1).
        seeds: The sessions of an evaluation set (``make_eval_prompts``).
    """

    depth: int = 4
    length: int = 1024
    tools: tuple[str, ...] = TOOLS
    open_at_end: int | None = None
    retire: float = 0.5
    max_obs_sentences: int = 8
    seeds: tuple[int, ...] = tuple(range(16))

    def __post_init__(self) -> None:
        positive_int("depth", self.depth, "the most calls open at once")
        positive_int("length", self.length, "bytes of the session")
        positive_int("max_obs_sentences", self.max_obs_sentences)
        t = self.tools
        if not isinstance(t, tuple) or len(t) < 2 or len(set(t)) != len(t):
            raise ValueError(f"tools must be a tuple of >= 2 distinct names, got {t!r}")
        for name in t:
            if not (isinstance(name, str) and name.isascii() and name.isalpha() and name.islower()):
                raise ValueError(f"tools must be lowercase ASCII letters, got {name!r}")
            if name in FILLER_WORDS:
                raise ValueError(f"tools must not be words of the filler, got {name!r}")
        if self.open_at_end is not None:
            what = f"at most depth={self.depth}, or None"
            if positive_int("open_at_end", self.open_at_end, what) > self.depth:
                raise ValueError(f"open_at_end must be a positive int ({what}), got {self.open_at_end!r}")
        check_number("retire", self.retire, low=0, high=1, low_open=True, high_open=True)
        if not isinstance(self.seeds, tuple):
            raise ValueError(f"seeds must be a tuple of ints >= 0, got {self.seeds!r}")
        for i, s in enumerate(self.seeds):
            non_negative_int(f"seeds[{i}]", s)
        if self.length < min_length(self):
            raise ValueError(
                f"length must be >= {min_length(self)} bytes for depth={self.depth}, retire={self.retire} "
                f"and these tools, got {self.length}"
            )


def _call_bytes(tool: str, depth: int) -> int:
    """Bytes of a call line to ``tool`` at ``depth`` (an upper bound for every smaller depth)."""
    return len(CALL.format(tool=tool, arg="x" * (ARG_LETTERS + ARG_DIGITS), depth=depth))


def _closed_bytes(tool: str, depth: int) -> int:
    """Bytes of a call to ``tool`` at ``depth`` and its return line."""
    arg = "x" * (ARG_LETTERS + ARG_DIGITS)
    return _call_bytes(tool, depth) + len(RET.format(tool=tool, arg=arg, value="0" * VALUE_DIGITS, depth=depth))


def min_length(spec: SessionSpec) -> int:
    """The shortest session ``spec``'s depth, tools and retire allow (bytes): the planned lines
    (``depth`` open calls and one closed call, all before ``retire * length``) and the final
    observation."""
    longest = max(spec.tools, key=len)
    planned = spec.depth * _call_bytes(longest, spec.depth) + _closed_bytes(longest, spec.depth)
    return max(planned + PAD_MIN, math.ceil(planned / spec.retire) + 1)


@dataclass(frozen=True)
class Call:
    """One call: ``start`` is the byte offset of its call line, ``end`` the offset just past its
    return line and ``value`` what it returned (both None while it is open); depth is 1 for a call
    opened with no other call open."""

    tool: str
    arg: str
    depth: int
    start: int
    end: int | None = None
    value: str | None = None


@dataclass(frozen=True)
class Session:
    """A session: ``text`` (ASCII bytes, ``spec.length`` of them), ``calls`` in the order they
    open, ``stack`` the indices in ``calls`` of the calls open at the end (outermost first), and
    ``control_tool`` the tool whose calls all close before ``spec.retire * spec.length``."""

    text: bytes
    calls: tuple[Call, ...]
    stack: tuple[int, ...]
    control_tool: str
    spec: SessionSpec


def _obs_text(rng: np.random.Generator, n_sentences: int) -> str:
    pool = list(FILLER.values())[int(rng.integers(len(FILLER)))]
    s0 = int(rng.integers(len(pool)))
    return " ".join(pool[(s0 + i) % len(pool)] for i in range(n_sentences))


def _pad_line(rng: np.random.Generator, n_bytes: int) -> str:
    """An observation line of exactly ``n_bytes`` (>= 7): the tail of a run of filler sentences."""
    n_text = n_bytes - len(OBS.format(text=""))
    run = _obs_text(rng, n_text // min(len(s) for p in FILLER.values() for s in p) + 1)
    return OBS.format(text=run[-n_text:])


class _Builder:
    """Writes a session line by line, keeping the call stack and every call's span."""

    def __init__(self, rng: np.random.Generator, spec: SessionSpec, control: str) -> None:
        self.rng, self.spec, self.control = rng, spec, control
        self.lines: list[str] = []
        self.n = 0
        self.calls: list[Call] = []
        self.stack: list[int] = []
        self.taken: set[str] = set()
        self.retire_at = int(spec.retire * spec.length)

    def _emit(self, line: str) -> None:
        self.lines.append(line)
        self.n += len(line)

    def _fresh(self, letters: int, digits: int) -> str:
        while True:
            s = "".join(chr(97 + int(i)) for i in self.rng.integers(0, 26, letters))
            s += "".join(str(int(i)) for i in self.rng.integers(0, 10, digits))
            if s not in self.taken:
                self.taken.add(s)
                return s

    def open(self, tool: str) -> None:
        arg = self._fresh(ARG_LETTERS, ARG_DIGITS)
        self.calls.append(Call(tool=tool, arg=arg, depth=len(self.stack) + 1, start=self.n))
        self.stack.append(len(self.calls) - 1)
        self._emit(CALL.format(tool=tool, arg=arg, depth=len(self.stack)))

    def close(self) -> None:
        depth = len(self.stack)
        i = self.stack.pop()
        value = self._fresh(0, VALUE_DIGITS)
        self._emit(RET.format(tool=self.calls[i].tool, arg=self.calls[i].arg, value=value, depth=depth))
        self.calls[i] = replace(self.calls[i], end=self.n, value=value)

    def obs(self, room: int) -> bool:
        """An observation of whole sentences within ``room`` bytes; False if none fits."""
        n = int(math.exp(self.rng.uniform(0.0, math.log(self.spec.max_obs_sentences + 1))))
        text = _obs_text(self.rng, min(max(n, 1), self.spec.max_obs_sentences))
        while len(OBS.format(text=text)) > room and ". " in text:
            text = text[: text.rindex(". ") + 1]
        if len(OBS.format(text=text)) > room:
            return False
        self._emit(OBS.format(text=text))
        return True

    def subcall(self, room: int) -> bool:
        """A closed call (with nested children) within ``room`` bytes; False if none fits."""
        budget = min(room, int(math.exp(self.rng.uniform(math.log(32), math.log(MAX_SUBCALL)))))
        tools = [t for t in self.spec.tools if t != self.control or self.n + budget <= self.retire_at]
        tool = tools[int(self.rng.integers(len(tools)))]
        size = _closed_bytes(tool, len(self.stack) + 1)
        if budget < size:
            return False
        self.open(tool)
        self.fill(budget - size, stop=P_STOP)
        self.close()
        return True

    def fill(self, room: int, stop: float = 0.0) -> None:
        """Observations and closed sub-calls within ``room`` bytes at the current depth; before
        each one, stop with probability ``stop`` (0: fill until nothing more fits)."""
        end = self.n + room
        while self.rng.random() >= stop:
            can_call = len(self.stack) < self.spec.depth and self.rng.random() < P_CALL
            if not ((can_call and self.subcall(end - self.n)) or self.obs(end - self.n)):
                return


def make_session(rng: np.random.Generator, spec: SessionSpec) -> Session:
    """A session of exactly ``spec.length`` bytes drawn with ``rng`` (deterministic given both).

    Raises:
        ValueError: ``rng`` is not a numpy Generator or ``spec`` not a SessionSpec.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if not isinstance(spec, SessionSpec):
        raise ValueError(f"spec must be a SessionSpec, got {type(spec).__name__}")
    control = spec.tools[int(rng.integers(len(spec.tools)))]
    others = [t for t in spec.tools if t != control]
    k = spec.open_at_end or int(rng.integers(1, spec.depth + 1))
    longest = max(spec.tools, key=len)
    planned = spec.depth * _call_bytes(longest, spec.depth) + _closed_bytes(longest, spec.depth)
    fractions = np.sort(rng.random(k))
    fractions[0] *= OUTER_SPAN
    spine = [int(f * (spec.length - planned - PAD_MIN)) for f in fractions]
    # every planned line is written at or before its position, so the control call closes in time
    latest = int(spec.retire * spec.length) - planned
    at = int(rng.random() * latest)
    if k == spec.depth:
        at = min(at, spine[-1])  # the control call must open while the depth allows one more
    events = sorted([(p, 1, others[int(rng.integers(len(others)))]) for p in spine] + [(at, 0, control)])
    b = _Builder(rng, spec, control)
    for pos, is_spine, tool in events:
        b.fill(pos - b.n)
        b.open(tool)
        if not is_spine:
            b.close()
    b.fill(spec.length - PAD_MIN - b.n)
    b._emit(_pad_line(rng, spec.length - b.n))
    text = "".join(b.lines).encode("ascii")
    return Session(text=text, calls=tuple(b.calls), stack=tuple(b.stack), control_tool=control, spec=spec)


def _question(rng: np.random.Generator, session: Session, kind: str) -> tuple[bytes, str, int]:
    """(question bytes, answer, evidence): evidence is the byte offset of the earliest line the
    answer needs (the outermost open call for the kinds about the whole stack)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not isinstance(session, Session):
        raise ValueError(f"session must be a Session, got {type(session).__name__}")
    open_calls = [session.calls[i] for i in session.stack]
    tool = ""
    if kind == "open_arg":
        names = sorted({c.tool for c in open_calls})
        tool = names[int(rng.integers(len(names)))]
        call = next(c for c in reversed(open_calls) if c.tool == tool)
        answer, evidence = call.arg, call.start
    elif kind == "closed_ret":
        tool = session.control_tool
        call = max((c for c in session.calls if c.tool == tool and c.end is not None), key=lambda c: c.end or 0)
        answer = call.value or ""
        evidence = (call.end or 0) - len(RET.format(tool=tool, arg=call.arg, value=answer, depth=call.depth))
    else:
        answer = {
            "outer_tool": open_calls[0].tool,
            "open_count": str(len(open_calls)),
            "open_tools": " ".join(c.tool for c in open_calls),
        }[kind]
        evidence = open_calls[0].start
    return QUESTIONS[kind].format(tool=tool).encode("ascii"), answer, evidence


def make_question(rng: np.random.Generator, session: Session, kind: str) -> tuple[bytes, str]:
    """(prompt, answer): the prompt is the session's text then the question of ``kind`` (one of
    KINDS), ending with ``"a: "``; the model should continue with the answer and a newline."""
    q, answer, _ = _question(rng, session, kind)
    return session.text + q, answer


def is_correct(generated: str, answer: str) -> bool:
    """Exact match: ``generated`` (the continuation of the prompt) is the answer then a newline,
    or the answer alone if generation stopped right there. Generate ``len(answer) + 1`` bytes."""
    return generated == answer or generated.startswith(answer + "\n")


@dataclass(frozen=True)
class SessionPrompt:
    """One evaluation prompt: its session ``seed`` (in ``spec.seeds``), question ``kind``, the
    ``prompt`` bytes, the ``answer`` and ``evidence``, the byte offset in the prompt of the
    earliest line the answer needs (so ``len(prompt) - evidence`` is how far back it lies)."""

    seed: int
    kind: str
    prompt: bytes
    answer: str
    evidence: int


def make_eval_prompts(spec: SessionSpec, kinds: tuple[str, ...] = KINDS) -> list[SessionPrompt]:
    """One agent log per seed of ``spec.seeds`` and one question of each of ``kinds`` on it.
    Session ``s`` is drawn from ``default_rng([SEED_TAG, s])`` and its question of kind k from
    ``default_rng([SEED_TAG, s, KINDS.index(k) + 1])``: the prompts are fixed by ``spec``."""
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"kinds must be a non-empty tuple of names from {KINDS}, got {kinds!r}")
    out = []
    for seed in spec.seeds:
        session = make_session(np.random.default_rng([SEED_TAG, seed]), spec)
        for kind in kinds:
            rng = np.random.default_rng([SEED_TAG, seed, KINDS.index(kind) + 1])
            q, answer, evidence = _question(rng, session, kind)
            out.append(SessionPrompt(seed, kind, session.text + q, answer, evidence))
    return out


TRAIN_SPEC = SessionSpec()  # the training samples' shape; their length follows seq_len
# The share of training samples asking each kind: the two the 1x control found hardest (open_arg's
# lookup, open_tools' list) drawn three times as often as outer_tool and open_count, which every
# open_tools answer also exercises; closed_ret keeps a uniform draw's fifth
TRAIN_KIND_SHARES = {"open_arg": 0.3, "outer_tool": 0.1, "open_count": 0.1, "open_tools": 0.3, "closed_ret": 0.2}


def _max_tail_bytes(spec: SessionSpec) -> int:
    """The longest question + answer + newline any kind can have under ``spec``."""
    longest = max(spec.tools, key=len)
    answers = (ARG_LETTERS + ARG_DIGITS, VALUE_DIGITS, len(str(spec.depth)), spec.depth * (len(longest) + 1) - 1)
    return max(len(q.format(tool=longest)) for q in QUESTIONS.values()) + max(answers) + 1


def training_sample_with_answer(rng: np.random.Generator, seq_len: int, tokenizer) -> tuple[np.ndarray, int]:
    """(ids, n): ``session_training_sample``'s ids and the answer's length in bytes; the answer is
    ``ids[-n - 1 : -1]`` (a newline follows it)."""
    seq_len = positive_int("seq_len", seq_len)
    probe = "call ab(cd12)\n"
    if list(tokenizer.encode(probe)) != list(probe.encode("ascii")):
        raise ValueError(f"tokenizer must be the byte tokenizer (sessions are bytes), got {type(tokenizer).__name__}")
    tail_max = _max_tail_bytes(TRAIN_SPEC)
    body, shortest = int(seq_len) + 1 - tail_max, min_length(TRAIN_SPEC) + tail_max - 1
    if body < min_length(TRAIN_SPEC):
        raise ValueError(f"seq_len must be >= {shortest} for agent sessions, got {seq_len}")
    kind = KINDS[int(rng.choice(len(KINDS), p=[TRAIN_KIND_SHARES[k] for k in KINDS]))]
    session = make_session(rng, replace(TRAIN_SPEC, length=body))
    q, answer, _ = _question(rng, session, kind)
    tail = q + (answer + "\n").encode("ascii")
    # the final observation grows by what this question and answer leave of tail_max
    head = session.text[: session.text.rindex(b"\n", 0, len(session.text) - 1) + 1]
    pad = _pad_line(rng, len(session.text) - len(head) + tail_max - len(tail)).encode("ascii")
    ids = np.asarray(tokenizer.encode((head + pad + tail).decode("ascii")), dtype=np.int64)
    return ids, len(answer)


def session_training_sample(rng: np.random.Generator, seq_len: int, tokenizer) -> np.ndarray:
    """The trainer's task mixer (TASK_MIXERS["agent-sessions"]): (seq_len + 1,) int64 byte ids, a
    session of TRAIN_SPEC's shape, a question of a kind drawn by TRAIN_KIND_SHARES, its answer and a
    newline.

    Raises:
        ValueError: ``seq_len`` is not a positive int or too short for a session, or
            ``tokenizer`` is not the byte tokenizer.
    """
    return training_sample_with_answer(rng, seq_len, tokenizer)[0]


def session_or_copy_sample(rng: np.random.Generator, seq_len: int, tokenizer) -> np.ndarray:
    """TASK_MIXERS["agent-sessions+copy"]: (seq_len + 1,) int64 byte ids, copy lines "S is S. "
    with probability fpa.tasks.copy.COPY_SHARE, else a session sample (``session_training_sample``):
    a dense signal for the copying an ``open_arg`` answer needs."""
    from fpa.tasks.copy import copy_or

    return copy_or(session_training_sample, rng, seq_len, tokenizer)


def answer_loss(model, tokenizer, seq_len: int, n: int = 32, seed: int = 20261205, device=None) -> float:
    """Mean next-token loss on the answer bytes (not the newline) of ``n`` fixed training samples
    of ``seq_len`` tokens (seeds ``[seed, i]``), all kinds pooled: the task's learning curve."""
    import torch

    rows, spans = [], []
    for i in range(n):
        ids, n_ans = training_sample_with_answer(np.random.default_rng([seed, i]), seq_len, tokenizer)
        rows.append(ids)
        spans.append((len(ids) - 1 - n_ans, len(ids) - 1))
    x = torch.from_numpy(np.stack(rows))
    if device is not None:
        x = x.to(device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        tok = model(input_ids=x, labels=x, return_per_token_loss=True).per_token_loss.float()  # (n, T)
    if was_training:
        model.train()
    # per_token_loss[:, t] is the loss of predicting ids[t + 1]
    return float(torch.cat([tok[r, a - 1 : b - 1] for r, (a, b) in enumerate(spans)]).mean())
