"""Grad mode kept across a call that a Ctrl-C may cut short (``keeps_grad_mode``, also for
the solver's entry points).

``torch.no_grad()`` switches grad mode in Python code of its own: an interrupt landing
after the switch in its ``__enter__``, or before the switch back in its ``__exit__``,
leaves grad mode off in the thread. The next Jacobian then has no graph to differentiate
("element 0 of tensors does not require grad"), long after the interrupt was handled.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch

__all__ = ["keeps_grad_mode"]

P = ParamSpec("P")
T = TypeVar("T")


def keeps_grad_mode(fn: Callable[P, T]) -> Callable[P, T]:
    """``fn`` with the caller's grad mode set back when it returns or raises.

    Arguments:
        fn: the function to wrap.

    Returns:
        A function of the same signature that calls ``fn`` and then restores the grad mode
        the caller had, even when ``fn`` raises (``KeyboardInterrupt`` included).
    """

    @functools.wraps(fn)
    def kept(*args: P.args, **kwargs: P.kwargs) -> T:
        enabled = torch.is_grad_enabled()
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_grad_enabled(enabled)

    return kept
