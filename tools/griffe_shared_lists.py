"""A griffe extension: the API reference shows the lists ``with_lists`` adds to docstrings.

Public classes of ``marquardt.trainer`` that share argument lists (the built-in callbacks,
the launch environments) are decorated with ``@with_lists(LISTS)``, which appends
``LISTS``, a string constant written once, to their docstrings when their module is
imported. The API reference reads the sources without importing them, so this extension
reads the same constant from the sources and appends it to the same docstrings
(``mkdocs.yml``: ``extensions``).
"""

from __future__ import annotations

import ast
import inspect
from typing import Any

import griffe

#: The decorator's name.
DECORATOR = "with_lists"


class SharedLists(griffe.Extension):
    """Append the lists named by ``@with_lists(LISTS)`` to the decorated classes' docstrings."""

    def __init__(self) -> None:
        super().__init__()
        #: The decorated classes seen, each with the path of its lists' constant.
        self.pending: list[tuple[griffe.Class, str]] = []

    def on_class_instance(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        for decorator in cls.decorators:
            call = decorator.value
            function = getattr(call, "function", None)
            arguments = getattr(call, "arguments", None)
            if function is None or not arguments:
                continue
            if str(getattr(function, "canonical_path", function)).endswith(DECORATOR):
                self.pending.append((cls, str(arguments[0].canonical_path)))

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Once the package is loaded, every constant's module is there to read."""
        for cls, path in self.pending:
            module, _, name = path.rpartition(".")
            lists = inspect.cleandoc(
                ast.literal_eval(str(cls.modules_collection[module][name].value))
            )
            if cls.docstring is None:
                cls.docstring = griffe.Docstring("", parent=cls)
            # The docstring keeps its parser (the handler's style): only its text grows.
            cls.docstring.value = f"{inspect.cleandoc(cls.docstring.value)}\n\n{lists}\n"
        self.pending = []
