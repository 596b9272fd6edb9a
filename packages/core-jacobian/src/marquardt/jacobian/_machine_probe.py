"""The step-time planner's machine constants, measured with torch: `machine_constants`.

Three tiny timed kernels on the device (a matrix product in the dtype, a float64 Cholesky
factorisation, a copy; each the best of a few repetitions, well under a second together),
measured once per device, dtype, thread count and library versions, then read from
``marquardt.devices``' cache (in-process, and a JSON file in the user's cache folder).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from marquardt.devices import MachineConstants, load_constants, store_constants

__all__ = ["machine_constants", "machine_key"]

#: The side of the timed matrix product and factorisation, and the copy's MiB.
MATMUL_SIDE = 384
FACTOR_SIDE = 256
COPY_MIB = 16
REPEATS = 3


def machine_key(device: torch.device, dtype: torch.dtype) -> str:
    """The cache key: device (and its name), dtype, threads, torch's version."""
    name = device.type
    if device.type == "cuda":
        name = f"cuda:{torch.cuda.get_device_name(device)}"
    return f"{name}|{dtype}|threads={torch.get_num_threads()}|torch={torch.__version__}"


def _best(fn: Callable[[], object], device: torch.device) -> float:
    best = float("inf")
    for _ in range(REPEATS + 1):  # the first run warms up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t)
    return max(best, 1e-9)


def _measure(device: torch.device, dtype: torch.dtype) -> MachineConstants:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(MATMUL_SIDE, MATMUL_SIDE, generator=gen).to(device, dtype)
    matmul = 2 * MATMUL_SIDE**3 / _best(lambda: a @ a, device)
    f = torch.randn(FACTOR_SIDE, FACTOR_SIDE, generator=gen, dtype=torch.float64)
    spd = (f @ f.T + FACTOR_SIDE * torch.eye(FACTOR_SIDE, dtype=torch.float64)).to(device)
    factor = FACTOR_SIDE**3 / 3 / _best(lambda: torch.linalg.cholesky(spd), device)
    src = torch.empty(COPY_MIB << 18, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    bandwidth = 2 * src.numel() * 4 / _best(lambda: dst.copy_(src), device)
    return MachineConstants(matmul, factor, bandwidth, source="measured")


def machine_constants(device: torch.device, dtype: torch.dtype) -> MachineConstants:
    """The rates of ``device`` for ``dtype``: cached, or measured now and cached."""
    key = machine_key(device, dtype)
    found = load_constants(key)
    if found is not None:
        return found
    measured = _measure(device, dtype)
    store_constants(key, measured)
    return measured
