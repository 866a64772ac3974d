"""slackswap's modules import each other without a cycle (top-level and function-local imports alike)."""

from __future__ import annotations

import ast
from pathlib import Path

import slackswap

PACKAGE = Path(slackswap.__file__).parent


def module_imports() -> dict[str, set[str]]:
    """Module name -> the slackswap modules (or packages) it imports, from the source text."""
    files = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("slackswap",) + path.relative_to(PACKAGE).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                for alias in node.names:
                    deps.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in files else target)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        # A module importing from its own package's __init__ is not an edge back into itself.
        graph[name] = {d for d in deps if d in files and d != name and not name.startswith(d + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle():
    graph = module_imports()
    assert "slackswap.schedule" in graph["slackswap.sim.simulator"]  # the reader sees real edges
    assert cycles(graph) == []


def test_hardware_sits_above_the_node_presets():
    # get_hardware resolves node names, and nodes are built from the single-GPU presets: the
    # presets live below both (slackswap.gpus), so the edge runs hardware -> nodes -> gpus only.
    graph = module_imports()
    assert "slackswap.nodes" in graph["slackswap.hardware"]
    assert "slackswap.gpus" in graph["slackswap.nodes"]
    assert "slackswap.hardware" not in graph["slackswap.nodes"]


def test_the_core_does_not_import_the_runtime():
    graph = module_imports()
    core = ("slackswap.plans", "slackswap.schedule", "slackswap.workload", "slackswap.profile_trace", "slackswap.sim")
    for name, deps in graph.items():
        if name.startswith(core):
            assert not any(d.startswith("slackswap.runtime") for d in deps), name
