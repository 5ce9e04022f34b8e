"""Every third-party module the tests import is declared in pyproject.toml (base or the dev extra)."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    import tomllib

    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = proj.get("optional-dependencies", {})
    out: set[str] = set()
    todo = list(proj["dependencies"]) + list(extras.get("dev", []))
    while todo:
        req = todo.pop()
        name = _norm(re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0])
        if name == "fpa":  # fpa[models,train,...]: the named extras
            named = re.search(r"\[(.*)\]", req)
            assert named is not None, f"fpa without extras in its own dependencies: {req!r}"
            todo += [r for e in named.group(1).split(",") for r in extras[e.strip()]]
        else:
            out.add(name)
    return out


def _imported_top_modules(path: Path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module.split(".")[0])
    return mods


def test_test_imports_are_declared() -> None:
    local = {p.stem for p in (ROOT / "tests").rglob("*.py")} | {"fpa", "conftest"}
    dists = md.packages_distributions()
    declared = _declared() | {"pytest"}  # pytest ships _pytest too
    missing: dict[str, list[str]] = {}
    for f in (ROOT / "tests").rglob("*.py"):
        for mod in _imported_top_modules(f) - local - set(sys.stdlib_module_names):
            owners = {_norm(d) for d in dists.get(mod, [mod])}
            if not owners & declared:
                missing.setdefault(mod, []).append(str(f.relative_to(ROOT)))
    assert not missing, f"tests import undeclared modules (add them to an extra in pyproject.toml): {missing}"
