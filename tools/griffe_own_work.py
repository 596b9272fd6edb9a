"""A griffe extension: the API reference shows what ``own_work`` adds to a docstring.

``marquardt.trainer``'s built-in callbacks share ``Callback``'s argument lists, written
once (``_OWN_WORK_LISTS``, beside the ``own_work`` decorator) and added to their docstrings
when their module is imported. The API reference reads the sources without importing
them, so this extension adds the same lists, read from the same constant, to the
docstring of every class decorated with ``own_work`` (``mkdocs.yml``: ``extensions``).
"""

from __future__ import annotations

import ast
import inspect
from typing import Any

import griffe

#: The decorator, and the constant beside it that holds the lists.
DECORATOR = "own_work"
LISTS = "_OWN_WORK_LISTS"


class OwnWorkDocstrings(griffe.Extension):
    """Append ``own_work``'s lists to the docstrings of the classes it decorates."""

    def __init__(self) -> None:
        super().__init__()
        #: The decorated classes seen, with the module of the decorator.
        self.pending: list[tuple[griffe.Class, str]] = []

    def on_class_instance(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        for decorator in cls.decorators:
            path = getattr(decorator.value, "canonical_path", str(decorator.value))
            module, _, name = path.rpartition(".")
            if name == DECORATOR:
                self.pending.append((cls, module))

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Once the package is loaded, the constant's module is there to read."""
        for cls, module in self.pending:
            lists = ast.literal_eval(str(cls.modules_collection[module][LISTS].value))
            if cls.docstring is None:
                cls.docstring = griffe.Docstring("", parent=cls)
            # The docstring keeps its parser (the handler's style): only its text grows.
            cls.docstring.value = f"{inspect.cleandoc(cls.docstring.value)}\n{lists}"
        self.pending = []
