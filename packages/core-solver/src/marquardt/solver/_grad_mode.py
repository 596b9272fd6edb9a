"""Grad mode as the caller had it, whatever interrupts the call.

A ``KeyboardInterrupt`` (Ctrl-C, or a signal handler that raises) landing inside
``torch.no_grad()``'s own ``__enter__`` or ``__exit__`` leaves grad mode off in the thread:
every later call without a graph, and a torch model then looks constant. The public entry
points restore it on the way out.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch

__all__ = ["keeps_grad_mode"]

P = ParamSpec("P")
R = TypeVar("R")


def keeps_grad_mode(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn``, returning or raising with torch's grad mode as it was on entry."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        grad = torch.is_grad_enabled()
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_grad_enabled(grad)

    return wrapper
