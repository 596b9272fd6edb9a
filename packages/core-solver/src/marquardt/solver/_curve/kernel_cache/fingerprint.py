"""A model's fingerprint: a hash of what its traced graph is made of, read without tracing.

A compiled kernel on disk is found again by a key (``_curve.kernel_cache.artifacts``), and a key
must change whenever the graph traced from the model would: its code, the code of every
function it calls that is not torch's, and every number or tensor it reads from outside
its arguments (defaults, closure cells, globals). ``fingerprint`` walks exactly those: a
Python function's bytecode, constants and names, its defaults, closure and the globals its
code names (recursively, for functions and nested code objects), a tensor's (or a NumPy
array's) dtype, shape and bytes, an ``nn.Module``'s class, parameters and buffers, and plain values by ``repr``.
Modules and builtins (``torch.exp``) count by their qualified names; torch's own version
sits in the key beside the fingerprint. Where something is met that cannot be read this
way (an arbitrary object), the fingerprint is None and nothing is kept on disk for that
model: a key that might not change with the graph is never trusted.
"""

from __future__ import annotations

import hashlib
import types
from typing import Any

import numpy as np
import torch

__all__ = ["fingerprint"]

#: How deep the walk follows functions called by functions before it gives up (None).
DEPTH = 12
_PLAIN = (int, float, complex, str, bytes, bool, type(None), type(Ellipsis))


class _Unreadable(Exception):
    """Raised inside the walk where a value cannot be fingerprinted."""


def fingerprint(f: Any) -> str | None:
    """The hex SHA-256 of f's code and captured values (module docstring), or None.

    **Arguments:**

    - ``f``: the model, a Python function (or a callable object such as an ``nn.Module``).

    **Returns:** the fingerprint, or None where some part of f cannot be read.
    """
    digest = hashlib.sha256()
    try:
        _walk(f, digest, DEPTH, set())
    except (_Unreadable, RecursionError):
        return None
    return digest.hexdigest()


def _walk(value: Any, digest: Any, depth: int, seen: set[int]) -> None:
    if depth < 0:
        raise _Unreadable
    if isinstance(value, _PLAIN):
        digest.update(f"{type(value).__name__}:{value!r};".encode())
        return
    if id(value) in seen:
        digest.update(b"seen;")
        return
    seen.add(id(value))
    for kind, read in _READERS:
        if isinstance(value, kind):
            read(value, digest, depth, seen)
            return
    raise _Unreadable


def _tensor(value: torch.Tensor, digest: Any, depth: int, seen: set[int]) -> None:
    data = value.detach().cpu().contiguous()
    digest.update(f"tensor:{data.dtype}:{tuple(data.shape)}:{value.device.type};".encode())
    digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())


def _array(value: np.ndarray, digest: Any, depth: int, seen: set[int]) -> None:
    if value.dtype == object:
        raise _Unreadable
    data = np.ascontiguousarray(value)
    digest.update(f"ndarray:{data.dtype.str}:{data.shape};".encode())
    digest.update(data.tobytes())


def _sequence(value: Any, digest: Any, depth: int, seen: set[int]) -> None:
    digest.update(f"{type(value).__name__}[{len(value)}];".encode())
    items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
    for item in items:
        _walk(item, digest, depth, seen)


def _mapping(value: dict[Any, Any], digest: Any, depth: int, seen: set[int]) -> None:
    digest.update(f"dict[{len(value)}];".encode())
    for key in sorted(value, key=repr):
        _walk(key, digest, depth, seen)
        _walk(value[key], digest, depth, seen)


def _code(code: types.CodeType, digest: Any, depth: int, seen: set[int]) -> None:
    digest.update(b"code;" + code.co_code)
    digest.update(repr((code.co_names, code.co_varnames, code.co_freevars)).encode())
    for const in code.co_consts:
        _walk(const, digest, depth - 1, seen)


def _function(f: types.FunctionType, digest: Any, depth: int, seen: set[int]) -> None:
    if (f.__module__ or "").split(".")[0] == "torch":  # torch's own: its version is keyed
        _named(f, digest, depth, seen)
        return
    digest.update(f"function:{f.__qualname__};".encode())
    _code(f.__code__, digest, depth, seen)
    _walk(f.__defaults__, digest, depth, seen)
    _walk(f.__kwdefaults__, digest, depth, seen)
    for cell in f.__closure__ or ():
        _walk(cell.cell_contents, digest, depth - 1, seen)
    for name in _global_names(f.__code__):
        if name in f.__globals__:
            digest.update(f"global:{name};".encode())
            _walk(f.__globals__[name], digest, depth - 1, seen)


def _global_names(code: types.CodeType) -> list[str]:
    """The names a code object and the code nested in it may read as globals."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.extend(_global_names(const))
    return sorted(set(names))


def _named(value: Any, digest: Any, depth: int, seen: set[int]) -> None:
    """Modules, builtins, classes, torch's ops: by their qualified names."""
    module = getattr(value, "__module__", None) or ""
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", repr(value))
    digest.update(f"named:{module}.{name};".encode())


def _module(value: torch.nn.Module, digest: Any, depth: int, seen: set[int]) -> None:
    kind = type(value)
    digest.update(f"nn.Module:{kind.__module__}.{kind.__qualname__};".encode())
    forward = getattr(kind, "forward", None)
    if isinstance(forward, types.FunctionType):
        _function(forward, digest, depth - 1, seen)
    _mapping(dict(value.state_dict(keep_vars=True)), digest, depth - 1, seen)
    plain = {k: v for k, v in vars(value).items() if isinstance(v, _PLAIN)}
    _mapping(plain, digest, depth - 1, seen)


def _bound(value: types.MethodType, digest: Any, depth: int, seen: set[int]) -> None:
    _walk(value.__func__, digest, depth - 1, seen)
    _walk(value.__self__, digest, depth - 1, seen)


def _partial(value: Any, digest: Any, depth: int, seen: set[int]) -> None:
    _walk(value.func, digest, depth - 1, seen)
    _walk(value.args, digest, depth - 1, seen)
    _walk(value.keywords, digest, depth - 1, seen)


def _partial_type() -> type:
    import functools

    return functools.partial


_READERS: tuple[tuple[Any, Any], ...] = (
    (torch.Tensor, _tensor),
    ((np.ndarray, np.generic), _array),
    ((tuple, list, set, frozenset), _sequence),
    (dict, _mapping),
    (types.CodeType, _code),
    (types.FunctionType, _function),
    (types.MethodType, _bound),
    (_partial_type(), _partial),
    (torch.nn.Module, _module),
    (
        (
            types.ModuleType,
            types.BuiltinFunctionType,
            types.BuiltinMethodType,
            type,
            torch.dtype,
            torch.device,
            torch._ops.OpOverloadPacket,
        ),
        _named,
    ),
)
