"""Nested-structure task generators whose answers depend on a stack of live keys (docs/fpa.md, "Properties", P3).

Every task draws a batch of N sequences of length T. Position T - 1 holds the query token; the
model reads its answer there. A sample is:

- ``tokens`` (N, T) int64: token ids in ``range(task.vocab_size)``;
- ``target`` (N, T) bool: the target key set of the final query (the keys attention must cover);
- ``answer`` (N,) float32: the scalar to predict; ``tolerance`` (N,): half the spacing of the
  answer grid, so an answer within tolerance decodes to the exact discrete answer.

Tasks (m = the structural size at the query, see each class):

- ``stack``: pushes carry a payload bit, ``POP`` pops; the target set is exactly the live stack
  (m keys) and the answer is the fraction of live pushes with payload 1 (a multiple of 1/m). The
  mean of the payload bits over the target set gives it exactly; every other key (popped pushes,
  pops, the query) carries a random bit too, so attention mass outside the set moves it.
- ``scope``: ``{``, ``}``, declarations ``x = v`` of two variables, ``;`` statements; the query
  ``print x`` asks for the value of the open declaration of x (a variable is not redeclared while
  a declaration of it is open: the one-layer setting has no recency, so shadowing inside the open
  chain is out of scope). Closed blocks must be forgotten, outer declarations stay reachable.
  m = the block depth at the query; the target set is one key.
- ``calls``: an agent-like log: ``call A`` / ``call B`` open a call, ``return`` closes the
  innermost one, ``obs 0`` / ``obs 1`` are observations that leave the call stack alone (returns
  and the query carry a random bit as well). The answer
  is the fraction of open calls that are to tool B; the target set is the m open calls.

Dense supervision (``Task.prefix_answers``): for ``stack`` and ``calls`` the answer is defined after
every token (the live stack of that prefix; undefined while the stack is empty), so every position
can be supervised, not only the final query. In ``scope`` only a ``print`` asks a question (it names
the variable), so prints of open variables also appear along the sequence and each is supervised.

Generation is vectorised over the batch and deterministic given the numpy Generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fpa.checks import positive_int

PUSH, POP, OTHER = 1, -1, 0


@dataclass(frozen=True)
class TaskBatch:
    """tokens (N, T) int64, target (N, T) bool, answer (N,) float32, tolerance (N,) float32."""

    tokens: np.ndarray
    target: np.ndarray
    answer: np.ndarray
    tolerance: np.ndarray


def sample_walk(rng: np.random.Generator, n: int, steps: int, m: int, other_weight: float = 0.0) -> np.ndarray:
    """Random push/pop(/other) events (n, steps) in {PUSH, POP, OTHER} ending at depth exactly m.

    The depth never goes below 0. At each step one of the events that can still reach depth m
    is drawn with weights (push 1, pop 1, other ``other_weight``).
    """
    if m < 0 or steps < m:
        raise ValueError(f"need 0 <= m <= steps, got m={m}, steps={steps}")
    if other_weight == 0 and (steps - m) % 2:
        raise ValueError(f"without OTHER events steps - m must be even, got steps={steps}, m={m}")
    depth = np.zeros(n, dtype=np.int64)
    ops = np.empty((n, steps), dtype=np.int64)
    for t in range(steps):
        left = steps - t - 1
        cands = []
        for op, w in ((PUSH, 1.0), (POP, 1.0), (OTHER, other_weight)):
            h = depth + op
            ok = (h >= 0) & (np.abs(m - h) <= left) & (w > 0)
            if other_weight == 0:
                ok &= (left - np.abs(m - h)) % 2 == 0
            cands.append(np.where(ok, w, 0.0))
        weights = np.stack(cands, -1)
        cum = np.cumsum(weights, -1)
        u = rng.random(n) * cum[:, -1]
        choice = (u[:, None] >= cum).sum(-1)
        ops[:, t] = np.array([PUSH, POP, OTHER])[choice]
        depth += ops[:, t]
    return ops


def live_pushes(ops: np.ndarray) -> np.ndarray:
    """(n, steps) bool: the pushes still on the stack after the last event (vectorised stack)."""
    n, steps = ops.shape
    stack = np.full((n, steps + 1), -1, dtype=np.int64)  # stack[b, h] = position of the push at depth h + 1
    depth = np.zeros(n, dtype=np.int64)
    rows = np.arange(n)
    for t in range(steps):
        push = ops[:, t] == PUSH
        stack[rows[push], depth[push]] = t
        depth += ops[:, t]
    live = np.zeros((n, steps), dtype=bool)
    for b in range(n):
        live[b, stack[b, : depth[b]]] = True
    return live


class Task:
    """Base: ``sample(rng, n, m, length_factor)``; subclasses define the vocabulary and rendering."""

    name: str = ""
    vocab_size: int = 0
    other_weight: float = 0.0

    def length(self, m: int, length_factor: int = 1) -> int:
        """Sequence length T (query included) for m at ``length_factor`` times the training length."""
        base = m + 16  # at least ~7 popped (dead) keys at the training length
        steps = length_factor * base - 1
        if self.other_weight == 0 and (steps - m) % 2:
            steps -= 1
        return steps + 1

    def sample(self, rng: np.random.Generator, n: int, m: int, length_factor: int = 1) -> TaskBatch:
        """A batch of ``n`` sequences of ``self.length(m, length_factor)`` tokens with m targets at the query.

        Raises:
            ValueError: If ``m`` < 1.
        """
        positive_int("m", m, "targets at the query")
        steps = self.length(m, length_factor) - 1
        ops = sample_walk(rng, n, steps, m, self.other_weight)
        return self.render(rng, ops, m)

    def render(self, rng: np.random.Generator, ops: np.ndarray, m: int) -> TaskBatch:  # pragma: no cover
        """Turn walks ``ops`` (n, steps) of PUSH/POP/OTHER into the task's tokens, targets and answers."""
        raise NotImplementedError

    def prefix_answers(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Dense supervision: (answer, tolerance, valid), each shaped like tokens (..., T).

        The answer the model should give at every position t for the prefix tokens[..., :t + 1],
        read from the tokens alone; ``valid`` is False where it is undefined. At the final query it
        equals the batch's ``answer``. None for a task without a per-prefix answer.
        """
        return None


def _with_query(body: np.ndarray, query: np.ndarray | int) -> np.ndarray:
    q = np.broadcast_to(np.asarray(query, dtype=np.int64), (body.shape[0],))
    return np.concatenate([body, q[:, None]], 1)


def _fraction_task(
    rng: np.random.Generator,
    ops: np.ndarray,
    m: int,
    push_ids: tuple[int, int],
    pop_ids: tuple[int, int],
    other_ids: tuple[int, int] | None,
    query_ids: tuple[int, int],
) -> TaskBatch:
    """Shared rendering of ``stack`` and ``calls``: the answer is the fraction of live pushes with bit 1.

    Every token carries a random bit (pops, observations and the query too, in their token id),
    so attention mass on any key outside the target set perturbs the mean of the bits.
    """
    n = ops.shape[0]
    bits = rng.integers(0, 2, size=ops.shape)
    tok = np.where(ops == PUSH, np.asarray(push_ids)[bits], np.asarray(pop_ids)[bits])
    if other_ids is not None:
        tok = np.where(ops == OTHER, np.asarray(other_ids)[bits], tok)
    live = live_pushes(ops)
    answer = (live & (bits == 1)).sum(1) / m
    target = np.concatenate([live, np.zeros((n, 1), dtype=bool)], 1)
    query = np.asarray(query_ids)[rng.integers(0, 2, size=n)]
    return TaskBatch(_with_query(tok, query), target, answer.astype(np.float32), np.full(n, 0.5 / m, dtype=np.float32))


def _prefix_fractions(
    tokens: np.ndarray, push_ids: tuple[int, int], pop_ids: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per prefix: the fraction of live pushes with bit 1 (push id push_ids[1]), tolerance 0.5 / depth,
    valid where the stack is non-empty. Other tokens (observations, queries) leave the stack alone."""
    shape = tokens.shape
    tok = tokens.reshape(-1, shape[-1])
    n, T = tok.shape
    bit_of_push = np.full(int(tok.max(initial=0)) + 1, 0, dtype=np.int64)
    bit_of_push[push_ids[1]] = 1
    stack = np.zeros((n, T + 1), dtype=np.int64)  # stack[b, h] = bit of the push at depth h + 1
    depth = np.zeros(n, dtype=np.int64)
    ones = np.zeros(n, dtype=np.int64)
    rows = np.arange(n)
    answer = np.zeros((n, T), dtype=np.float32)
    tol = np.zeros((n, T), dtype=np.float32)
    valid = np.zeros((n, T), dtype=bool)
    for t in range(T):
        x = tok[:, t]
        push = np.isin(x, push_ids)
        pop = np.isin(x, pop_ids) & (depth > 0)
        stack[rows[push], depth[push]] = bit_of_push[x[push]]
        ones += bit_of_push[x] * push
        depth += push
        ones -= stack[rows, np.maximum(depth - 1, 0)] * pop
        depth -= pop
        d = np.maximum(depth, 1)
        answer[:, t], tol[:, t], valid[:, t] = ones / d, 0.5 / d, depth > 0
    return answer.reshape(shape), tol.reshape(shape), valid.reshape(shape)


class StackTask(Task):
    """Tokens (bit b in 0/1): b = push with payload b, 2 + b = POP, 4 + b = QUERY. m = live stack size."""

    name, vocab_size = "stack", 6

    def render(self, rng: np.random.Generator, ops: np.ndarray, m: int) -> TaskBatch:
        """Pushes and pops with random payload bits; the answer is the fraction of live payloads 1."""
        return _fraction_task(rng, ops, m, (0, 1), (2, 3), None, (4, 5))

    def prefix_answers(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per prefix: the fraction of live payloads 1, valid where the stack is non-empty."""
        return _prefix_fractions(tokens, (0, 1), (2, 3))


class CallsTask(Task):
    """Tokens (bit b): b = call A/B, 2 + b = return, 4 + b = obs b, 6 + b = QUERY. m = open calls."""

    name, vocab_size, other_weight = "calls", 8, 1.0

    def render(self, rng: np.random.Generator, ops: np.ndarray, m: int) -> TaskBatch:
        """Calls, returns and observations with random bits; the answer is the fraction of open calls B."""
        return _fraction_task(rng, ops, m, (0, 1), (2, 3), (4, 5), (6, 7))

    def prefix_answers(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per prefix: the fraction of open calls B, valid where a call is open."""
        return _prefix_fractions(tokens, (0, 1), (2, 3))


class ScopeTask(Task):
    """Tokens: 0 = ``{``, 1 = ``}``, 2 = ``;``, 3 + 4 * var + value = ``var = value`` (2 vars, 4 values),
    11 + var = ``print var``. m = block depth at the final query. ``print`` of an open variable
    also appears along the sequence (a third of the statements that are not declarations), so
    every print is a supervised position (``prefix_answers``), as every position is in stack.
    """

    name, vocab_size, other_weight = "scope", 13, 1.0
    n_vars, n_values = 2, 4
    OPEN, CLOSE, STMT, DECL, PRINT = 0, 1, 2, 3, 11

    def render(self, rng: np.random.Generator, ops: np.ndarray, m: int) -> TaskBatch:
        """Blocks, declarations and prints; the answer is the value of the printed variable in scope."""
        n, steps = int(ops.shape[0]), int(ops.shape[1])
        tok = np.where(ops == PUSH, self.OPEN, np.where(ops == POP, self.CLOSE, self.STMT))
        live_decl = np.full((n, self.n_vars), -1, dtype=np.int64)  # position of the open decl of var
        decl_depth = np.zeros((n, self.n_vars), dtype=np.int64)  # block depth it was made at
        value = np.zeros((n, self.n_vars), dtype=np.int64)
        depth = np.zeros(n, dtype=np.int64)
        rows = np.arange(n)
        for t in range(steps):
            closing = (ops[:, t] == POP)[:, None] & (decl_depth == depth[:, None]) & (live_decl >= 0)
            live_decl[closing] = -1  # the block these were declared in closes now
            depth += ops[:, t]
            free = live_decl < 0
            want = (ops[:, t] == OTHER) & free.any(1) & (rng.random(n) < 0.75)
            var = (rng.random((n, self.n_vars)) * free).argmax(1)  # a free variable, uniformly
            val = rng.integers(0, self.n_values, size=n)
            w = rows[want]
            tok[w, t] = self.DECL + var[w] * self.n_values + val[w]
            live_decl[w, var[w]] = t
            decl_depth[w, var[w]] = depth[w]
            value[w, var[w]] = val[w]
            # a third of the other statements print an open variable: answers along the sequence
            ask = (ops[:, t] == OTHER) & ~want & (~free).any(1) & (rng.random(n) < 1 / 3)
            pvar = (rng.random((n, self.n_vars)) * ~free).argmax(1)
            tok[rows[ask], t] = self.PRINT + pvar[ask]
        has = live_decl >= 0
        r = rng.random((n, self.n_vars)) * has
        qvar = r.argmax(1)
        ok = has.any(1)
        target = np.zeros((n, steps + 1), dtype=bool)
        target[rows[ok], live_decl[rows[ok], qvar[ok]]] = True
        answer = value[rows, qvar] / (self.n_values - 1)
        batch = TaskBatch(
            _with_query(tok, self.PRINT + qvar),
            target,
            answer.astype(np.float32),
            np.full(n, 0.5 / (self.n_values - 1), dtype=np.float32),
        )
        if not ok.all():  # no open declaration at the end: redraw those rows
            sub = self.render(rng, sample_walk(rng, int((~ok).sum()), steps, m, self.other_weight), m)
            for a, b in (
                (batch.tokens, sub.tokens),
                (batch.target, sub.target),
                (batch.answer, sub.answer),
                (batch.tolerance, sub.tolerance),
            ):
                a[~ok] = b
        return batch

    def prefix_answers(self, tokens):
        """Answer (value / 3 of the open declaration of the printed variable) at every ``print``
        whose variable is open; tolerance 0.5 / 3; valid only there."""
        shape = tokens.shape
        tok = tokens.reshape(-1, shape[-1])
        n, T = tok.shape
        value = np.full((n, self.n_vars), -1, dtype=np.int64)  # -1: no open declaration
        decl_depth = np.zeros((n, self.n_vars), dtype=np.int64)
        depth = np.zeros(n, dtype=np.int64)
        rows = np.arange(n)
        answer = np.zeros((n, T), dtype=np.float32)
        valid = np.zeros((n, T), dtype=bool)
        for t in range(T):
            x = tok[:, t]
            close = (x == self.CLOSE)[:, None] & (decl_depth == depth[:, None])
            value[close] = -1
            depth += (x == self.OPEN).astype(np.int64) - (x == self.CLOSE)
            decl = (x >= self.DECL) & (x < self.PRINT)
            var, val = np.divmod(np.where(decl, x - self.DECL, 0), self.n_values)
            value[rows[decl], var[decl]] = val[decl]
            decl_depth[rows[decl], var[decl]] = depth[decl]
            pr = x >= self.PRINT
            seen = value[rows, np.where(pr, x - self.PRINT, 0)]
            valid[:, t] = pr & (seen >= 0)
            answer[:, t] = np.where(valid[:, t], seen / (self.n_values - 1), 0.0)
        tol = np.full((n, T), 0.5 / (self.n_values - 1), dtype=np.float32)
        return answer.reshape(shape), tol.reshape(shape), valid.reshape(shape)


TASKS: dict[str, Task] = {t.name: t for t in (StackTask(), ScopeTask(), CallsTask())}


def get_task(name: str) -> Task:
    """The task registered as ``name`` in TASKS."""
    if name not in TASKS:
        raise ValueError(f"task must be one of {tuple(TASKS)}, got {name!r}")
    return TASKS[name]
