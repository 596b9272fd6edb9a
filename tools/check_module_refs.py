"""Check that no docstring or comment names a module that does not exist.

A reference is a double-backquoted name whose first part is private, as docstrings write
a module: ````_settings```` (or ````_settings.py````), ````_loops._lm````, ````marquardt.solver._lm.damping````. Each
is resolved against the source folders ``packages/*/src/marquardt/<pkg>/``:

- a dotted reference (``_loops._lm``) must be a module or folder path, either from the
  package root of the file it is written in, or from any folder of that package, or
  (``marquardt.<pkg>...``) from the namespace;
- a single name (``_settings``) must be a module or folder somewhere in the packages, or
  a name the source defines (a function, class, attribute, variable or parameter: a
  docstring may speak of ``_stop_training``).

Usage: ``python tools/check_module_refs.py [ROOT]`` (default: this repository). Prints
each reference that resolves to nothing, with its file and line; exits 1 if any.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REFERENCE = re.compile(r"``((?:marquardt\.\w+\.)?_[a-z][a-z0-9_]*(?:\.[A-Za-z_]\w*)*?)(?:\.py)?``")


def _modules(package: Path) -> set[tuple[str, ...]]:
    """Every module and folder of one package, as paths of names from its root."""
    found: set[tuple[str, ...]] = set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        for end in range(1, len(parts) + 1):
            found.add(parts[:end])
    return found


def _defined_names(files: list[Path]) -> set[str]:
    """Every name the source binds: definitions, assignments, attributes, parameters."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name | ast.arg):
                names.add(node.id if isinstance(node, ast.Name) else node.arg)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[-1])
    return names


def _resolves(
    ref: str, own: str, packages: dict[str, set[tuple[str, ...]]], names: set[str]
) -> bool:
    """``ref`` names a module or folder (then perhaps names defined inside it)."""
    parts = tuple(ref.split("."))
    if parts[0] == "marquardt":
        return _is_module_path(parts[2:], packages.get(parts[1], set()), names)
    if len(parts) == 1:
        return any(parts[0] == path[-1] for tree in packages.values() for path in tree) or (
            parts[0] in names
        )
    tree = packages[own]
    return any(_is_module_path(base + parts, tree, names) for base in tree | {()})


def _is_module_path(parts: tuple[str, ...], tree: set[tuple[str, ...]], names: set[str]) -> bool:
    """The longest prefix of ``parts`` that is a module is followed only by defined names."""
    for end in range(len(parts), 0, -1):
        if parts[:end] in tree:
            return all(part in names for part in parts[end:])
    return False


def problems(root: Path) -> list[str]:
    """Each reference under ``root``'s packages that names no module, as ``path:line: ref``."""
    sources = {
        pkg.name: pkg for pkg in sorted(root.glob("packages/*/src/marquardt/*")) if pkg.is_dir()
    }
    packages = {name: _modules(path) for name, path in sources.items()}
    files = [f for path in sources.values() for f in sorted(path.rglob("*.py"))]
    names = _defined_names(files)
    found = []
    for own, path in sources.items():
        for file in sorted(path.rglob("*.py")):
            for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
                for ref in REFERENCE.findall(line):
                    if not _resolves(ref, own, packages, names):
                        found.append(f"{file.relative_to(root)}:{number}: ``{ref}``")
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    found = problems(root)
    for line in found:
        print(f"{line} names no module of marquardt")
    print(f"{len(found)} references to modules that do not exist")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
