"""The import graph of src/fpa points down: no cycles, and each package imports only the packages
below it. Read with ``ast`` (nothing is imported); an import counts wherever it is written, at
the top of a module or inside a function.

    ops <- cache.store <- layers <- models <- train, eval <- experiments
           cache.store <- cache  <- models
    data, tasks (ops, layers, data) sit beside them; experiments may import everything.

fpa.cache.store, the paged KV store (the cache's memory and the attention over it), is a unit of
its own: it imports only fpa.ops, and fpa.layers imports it and nothing else of fpa.cache. The rest
of fpa.cache (the transformers cache, the policies) imports only fpa.ops and the store.
fpa/cache/__init__.py imports its submodules lazily, so ``import fpa.layers`` (which runs it on
the way to the store) imports neither transformers nor the rest of fpa.cache.

Inside experiments, one subpackage per pipeline (lm, synthetic, agent) over the shared modules at
its top level (stages, pool, provenance): a shared module imports no pipeline, and a pipeline
imports no other pipeline, except agent -> synthetic (the agent trace trains the synthetic
study's packed heads with its recipe).

fpa/__init__.py (``import fpa``) must stay light: it imports no subpackage at module level.
fpa/compat.py (the transformers shims, used by models and cache) imports no fpa module.
fpa/checks.py (the number checks every package uses) imports no fpa module and not torch.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGES = ("ops", "cache.store", "layers", "cache", "models", "train", "data", "tasks", "eval", "experiments")

# package -> the fpa packages it may import (besides itself). Everything may use the root modules
# fpa.checks, fpa.compat and fpa.cli's helpers; "experiments" may import every package.
ALLOWED: dict[str, set[str]] = {
    "ops": set(),
    "data": set(),
    "cache.store": {"ops"},
    "layers": {"ops", "cache.store"},
    "cache": {"ops", "cache.store"},
    "models": {"ops", "layers", "cache", "data"},
    "tasks": {"ops", "layers", "data"},
    "train": {"ops", "layers", "models", "data", "tasks"},
    "eval": {"ops", "layers", "cache", "models", "data", "tasks"},
    "experiments": set(PACKAGES) - {"experiments"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "fpa").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path, top_level_only: bool = False) -> set[str]:
    """The fpa modules ``name`` imports (``from pkg import sub`` counts as pkg.sub when sub is a
    module). ``top_level_only``: only the statements at module level (not in a function or class)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else ast.walk(tree)
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names]
        else:
            continue
        for t in targets:
            while t not in MODULES and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in MODULES and t != name and t.startswith("fpa"):
                found.add(t)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _unit(module: str) -> str:
    """The package a module belongs to (fpa.cache.layer -> "cache", fpa.cache.store.paged ->
    "cache.store"), or the root module itself."""
    parts = module.split(".")
    if parts[1:3] == ["cache", "store"]:
        return "cache.store"
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else module


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _package_edges() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the module-level edges "a -> b" behind it."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for a, targets in GRAPH.items():
        for b in targets:
            ua, ub = _unit(a), _unit(b)
            if ua != ub and ua in PACKAGES and ub in PACKAGES:
                edges[ua][ub].append(f"{a} -> {b}")
    return edges


def test_the_graph_was_read():
    assert {"fpa.layers.first_passage", "fpa.cache.layer", "fpa.cache.store.state", "fpa.ops"} <= set(MODULES)
    assert "fpa.ops" in GRAPH["fpa.layers.first_passage"]  # a real edge is seen
    assert _unit("fpa.cache.store") == _unit("fpa.cache.store.paged") == "cache.store"
    assert _unit("fpa.cache") == _unit("fpa.cache.layer") == "cache" and _unit("fpa.checks") == "fpa.checks"


def test_no_module_cycle():
    """No import cycle between modules (top-level and function-level imports alike)."""
    assert _cycles(GRAPH) == []


def test_no_package_cycle():
    edges = _package_edges()
    cycles = _cycles({a: set(bs) for a, bs in edges.items()})
    sites = [site for c in cycles for a in c for b in c if b in edges[a] for site in edges[a][b]]
    assert cycles == [], f"import cycles between packages {cycles}, through {sites}"


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_only_what_lies_below_it(package):
    bad = {b: sites for b, sites in _package_edges()[package].items() if b not in ALLOWED[package]}
    assert not bad, f"fpa.{package} may import only {sorted(ALLOWED[package])}; it imports {bad}"


