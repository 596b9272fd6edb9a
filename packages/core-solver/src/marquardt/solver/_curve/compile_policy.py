"""When ``curve_fit_batch`` compiles: the ``compile`` keyword's values, whether a compiler
is at hand, and the predicted times (an eager call's, a compile's) that decide whether a
call compiles inline, in the background or not at all (``_curve.compiled_lm``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Any

import torch

__all__ = [
    "COMPILE_MODES",
    "COMPILE_SECONDS",
    "COMPILE_WORK",
    "EAGER_CALL_SECONDS",
    "EAGER_ELEMENT_SECONDS",
    "INLINE_MARGIN",
    "check_compile",
    "compiler_available",
    "eager_seconds",
]

#: The values of ``curve_fit_batch``'s ``compile`` keyword.
COMPILE_MODES = ("auto", True, False)
#: Elements of J over all the fits of a call (M·N·P) from which ``compile="auto"`` builds
#: a kernel that is not kept yet (in the background, unless the call repays an inline
#: compile): below it a call is over in milliseconds eagerly, and a compile's minute of a
#: core is not worth spending for it.
COMPILE_WORK = 10_000
#: The predicted seconds of compiling a new model's kernels on a small CPU where none of its
#: parameter count is kept yet: its own (f, J and the normal equations: 6.7–7.7 s) and the
#: kernels of no model of its P (the attempt, the decision, the covariance: 19–22 s once),
#: benchmarks/NOTES.md, the compile profile. Said as the expected time of an inline compile.
COMPILE_SECONDS = 30.0
#: An inline compile under ``"auto"`` needs a call whose predicted eager time is this many
#: times ``COMPILE_SECONDS``: the compiled call's own run is paid on top, and an eager
#: call's time swings about twofold with the machine's load (benchmarks/NOTES.md).
INLINE_MARGIN = 2.0
#: The eager call's predicted seconds: a fixed part (the first iteration's dispatch and
#: allocations) and a part per element of J (M·N·P), fitted to the eager batch calls of
#: benchmarks/NOTES.md (elliptic Gaussian, 36 points, 6 parameters, M = 10⁴ and 10⁵).
EAGER_CALL_SECONDS = 0.4
EAGER_ELEMENT_SECONDS = 1.8e-7


def check_compile(value: Any) -> str | bool:
    """``compile`` as given, refused (before any work) unless one of ``COMPILE_MODES``."""
    if isinstance(value, bool) or (isinstance(value, str) and value == "auto"):
        return value
    raise ValueError(
        f"compile must be 'auto', True or False, got {value!r}. HINT: leave it out to "
        "compile only calls large enough to repay the compile"
    )


def compiler_available(device: torch.device) -> bool:
    """Whether inductor can build kernels here: Triton for a GPU, a C++ compiler (``CXX``
    or g++, c++, clang++ on the PATH) for the CPU."""
    if device.type == "cuda":
        return importlib.util.find_spec("triton") is not None
    if device.type != "cpu":
        return False
    names = [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
    return any(name and shutil.which(name) for name in names)


def eager_seconds(work: int) -> float:
    """The predicted seconds of an eager call of ``work`` elements of J (M·N·P)."""
    return EAGER_CALL_SECONDS + EAGER_ELEMENT_SECONDS * work
