"""The structure the engine issue asked for, kept: no import cycle among fastload's modules (at
module level or inside functions), no module over 700 lines, no class over 350, and the front
ends and tools reach the loader only through ``fastload.Loader``, never into its engine."""

from __future__ import annotations

import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parent.parent / "fastload"
COMPILED = ("fastload._ring", "fastload._pack")


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def _imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """Every fastload module ``name`` imports, wherever the import statement is."""
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = {f"{mod}.{a.name}" for a in node.names} & known
            out |= subs if len(subs) == len(node.names) else subs | {mod}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return (out & known) - {name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph``, if it has any (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (found := visit(w)) is not None:
                return found
        state[v] = 2
        stack.pop()
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)) is not None:
            return found
    return None


def test_no_import_cycle():
    mods = _modules()
    known = set(mods) | set(COMPILED)
    graph = {m: _imports(m, p, known) for m, p in mods.items()}
    graph.update({c: set() for c in COMPILED})
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_over_700_lines_and_no_class_over_350():
    too_long = []
    for name, path in _modules().items():
        text = path.read_text()
        if len(text.splitlines()) > 700:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > 350:
                    too_long.append(f"{name}.{node.name}: {n} lines")
    assert not too_long, too_long


def test_front_ends_and_tools_never_reach_into_the_engine():
    reach = []
    for name, path in _modules().items():
        if name in ("fastload.loader", "fastload._engine") or name.startswith("fastload._engine"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "_engine":
                reach.append(f"{name}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_engine"):
                reach.append(f"{name}:{node.lineno} imports the engine")
    assert not reach, reach