# experiments pipeline -> the other pipelines it may import (besides the shared top-level modules)
PIPELINES: dict[str, set[str]] = {"lm": set(), "synthetic": set(), "agent": {"synthetic"}}


def _pipeline(module: str) -> str | None:
    """The experiments pipeline a module belongs to (fpa.experiments.lm.report -> "lm"), else None."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "experiments" and parts[2] in PIPELINES else None


def test_every_experiments_subpackage_is_a_declared_pipeline():
    found = {p.name for p in (SRC / "fpa" / "experiments").iterdir() if (p / "__init__.py").is_file()}
    assert found == set(PIPELINES), f"fpa.experiments subpackages {sorted(found)}, declared {sorted(PIPELINES)}"


def test_pipelines_import_only_the_shared_modules_and_their_own():
    bad = []
    for a, targets in GRAPH.items():
        if _unit(a) != "experiments":
            continue
        pa = _pipeline(a)
        for b in targets:
            pb = _pipeline(b)
            if pb is not None and pb != pa and (pa is None or pb not in PIPELINES[pa]):
                bad.append(f"{a} -> {b}")
    assert not bad, f"an experiments module imports another pipeline: {bad}"


def test_import_fpa_stays_light():
    """fpa/__init__.py imports no fpa subpackage at module level (fpa.ops only lazily, in
    __getattr__), so ``import fpa`` imports neither torch nor transformers."""
    assert _imports("fpa", MODULES["fpa"], top_level_only=True) == set()
    top = {
        n.names[0].name if isinstance(n, ast.Import) else n.module
        for n in ast.parse(MODULES["fpa"].read_text()).body
        if isinstance(n, (ast.Import, ast.ImportFrom))
    }
    assert not top & {"torch", "transformers", "importlib", "importlib.abc", "sys"}, top


def test_import_fpa_cache_is_lazy():
    """fpa/cache/__init__.py imports no module at module level (its names come from ``__getattr__``;
    the imports under ``if TYPE_CHECKING`` are for mypy and the docs, and count in the graph)."""
    assert _imports("fpa.cache", MODULES["fpa.cache"], top_level_only=True) == set()
    assert {"fpa.cache.cache", "fpa.cache.policies"} <= GRAPH["fpa.cache"]


@pytest.mark.parametrize("root", ["fpa.compat", "fpa.checks"])
def test_root_modules_import_no_fpa_module(root):
    assert GRAPH[root] == set()


def test_checks_imports_no_third_party_module():
    tree = ast.parse(MODULES["fpa.checks"].read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {m.split(".")[0] for m in names} <= set(sys.stdlib_module_names) | {"__future__"}, names


def test_imports_at_run_time():
    """What the table means at run time: ``import fpa`` and ``import fpa.checks`` import neither
    torch nor transformers, ``import fpa.layers`` imports nothing of fpa.cache but its store (nor
    transformers), fpa.cache's names are what its submodules define (``prefill`` the function even
    once the module fpa.cache.prefill is imported), and ``import fpa.models`` registers the Auto
    classes."""
    code = (
        "import sys\nimport fpa, fpa.checks\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
        "import fpa.layers\n"
        "cache = [m for m in sys.modules if m.startswith('fpa.cache') and not m.startswith('fpa.cache.store')]\n"
        "assert cache == ['fpa.cache'], cache\n"
        "assert 'fpa.cache.store.paged' in sys.modules and 'fpa.cache.cache' not in sys.modules\n"
        "assert 'transformers' not in sys.modules and not [m for m in sys.modules if m.startswith('fpa.models')]\n"
        "import fpa.cache.prefill, fpa.cache.policies\nimport fpa.cache as c\n"
        "assert c.prefill is sys.modules['fpa.cache.prefill'].prefill\n"
        "assert c.TOVA is sys.modules['fpa.cache.policies'].TOVA and set(c.__all__) == set(c._SOURCES)\n"
        "assert all(getattr(c, n).__module__.startswith('fpa.cache.') for n in c.__all__)\n"
        "import fpa.models\nfrom transformers import AutoConfig\n"
        "assert type(AutoConfig.for_model('fpa')).__name__ == 'FPAConfig'\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
