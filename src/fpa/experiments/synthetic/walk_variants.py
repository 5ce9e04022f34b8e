"""Why one-layer FPA walk heads missed the success bar: a fixed diagnostic set of cells and seeds,
trained under parametrisation variants of the walk, each factor switched on its own.

    python -m fpa.experiments.synthetic.walk_variants --out results/synthetic/diagnostic

The three factors (``FirstPassageAttention`` arguments):

- ``walk_increment``: "linear" increments grow without bound and push / pop steps learned from
  different tokens never cancel exactly (+8.6 / -8.2 was measured), so live keys drift into a dip
  at 4x length; "tanh" bounds each step to (-1, 1) and saturated steps cancel to ~1e-4.
- ``walk_bias_init``: with every increment >= 0 the field never falls, every dip is 0 and the
  increments get no gradient (the max(0, .) in the dip is flat): a head that drifts there is
  stuck for good. A negative initial bias starts the walk as a decay (FoX-like, P2), so every
  key has a dip and every increment a gradient.
- ``beta_activation``: "softplus" grows beta by about lr per Adam step; "exp" by a factor
  exp(lr) per step, so the penalty of a dead key reaches the margin that 4x length needs.

Every variant runs the same recipe, data and seeds; only the FPA walk layer's arguments differ.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fpa.experiments.synthetic.capacity import SynthRecipe, make_cell_data, train_cell

# every variant names its level offset, so a variant means the same whatever the library default
LEGACY = dict(
    walk_increment="linear", walk_bias_init=0.0, beta_activation="softplus", level_offset="none"
)  # FPA parametrisation version 1
TANH = dict(
    walk_increment="tanh", walk_bias_init=0.0, beta_activation="exp", level_offset="none"
)  # version 2, no offset
DEFAULT = dict(TANH, level_offset="head", level_offset_init=1.0)  # the synthetic heads' walk (fpa.models.packed)
DECAY_INIT = dict(TANH, walk_bias_init=-1.0)  # the walk starts as a decay: no dead zone


def label(kw: dict, steps: int) -> str:
    """A variant's name from its layer arguments: 'tanh, exp, bias -1, 1600 steps'."""
    beta0 = f", initial beta {math.log1p(math.exp(kw['beta_init'])):.2f}" if kw.get("beta_init") else ""
    offset = f", head offset from {kw['level_offset_init']:g}" if kw.get("level_offset") == "head" else ""
    return (
        f"{kw['walk_increment']}, {kw['beta_activation']}, bias {kw['walk_bias_init']:g}{beta0}{offset}, {steps} steps"
    )


# name -> (layer kwargs, training steps): each factor on its own, against the legacy and the default
VARIANTS: dict[str, tuple[dict, int]] = {
    label(kw, n): (kw, n)
    for kw, n in (
        (LEGACY, 800),
        (LEGACY, 1600),
        (TANH, 1600),
        (TANH, 2400),
        (DECAY_INIT, 800),
        (DECAY_INIT, 1600),
        (DECAY_INIT, 2400),
        (dict(DECAY_INIT, walk_increment="linear"), 1600),
        (dict(DECAY_INIT, beta_activation="softplus"), 1600),
    )
}
# (task, m, d): small and large stacks, and one cell of each other task
CELLS = (("stack", 2, 1), ("stack", 16, 4), ("stack", 32, 8), ("calls", 4, 1), ("scope", 4, 8))
SEEDS = tuple(range(30, 38))  # never used by the grids (0-4) or the quick preset (0-2)


def run(variants: dict[str, tuple] = VARIANTS, cells=CELLS, seeds=SEEDS, progress: bool = True) -> list[dict]:
    """One row per (variant, cell): success count, per-seed target mass and accuracy at 1x and 4x.
    A variant is (layer kwargs, steps) or (layer kwargs, steps, SynthRecipe overrides), e.g. a
    length curriculum {"long_every": 4}."""
    rows = []
    bar = tqdm(total=len(variants) * len(cells), disable=not progress, desc="diagnostic")
    for name, (kw, steps, *train_kw) in variants.items():
        cfg = SynthRecipe(steps=steps, **(train_kw[0] if train_kw else {}))
        for task, m, d in cells:
            bar.set_postfix_str(f"{name} {task} m={m} d={d}")
            recs = train_cell(
                task, "fpa-walk", d, m, tuple(seeds), cfg, make_cell_data(task, m, tuple(seeds), cfg), layer_kwargs=kw
            )
            per = {
                f: {k: [r["per_length"][f][k] for r in recs] for k in ("target_mass", "accuracy")} for f in ("1x", "4x")
            }
            stuck = sum(r["per_length"]["1x"]["target_mass"] < 0.5 for r in recs)
            rows.append(
                dict(
                    variant=name,
                    layer_kwargs=kw,
                    steps=steps,
                    train_overrides=train_kw[0] if train_kw else {},
                    task=task,
                    m=m,
                    dim=d,
                    seeds=list(seeds),
                    success=sum(r["success"] for r in recs),
                    stuck=stuck,
                    per_length=per,
                )
            )
            bar.update()
    bar.close()
    return rows


def to_markdown(rows: list[dict]) -> str:
    """One markdown table of ``run``'s rows: successes per variant and cell, stuck runs and median 4x target mass."""
    cells = list(dict.fromkeys((r["task"], r["m"], r["dim"]) for r in rows))
    n = len(rows[0]["seeds"])
    lines = [
        f"# FPA walk diagnostic: successes out of {n} fresh seeds ({rows[0]['seeds'][0]}-{rows[0]['seeds'][-1]})",
        "",
        "Success: target mass and accuracy >= 0.99 at 1x and 4x. In brackets: runs stuck at 1x target mass < 0.5 "
        "(the walk never formed), then the median 4x target mass.",
        "",
        "| variant | " + " | ".join(f"{t} m={m} d={d}" for t, m, d in cells) + " | total |",
        "|---|" + "---|" * (len(cells) + 1),
    ]
    for name in dict.fromkeys(r["variant"] for r in rows):
        mine = {(r["task"], r["m"], r["dim"]): r for r in rows if r["variant"] == name}
        tot = sum(r["success"] for r in mine.values())
        vals = [
            f"{mine[c]['success']} ({mine[c]['stuck']}; {np.median(mine[c]['per_length']['4x']['target_mass']):.3f})"
            for c in cells
        ]
        lines.append(f"| {name} | " + " | ".join(vals) + f" | {tot}/{n * len(cells)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command line: run the diagnostic and write diagnostic.json and diagnostic.md to ``--out``."""
    from fpa.cli import writable_dir
    from fpa.data.atomic import atomic_write_bytes

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output folder (diagnostic.json, diagnostic.md)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    writable_dir(args.out, "--out")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = run(progress=not args.no_progress)
    atomic_write_bytes(out / "diagnostic.json", json.dumps(rows, indent=1).encode())
    md = to_markdown(rows)
    atomic_write_bytes(out / "diagnostic.md", md.encode())
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
