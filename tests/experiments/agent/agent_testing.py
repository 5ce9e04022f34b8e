"""Hand-built stage outputs of ``fpa agent`` (the shapes workers.py writes), for the analysis and
report tests: every figure in them is chosen, so the expected results are known."""

from __future__ import annotations

import dataclasses

from fpa.experiments.agent.analysis import CONTROL_METHOD, accuracy, decode_name
from fpa.experiments.agent.preset import ARMS, BUDGET_METHODS, METHODS, PRESETS, AgentPreset
from fpa.tasks.agent_sessions import CLOSED_KINDS, KINDS, OPEN_KINDS

PRESET = dataclasses.replace(PRESETS["smoke"], seeds=(0, 1), lengths=(1000, 10_000, 100_000), sessions=(2, 1, 1))


def call(role: str, kept: float, depth: int = 1, text: str = "abc12", start: int = 0, penalty=None) -> dict:
    """One entry of a session's "calls": ``kept`` share of its line and argument held, in layer 0
    (layer 1 holds none of it)."""
    out = dict(role=role, tool="run", depth=depth, text=text, line=(start, start + 16), arg=(start + 9, start + 14))
    out.update(line_kept=[kept, 0.0], arg_kept=[kept, 0.0])
    if penalty is not None:
        out["penalty"] = penalty
    return out


def session(length: int, kept: float, open_right: float, closed_right: bool, seed: int = 0, calls=None) -> dict:
    """One decoded session: ``kept`` keys per head, one question of each kind, the open ones right
    while ``i / len(OPEN_KINDS) < open_right``."""
    questions = [
        dict(
            kind=k,
            answer="abc12",
            generated="abc12\n",
            correct=i / len(OPEN_KINDS) < open_right,
            steps=2,
            decode_s=0.01,
        )
        for i, k in enumerate(OPEN_KINDS)
    ]
    questions += [dict(kind=k, answer="40917", correct=closed_right, steps=2, decode_s=0.01) for k in CLOSED_KINDS]
    assert {q["kind"] for q in questions} == set(KINDS)
    return dict(
        seed=seed,
        length=length,
        kept_keys=kept,
        keys_held=[[kept, kept]],
        bytes_held=64 * kept,
        bytes_live=60 * kept,
        peak_bytes=80 * kept,
        prefill_s=1e-4 * length,
        questions=questions,
        calls=calls if calls is not None else [call("open", 1.0), call("closed", 0.0)],
    )


def decoded(method: str, length: int, kept: float, open_right: float, n: int = 1, budget=None) -> dict:
    """A decode stage's output: ``n`` sessions alike."""
    ss = [session(length, kept, open_right, method == "fpa-full", seed=i) for i in range(n)]
    return dict(method=method, length=length, budget=budget, sessions=ss, accuracy={})


def stages(
    p: AgentPreset = PRESET,
    fpa_exponent: float = 0.1,
    passed: dict | None = None,
    fpa_right: float = 1.0,
    baseline_right: float = 0.5,
    decodes: bool = True,
) -> dict:
    """Stage outputs of a whole run: controls (``passed`` {(arm, seed): bool}, default all passed),
    FPA's rule keeping 50 * (L / 1000)^fpa_exponent keys and answering ``fpa_right`` of the open
    questions, the full cache keeping L and answering all, FoX's rule and the budget baselines
    ``baseline_right``."""
    passed = passed or {}
    out = {}
    for arm in ARMS:
        for s in p.seeds:
            ok = passed.get((arm, s), True)
            ss = [session(300, 300.0, 1.0 if ok else 0.0, False)]
            acc = accuracy(ss[0]["questions"])
            out[f"control-{arm}-s{s}"] = dict(method=CONTROL_METHOD[arm], accuracy=acc, passed=ok, sessions=ss)
    if not decodes:
        return out
    for s in p.seeds:
        for L, n in zip(p.lengths, p.sessions):
            fpa_kept = 50 * (L / 1000) ** fpa_exponent
            for m in METHODS:
                if m == "fpa-rule":
                    out[decode_name(m, s, L)] = decoded(m, L, fpa_kept, fpa_right, n)
                elif m == "fpa-full":
                    out[decode_name(m, s, L)] = decoded(m, L, float(L), 1.0, n)
                else:
                    budget = round(fpa_kept) if m in BUDGET_METHODS else None
                    out[decode_name(m, s, L)] = decoded(m, L, float(budget or 30), baseline_right, n, budget)
    return out
