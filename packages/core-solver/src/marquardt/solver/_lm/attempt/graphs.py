"""The attempt function compiled on CPUs and captured on GPUs: `compile_attempt`,
`capture_attempt`.

Both wrap `lm_attempt` with a step's constants bound (``attempt.pure``) and return
either a runner with the same call, or None with the reason in words; neither raises for
a model that cannot be traced or a kernel that cannot be captured. Compiling goes through
``torch.compile`` (inductor: C++ on CPUs) with static shapes and the whole function as one
graph; its artifacts sit in inductor's own cache (``TORCHINDUCTOR_CACHE_DIR``). Capturing
records the function once as a CUDA graph (``torch.cuda.CUDAGraph``) over static input and
output tensors; a replay copies the call's tensors into the inputs and hands back the
outputs, which the next replay overwrites. Either way the first call runs on the step's
own tensors: the function is pure, so a warm-up changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .pure import AttemptResult

__all__ = ["CapturedAttempt", "capture_attempt", "compile_attempt"]

Runner = Callable[..., AttemptResult]


def _why(error: BaseException) -> str:
    """An exception as one short line."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:200]


def compile_attempt(
    fn: Runner, args: tuple[Any, ...], compiler: Callable[[Runner], Runner] | None = None
) -> tuple[Runner | None, str]:
    """``fn`` compiled, tried once on ``args``; (None, why) where it cannot be.

    Arguments:
        fn: the attempt function.
        args: a call's arguments (the step's own tensors).
        compiler: what compiles ``fn`` (None: ``torch.compile`` with static shapes and one
            graph).

    Returns:
        (the compiled runner, "") or (None, the reason it failed).
    """
    if compiler is None:
        compiler = _inductor
    try:
        compiled = compiler(fn)
        with torch.no_grad():
            compiled(*args)
    except Exception as error:  # a model dynamo cannot trace, a compiler failure
        return None, f"the attempt could not be compiled ({_why(error)})"
    return compiled, ""


def _inductor(fn: Runner) -> Runner:
    compiled: Runner = torch.compile(fn, dynamic=False, fullgraph=True)
    return compiled


class CapturedAttempt:
    """``fn`` replayed from a CUDA graph over static tensors (see the module docstring).

    Arguments:
        fn: the attempt function.
        args: a call's arguments on one CUDA device (tensors or None), used for the
            warm-up and as the shapes of the static inputs.
    """

    def __init__(self, fn: Runner, args: tuple[Any, ...]) -> None:
        self._inputs = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        # Kernels choose workspaces and libraries load on first use: never inside a capture.
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):
                fn(*self._inputs)
        torch.cuda.current_stream().wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph), torch.no_grad():
            self._outputs = fn(*self._inputs)

    def __call__(self, *args: Any) -> AttemptResult:
        for static, value in zip(self._inputs, args, strict=True):
            if isinstance(static, torch.Tensor) and value is not static:
                static.copy_(value)
        self._graph.replay()
        return self._outputs


def capture_attempt(
    fn: Runner, args: tuple[Any, ...], device: torch.device
) -> tuple[Runner, str, str]:
    """``fn`` captured as a CUDA graph where ``device`` allows; else ``fn`` itself.

    Arguments:
        fn: the attempt function.
        args: a call's arguments, on ``device``.
        device: the model's device.

    Returns:
        (runner, path, reason): the `CapturedAttempt` and ``"captured"``; or ``fn``
        uncaptured, ``"tensor"`` and why (not a CUDA device, or the capture failed).
    """
    if device.type != "cuda":
        return fn, "tensor", f"CUDA graphs need a CUDA device; {device} runs it uncaptured"
    try:
        return CapturedAttempt(fn, args), "captured", ""
    except Exception as error:  # a kernel that cannot be captured, an allocator refusal
        return fn, "tensor", f"the attempt could not be captured ({_why(error)})"
