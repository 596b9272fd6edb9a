"""Check that each package's declared sibling dependencies match what its code imports.

A sibling is another distribution of this repository (``packages/*/pyproject.toml``).
For each package, from its ``pyproject.toml`` and the import statements of
``src/marquardt/<pkg>/``:

- every sibling in ``dependencies`` or in an extra is imported somewhere (a sibling
  declared and never imported is a dependency nobody needs);
- every sibling imported is declared, in ``dependencies`` or in an extra;
- a sibling that only an extra provides is imported inside functions only (the base
  install must import without it);
- a sibling in ``dependencies`` is imported at module top, never inside a function, so
  the layering is visible where the module starts and a broken install fails at import
  (imports under ``if TYPE_CHECKING:`` are allowed besides);
- a sibling that only the ``test`` extra provides (marquardt-testing, the suites' helpers)
  is imported by the package's ``tests/`` and never by its ``src/``.

The direction of the imports (devices <- jacobian <- solver <- trainer) is import-linter's
contract in the root pyproject.toml; this script checks the declarations.

Usage: ``python tools/check_siblings.py [ROOT]`` (default: this repository). Prints each
problem with its file and line; exits 1 if there is any.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SiblingImport:
    """One import statement of ``marquardt.<sibling>``."""

    sibling: str  # the distribution, e.g. "marquardt-devices"
    where: str  # path:line
    place: str  # "top", "type-checking" or "lazy" (inside a function)


def _name(requirement: str) -> str:
    """The distribution a requirement names: ``marquardt-devices>=0.2,<0.3`` -> its name."""
    return re.split(r"[\s\[<>=!~;@]", requirement.strip(), maxsplit=1)[0].lower()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _blocks(node: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists nested in a compound statement (if, try, with, for, match...)."""
    blocks = [getattr(node, f) for f in ("body", "orelse", "finalbody") if hasattr(node, f)]
    blocks += [h.body for h in getattr(node, "handlers", [])]
    blocks += [c.body for c in getattr(node, "cases", [])]
    return blocks


def _imports(tree: ast.Module) -> list[tuple[str, int, str]]:
    """(module, line, place) of every absolute import in a module."""
    found: list[tuple[str, int, str]] = []

    def visit(nodes: list[ast.stmt], place: str) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.extend((alias.name, node.lineno, place) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.append((node.module, node.lineno, place))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(node.body, "lazy")
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.body, "type-checking" if place == "top" else place)
                visit(node.orelse, place)
            else:
                for block in _blocks(node):
                    visit(block, place)

    visit(tree.body, "top")
    return found


def _sibling_imports(
    root: Path, tree_root: Path, modules: dict[str, str], me: str
) -> list[SiblingImport]:
    """Every import of another package of this repository in the modules under ``tree_root``."""
    found: list[SiblingImport] = []
    for source in sorted(tree_root.rglob("*.py")):
        tree = ast.parse(source.read_text(encoding="utf-8"), str(source))
        for module, line, place in _imports(tree):
            top = ".".join(module.split(".")[:2])
            if top in modules and modules[top] != me:
                where = f"{source.relative_to(root)}:{line}"
                found.append(SiblingImport(modules[top], where, place))
    return found


def check(root: Path) -> list[str]:
    """Every problem of the packages under ``root/packages``."""
    folders = sorted(p.parent for p in (root / "packages").glob("*/pyproject.toml"))
    projects = {
        folder: tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        for folder in folders
    }
    # import name (marquardt.devices) -> distribution (marquardt-devices), from the src trees
    modules: dict[str, str] = {}
    for folder, project in projects.items():
        for init in (folder / "src" / "marquardt").glob("*/__init__.py"):
            modules[f"marquardt.{init.parent.name}"] = _name(project["name"])
    problems: list[str] = []
    for folder, project in projects.items():
        me = _name(project["name"])
        required = {_name(r) for r in project.get("dependencies", [])} & set(modules.values())
        optional = project.get("optional-dependencies", {})
        extras = {
            _name(r)
            for extra, reqs in optional.items()
            if extra != "test"
            for r in reqs
            if _name(r) in modules.values()
        }
        test_only = (
            {_name(r) for r in optional.get("test", []) if _name(r) in modules.values()}
            - required
            - extras
        )
        imports = _sibling_imports(root, folder / "src" / "marquardt", modules, me)
        pyproject = (folder / "pyproject.toml").relative_to(root)
        imported = {i.sibling for i in imports}
        tested = {i.sibling for i in _sibling_imports(root, folder / "tests", modules, me)}
        for sibling in sorted(test_only - tested):
            problems.append(
                f"{pyproject}: {me} declares {sibling} in its test extra but its tests never "
                f"import {sibling.replace('-', '.')}. HINT: drop it from {pyproject}, or use it"
            )
        for sibling in sorted((required | extras) - imported):
            problems.append(
                f"{pyproject}: {me} declares {sibling} but never imports "
                f"{sibling.replace('-', '.')}. HINT: drop it from {pyproject}, or use it"
            )
        for i in imports:
            if i.sibling in test_only:
                problems.append(
                    f"{i.where}: {me} imports {i.sibling.replace('-', '.')}, which only its "
                    "test extra provides, so an install without that extra cannot import. "
                    "HINT: keep test helpers in tests/"
                )
            elif i.sibling not in required | extras:
                problems.append(
                    f"{i.where}: {me} imports {i.sibling.replace('-', '.')} without declaring "
                    f"{i.sibling}. HINT: add it to dependencies in {pyproject}"
                )
            elif i.sibling not in required and i.place == "top":
                problems.append(
                    f"{i.where}: {i.sibling} is only an extra of {me}, but is imported at "
                    "module top, so the base install cannot import. HINT: import it inside "
                    "the function that needs it"
                )
            elif i.sibling in required and i.place == "lazy":
                problems.append(
                    f"{i.where}: {i.sibling} is a dependency of {me} but is imported inside "
                    "a function, so the layering is hidden and a broken install shows only "
                    "when that function runs. HINT: move the import to the top of the module"
                )
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve() if argv else Path(__file__).resolve().parents[1]
    problems = check(root)
    for problem in problems:
        print(problem)
    count = len(list((root / "packages").glob("*/pyproject.toml")))
    print(f"{count} packages, {len(problems)} problems in their sibling dependencies")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
