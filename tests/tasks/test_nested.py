"""The generators' targets and answers against an independent token-level stack simulation."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fpa.tasks.nested import ScopeTask, get_task, sample_walk


def simulate_fraction(tokens, push_ids, pop_ids, query_ids):
    """Replay the tokens with a Python list as the stack: (target positions, answer, depth)."""
    assert tokens[-1] in query_ids
    stack = []
    for pos, tok in enumerate(tokens[:-1]):
        assert tok not in query_ids
        if tok in push_ids:
            stack.append((pos, push_ids.index(tok)))
        elif tok in pop_ids:
            stack.pop()
    return {p for p, _ in stack}, sum(b for _, b in stack) / len(stack), len(stack)


def simulate_scope(tokens):
    """Replay ``{ } ; x=v print x`` with a list of blocks: (target position, value / 3, open depth)."""
    s = ScopeTask
    blocks = [{}]  # top level + one dict per open block: var -> (pos, value)
    for pos, tok in enumerate(tokens[:-1]):
        if tok == s.OPEN:
            blocks.append({})
        elif tok == s.CLOSE:
            blocks.pop()
        elif s.DECL <= tok < s.PRINT:
            var, val = divmod(tok - s.DECL, s.n_values)
            assert all(var not in b for b in blocks), "redeclared while a declaration is open"
            blocks[-1][var] = (pos, val)
    var = tokens[-1] - s.PRINT
    found = [b[var] for b in blocks if var in b]
    assert len(found) == 1
    return {found[0][0]}, found[0][1] / (s.n_values - 1), len(blocks) - 1


SIMULATORS = {
    "stack": lambda t: simulate_fraction(list(t), [0, 1], [2, 3], [4, 5]),
    "calls": lambda t: simulate_fraction(list(t), [0, 1], [2, 3], [6, 7]),
    "scope": simulate_scope,
}


@settings(max_examples=40, deadline=None)
@given(
    task=st.sampled_from(sorted(SIMULATORS)),
    seed=st.integers(0, 2**32 - 1),
    m=st.integers(1, 12),
    factor=st.sampled_from([1, 4]),
)
def test_targets_match_stack_simulation(task, seed, m, factor):
    t = get_task(task)
    b = t.sample(np.random.default_rng(seed), 6, m, factor)
    assert b.tokens.shape == b.target.shape == (6, t.length(m, factor))
    assert b.tokens.min() >= 0 and b.tokens.max() < t.vocab_size
    for i in range(6):
        target, answer, depth = SIMULATORS[task](b.tokens[i])
        assert set(np.flatnonzero(b.target[i])) == target
        assert b.answer[i] == pytest.approx(answer, abs=1e-6)
        assert depth == m
        # the tolerance is half the spacing of the answer grid
        spacing = 1 / m if task != "scope" else 1 / (ScopeTask.n_values - 1)
        assert b.tolerance[i] == pytest.approx(spacing / 2)


def test_deterministic_by_seed_and_longer_at_4x():
    t = get_task("stack")
    a, b = (t.sample(np.random.default_rng(5), 4, 8) for _ in range(2))
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.target, b.target)
    c = t.sample(np.random.default_rng(6), 4, 8)
    assert not np.array_equal(a.tokens, c.tokens)
    assert t.length(8, 4) >= 4 * t.length(8, 1) - 2


def test_scope_has_closed_and_outer_declarations():
    """The task is not trivial: some closed declarations of the queried variable exist (must be forgotten)."""
    b = get_task("scope").sample(np.random.default_rng(0), 200, 3)
    s = ScopeTask
    qvar = b.tokens[:, -1] - s.PRINT
    is_decl = (b.tokens >= s.DECL) & (b.tokens < s.PRINT)
    same_var = is_decl & ((b.tokens - s.DECL) // s.n_values == qvar[:, None])
    closed = (same_var & ~b.target).any(1)
    assert closed.mean() > 0.2


@pytest.mark.parametrize("kw,match", [(dict(steps=3, m=5), "m <= steps"), (dict(steps=4, m=1), "even")])
def test_walk_rejects_impossible(kw, match):
    with pytest.raises(ValueError, match=match):
        sample_walk(np.random.default_rng(0), 2, **kw)


def test_unknown_task_and_bad_m():
    with pytest.raises(ValueError, match="task must be one of"):
        get_task("dyck")
    with pytest.raises(ValueError, match="m must be a positive int"):
        get_task("stack").sample(np.random.default_rng(0), 2, 0)


@pytest.mark.parametrize("task,non_target_pairs", [("stack", [(2, 3), (4, 5)]), ("calls", [(2, 3), (4, 5), (6, 7)])])
def test_non_target_tokens_carry_random_bits(task, non_target_pairs):
    """Pops, observations and queries come in both bit versions, so attending to them moves the answer."""
    tok = get_task(task).sample(np.random.default_rng(3), 64, 4).tokens
    for a, b in non_target_pairs:
        assert (tok == a).any() and (tok == b).any()


def simulate_prefixes(tokens, push_ids, pop_ids):
    """Per position: (answer, depth) of the live stack after that token, with a Python list."""
    stack, out = [], []
    for tok in tokens:
        if tok in push_ids:
            stack.append(push_ids.index(tok))
        elif tok in pop_ids:
            stack.pop()
        out.append((sum(stack) / len(stack) if stack else None, len(stack)))
    return out


@settings(max_examples=30, deadline=None)
@given(
    task=st.sampled_from(["stack", "calls"]),
    seed=st.integers(0, 2**32 - 1),
    m=st.integers(1, 12),
    factor=st.sampled_from([1, 4]),
)
def test_prefix_answers_match_simulation(task, seed, m, factor):
    t = get_task(task)
    b = t.sample(np.random.default_rng(seed), 5, m, factor)
    ans, tol, valid = t.prefix_answers(b.tokens)
    assert ans.shape == tol.shape == valid.shape == b.tokens.shape
    # at the final query the dense answer is the task's answer
    np.testing.assert_allclose(ans[:, -1], b.answer, atol=1e-6)
    np.testing.assert_allclose(tol[:, -1], b.tolerance, atol=1e-7)
    assert valid[:, -1].all()
    for i in range(5):
        for pos, (a, depth) in enumerate(simulate_prefixes(list(b.tokens[i]), [0, 1], [2, 3])):
            assert valid[i, pos] == (depth > 0)
            if depth:
                assert ans[i, pos] == pytest.approx(a, abs=1e-6)
                assert tol[i, pos] == pytest.approx(0.5 / depth)
    # batched shapes (N, S, T) give the same values
    ans2, _, _ = t.prefix_answers(b.tokens[:, None, :])
    np.testing.assert_array_equal(ans2[:, 0], ans)


def test_scope_prefix_answers_match_the_simulation_at_every_print():
    """Every print of an open variable along the sequence is supervised with the simulated answer."""
    t = get_task("scope")
    for m, factor in ((1, 1), (3, 4), (8, 1)):
        b = t.sample(np.random.default_rng(m), 40, m, factor)
        ans, tol, valid = t.prefix_answers(b.tokens)
        assert valid[:, -1].all() and np.allclose(ans[:, -1], b.answer)
        inner = 0
        for i in range(len(b.tokens)):
            for pos in np.flatnonzero(b.tokens[i] >= ScopeTask.PRINT):
                _, answer, _ = simulate_scope(b.tokens[i][: pos + 1])
                assert valid[i, pos] and ans[i, pos] == pytest.approx(answer)
                inner += pos < len(b.tokens[i]) - 1
        assert inner > 0  # prints along the sequence, not only at the end
        assert np.all(tol == pytest.approx(0.5 / 3)) and not valid[b.tokens < ScopeTask.PRINT].any()
