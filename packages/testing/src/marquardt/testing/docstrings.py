"""Check that a package's public functions and classes document their arguments and results.

The house docstring form (Google style, which the API reference renders) is a first line,
perhaps a short paragraph, then lists::

    Arguments:
        name: what it is.

    Returns:
        What comes back.

    Raises:
        SomeError: when, before any work.

For each public name (a package's ``__all__``) that is a function or a class, exceptions
and enums aside, ``problems`` reports:

- a parameter (of the function, or of the class's constructor; for a dataclass its
  fields) with no entry under ``Arguments:``, and an entry that names no parameter;
- a function that returns a value (its return annotation is not ``None``, or, where it
  has none, a ``return`` with a value in its body) with no ``Returns:`` section.

A class's constructor docstring, where it has its own, counts with the class's (the API
reference merges them). Protocol classes are not constructed, so their signature is not
checked. Each package's ``tests/test_docstrings.py`` runs this over its public names.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import re
import textwrap
from collections.abc import Callable, Iterable
from typing import Any

# The section names the Google style reads for each list (the house writes the first).
ARGUMENT_SECTIONS = frozenset({"Arguments", "Args", "Parameters", "Params"})
RETURN_SECTIONS = frozenset({"Returns", "Return"})
_SECTION = re.compile(r"^([A-Z][A-Za-z ]*):\s*$")
_ENTRY = re.compile(r"^(\*{0,2}[A-Za-z_]\w*)(?:\s*\([^)]*\))?\s*:")
_NO_VALUE = frozenset({"None", "NoReturn", "Never", "typing.NoReturn", "typing.Never"})


def sections(docstring: str | None) -> dict[str, list[str]]:
    """The sections of a Google-style docstring, each with the names of its entries.

    Arguments:
        docstring: the raw docstring (``None``: no sections).

    Returns:
        For each section header found at the docstring's own indentation (``Arguments``,
        ``Returns``, ``Raises``...), the names its entries begin with (``name:`` or
        ``name (type):``, at the section's first indentation); for ``Returns`` these are
        whatever words end in a colon, and only the section's presence matters.
    """
    found: dict[str, list[str]] = {}
    if not docstring:
        return found
    lines = inspect.cleandoc(docstring).splitlines()
    current: str | None = None
    entry_indent: int | None = None
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            header = _SECTION.match(line)
            current = header.group(1) if header else None
            if current is not None:
                found.setdefault(current, [])
            entry_indent = None
            continue
        if current is None:
            continue
        if entry_indent is None:
            entry_indent = indent
        if indent == entry_indent:
            entry = _ENTRY.match(line.strip())
            if entry:
                found[current].append(entry.group(1).lstrip("*"))
    return found


def _is_protocol(cls: type) -> bool:
    return bool(getattr(cls, "_is_protocol", False))


def is_checked(obj: object) -> bool:
    """Whether ``obj`` is a function or a class this check covers.

    Arguments:
        obj: a public name's value.

    Returns:
        True for functions and classes, except exceptions, warnings and enums.
    """
    if inspect.isclass(obj):
        return not issubclass(obj, BaseException | enum.Enum)
    return inspect.isfunction(obj)


def _own_init_doc(cls: type) -> str | None:
    init = cls.__dict__.get("__init__")
    return inspect.getdoc(init) if inspect.isfunction(init) else None


def _parameters(obj: Callable[..., Any]) -> list[str]:
    """The names a caller passes: the function's, or the constructor's without ``self``."""
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        return [f.name for f in dataclasses.fields(obj) if f.init]
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return []
    return [name for name in signature.parameters if name not in ("self", "cls")]


def _returns_value(func: Callable[..., Any]) -> bool:
    """Whether ``func`` returns a value: by its annotation, else by a ``return x``."""
    annotation = inspect.signature(func).return_annotation
    if annotation is not inspect.Signature.empty:
        if annotation is None or annotation is type(None):
            return False
        text = annotation if isinstance(annotation, str) else repr(annotation)
        return text.strip() not in _NO_VALUE and not text.endswith(("NoReturn", "Never"))
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError):
        return False
    tree = ast.parse(source)
    top = tree.body[0]
    pending: list[ast.AST] = list(ast.iter_child_nodes(top))
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue  # a nested definition's returns are its own
        value = node.value if isinstance(node, ast.Return) else None
        if value is not None and not (isinstance(value, ast.Constant) and value.value is None):
            return True
        pending.extend(ast.iter_child_nodes(node))
    return False


def problems(name: str, obj: Any) -> list[str]:
    """What the docstring of one public function or class lacks, one line each.

    Arguments:
        name: the public name, used in the messages.
        obj: the function or class.

    Returns:
        One message per missing or unknown ``Arguments:`` entry and per missing
        ``Returns:`` section; empty when the docstring is complete.
    """
    doc = inspect.getdoc(obj)
    found = sections(doc)
    if inspect.isclass(obj):
        for section, names in sections(_own_init_doc(obj)).items():
            found.setdefault(section, []).extend(names)
    if not doc:
        return [f"{name}: no docstring"]
    out: list[str] = []
    checks_signature = not (inspect.isclass(obj) and _is_protocol(obj))
    params = _parameters(obj) if checks_signature else []
    listed = [n for section in ARGUMENT_SECTIONS for n in found.get(section, [])]
    if params and not any(section in found for section in ARGUMENT_SECTIONS):
        out.append(f"{name}: no Arguments: section for {', '.join(params)}")
    else:
        out.extend(f"{name}: no Arguments: entry for {p!r}" for p in params if p not in listed)
    if checks_signature:
        out.extend(
            f"{name}: Arguments: entry {n!r} names no parameter" for n in listed if n not in params
        )
    documents_return = any(section in found for section in RETURN_SECTIONS)
    if inspect.isfunction(obj) and _returns_value(obj) and not documents_return:
        out.append(f"{name}: returns a value but has no Returns: section")
    return out


def package_problems(module: Any, skip: Iterable[str] = ()) -> list[str]:
    """``problems`` for every checked public name of a package.

    Arguments:
        module: the imported package, whose ``__all__`` lists its public names.
        skip: public names left out of the check.

    Returns:
        Every problem found, one line each, in ``__all__`` order.
    """
    skipped = set(skip)
    out: list[str] = []
    for name in module.__all__:
        obj = getattr(module, name)
        if name not in skipped and is_checked(obj):
            out.extend(problems(f"{module.__name__}.{name}", obj))
    return out
