"""The package's shape: every module says its job in a one-line docstring, and no module
imports itself back through others (every import statement counts, also those inside
functions and under ``TYPE_CHECKING``)."""

from __future__ import annotations

import ast
from pathlib import Path

import marquardt.trainer

PACKAGE = Path(marquardt.trainer.__file__).parent
NAME = "marquardt.trainer"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join([NAME, *parts])] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports (submodules named in ``from`` imports)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" for alias in node.names] + [source]
            # "from pkg import submodule" imports the submodule, not only the package.
            targets = [t for t in targets if t in modules] or [source]
            if any(f"{source}.{a.name}" in modules for a in node.names):
                targets = [
                    f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in modules
                ]
        out.update(t for t in targets if t in modules and t != name)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan 1972)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_back() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_a_cycle_is_found() -> None:
    # The check itself: a cycle through three modules is reported.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_says_its_job_in_one_line() -> None:
    missing = []
    for name, path in _modules().items():
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
        lines = (doc or "").split("\n")
        if not lines[0].strip() or (len(lines) > 1 and lines[1].strip()):
            missing.append(name)
    assert missing == []
