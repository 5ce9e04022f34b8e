"""Draw the package import graph of src/fpa to docs/imports.png.

The edges are read with ``ast`` by the layering test (tests/test_import_layers.py), so the
picture and the test see the same graph. Packages sit on the rows of the documented layering;
an arrow goes from the importing package to the imported one and is drawn red if it does not
point down (the test fails on those).

    python scripts/draw_imports.py [--out docs/imports.png]
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ROWS = [
    ["ops", "data"],
    ["cache.store"],
    ["layers", "cache"],
    ["models", "tasks"],
    ["train", "eval"],
    ["experiments"],
    ["cli"],
]


def _layering_test():
    spec = importlib.util.spec_from_file_location("test_import_layers", ROOT / "tests" / "test_import_layers.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def package_edges() -> dict[str, set[str]]:
    """Importing package -> the fpa packages it imports (cli: the modules fpa.cli's command table
    imports on demand)."""
    t = _layering_test()
    edges = {a: set(bs) for a, bs in t._package_edges().items()}
    import sys

    sys.path.insert(0, str(ROOT / "src"))
    from fpa.cli import COMMANDS  # the command table: module names imported on demand

    edges["cli"] = {t._unit(spec[0]) for spec in COMMANDS.values()} & set(t.PACKAGES)
    return edges


def draw(out: Path) -> int:
    """Write the figure; return the number of arrows that do not point down."""
    rank = {p: r for r, row in enumerate(ROWS) for p in row}
    pos = {p: ((i + 0.5) / len(row) * 3.0, float(r)) for r, row in enumerate(ROWS) for i, p in enumerate(row)}
    edges = package_edges()
    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    upward = 0
    for a, bs in sorted(edges.items()):
        for b in sorted(bs):
            (xa, ya), (xb, yb) = pos[a], pos[b]
            down = rank[b] < rank[a]
            upward += not down
            ax.annotate(
                "",
                xy=(xb, yb + 0.14),
                xytext=(xa, ya - 0.14),
                arrowprops=dict(
                    arrowstyle="-|>",
                    color="0.45" if down else "red",
                    lw=0.9,
                    shrinkA=4,
                    shrinkB=4,
                    connectionstyle="arc3,rad=0.08",
                ),
            )
    for p, (x, y) in pos.items():
        ax.text(x, y, p, ha="center", va="center", fontsize=10, bbox=dict(boxstyle="round", fc="#dde8f5", ec="0.3"))
    ax.set_xlim(-0.1, 3.1)
    ax.set_ylim(-0.5, len(ROWS) - 0.5)
    ax.axis("off")
    n = sum(len(bs) for bs in edges.values())
    ax.set_title(
        f"fpa package imports: {n} arrows, {upward} not pointing down\n(arrow: importer -> imported)", fontsize=10
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return upward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "imports.png")
    args = ap.parse_args()
    upward = draw(args.out)
    print(f"wrote {args.out}; arrows not pointing down: {upward}")
    raise SystemExit(1 if upward else 0)


if __name__ == "__main__":
    main()
