"""The form of the LM's registries (the damping rules, the linear solvers, the stopping
tests): `Registry`, kinds by name in the order they were added.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

__all__ = ["Registry"]


class Named(Protocol):
    """What a registry holds: a kind with a name."""

    @property
    def name(self) -> str:
        """What the options call the kind."""
        ...


K = TypeVar("K", bound=Named)


class Registry(dict[str, K]):
    """Kinds by name, in the order they were added; adding one of a name already held
    replaces it in place.

    Arguments:
        kinds: the first kinds, in order.
    """

    def __init__(self, *kinds: K) -> None:
        super().__init__((kind.name, kind) for kind in kinds)

    def add(self, kind: K) -> None:
        """Add ``kind`` under its name (or replace the one of that name).

        Arguments:
            kind: the kind to hold.
        """
        self[kind.name] = kind
