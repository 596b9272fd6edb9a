"""Child process: the cuPyNumeric backend against the NumPy reference on random systems,
and the ``auto`` backend choice against the running Legate.

Run under the ``legate`` launcher (two CPU processors, so that J is split across them) or
``python`` with ``env_for_legate_cpu``. Prints one result line (``legate_support.emit``).
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from legate_support import emit
from marquardt.solver._backends.cupynumeric_backend import CupynumericBackend
from marquardt.solver._backends.numpy_backend import NumpyBackend


def _slices(jac: torch.Tensor, res: torch.Tensor, size: int) -> list[SimpleNamespace]:
    """Row slices as the Jacobian engine hands them out: fresh tensors, out of order."""
    pieces = [
        SimpleNamespace(
            start=s, stop=min(s + size, len(res)), jacobian=jac[s : s + size].clone(),
            residuals=res[s : s + size].clone(),
        )
        for s in range(0, len(res), size)
    ]  # fmt: skip
    return pieces[::-1]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _compare(legate: Any, reference: Any, system_l: Any, system_n: Any) -> dict[str, Any]:
    scale = max(abs(reference.gradient_dot), 1e-300)
    return {
        "delta": _relative(legate.delta, reference.delta),
        "gradient_dot": abs(legate.gradient_dot - reference.gradient_dot) / scale,
        "curvature": abs(legate.curvature - reference.curvature) / max(reference.curvature, 1e-300),
        "rss": abs(system_l.rss - system_n.rss) / max(system_n.rss, 1e-300),
        "delta_dtype": str(legate.delta.dtype),
        "delta_device": str(legate.delta.device),
    }


def systems(backend: CupynumericBackend, reference: NumpyBackend) -> dict[str, Any]:
    """δ and the model terms for over-/under-determined, float64/float32, both scalings."""
    out: dict[str, Any] = {}
    generator = torch.Generator().manual_seed(11)
    cases = [
        ("tall_f64", 3000, 40, torch.float64, 256),
        ("square_f64", 60, 60, torch.float64, 16),
        ("wide_f64", 30, 80, torch.float64, 7),
        ("tall_f32", 2000, 50, torch.float32, 300),
    ]
    for label, rows, params, dtype, size in cases:
        # Badly scaled columns make Marquardt's D differ from I.
        columns = torch.logspace(-2, 2, params, dtype=torch.float64)
        jac = (torch.randn(rows, params, generator=generator, dtype=torch.float64) * columns).to(
            dtype
        )
        res = torch.randn(rows, generator=generator, dtype=torch.float64).to(dtype)
        system_l = backend.system_from_slices(_slices(jac, res, size), rows, params)
        system_n = reference.system_from_slices(_slices(jac, res, size), rows, params)
        gc.collect()  # the slices' tensors are gone; Legate must not depend on them any more
        out[f"{label}/in_legate"] = type(system_l.a).__module__.split(".")[0]
        out[f"{label}/underdetermined"] = [system_l.underdetermined, system_n.underdetermined]
        for scaling in ("identity", "marquardt"):
            for damping in (1e-6, 1e-2, 10.0):
                legate = backend.solve(system_l, damping, scaling)
                numpy_ = reference.solve(system_n, damping, scaling)
                assert legate is not None and numpy_ is not None
                out[f"{label}/slices/{scaling}/{damping:g}"] = _compare(
                    legate, numpy_, system_l, system_n
                )
        if rows >= params:
            jac64, res64 = jac.double(), res.double()
            products = SimpleNamespace(
                jtj=jac64.T @ jac64, jtr=jac64.T @ res64, rss=float(res64 @ res64), rows=rows
            )
            system_l = backend.system_from_products(products)
            system_n = reference.system_from_products(products)
            legate = backend.solve(system_l, 1e-3, "marquardt")
            numpy_ = reference.solve(system_n, 1e-3, "marquardt")
            assert legate is not None and numpy_ is not None
            out[f"{label}/products/marquardt/0.001"] = _compare(legate, numpy_, system_l, system_n)
    return out


def rejected(backend: CupynumericBackend) -> dict[str, Any]:
    """Systems Cholesky cannot factorise, or with non-finite values: ``None``, no exception."""
    indefinite = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=torch.float64)
    nan = torch.full((2, 2), float("nan"), dtype=torch.float64)
    one = torch.ones(2, dtype=torch.float64)
    out: dict[str, Any] = {}
    for label, matrix in (("indefinite", indefinite), ("nan", nan)):
        products = SimpleNamespace(jtj=matrix, jtr=one, rss=1.0, rows=1)
        system = backend.system_from_products(products)
        out[label] = [backend.solve(system, 0.0, s) is None for s in ("identity", "marquardt")]
    jac = torch.ones(4, 2, dtype=torch.float64)
    jac[1, 1] = float("inf")
    res = torch.ones(4, dtype=torch.float64)
    system = backend.system_from_slices(_slices(jac, res, 2), 4, 2)
    out["inf_in_jacobian"] = [
        backend.solve(system, 1e-3, s) is None for s in ("identity", "marquardt")
    ]
    try:
        backend.solve(system, 1e-3, "diagonal")
    except ValueError as exc:
        out["bad_scaling"] = str(exc)
    backend.synchronize()
    return out


def auto_choice() -> dict[str, Any]:
    """What ``auto`` and ``marquardt.devices`` say inside a running Legate with 0 GPUs."""
    from marquardt.devices import legate_gpu_count
    from marquardt.devices._legate import legate_share
    from marquardt.solver._backends.choice import resolve_backend

    out: dict[str, Any] = {
        "legate_gpu_count": legate_gpu_count(),
        "source": legate_share().source,
        "auto": resolve_backend("auto", torch.device("cpu")).name,
    }
    # The runtime was configured at start; a later LEGATE_CONFIG cannot change its GPUs.
    os.environ["LEGATE_CONFIG"] = "--gpus 3"
    out["legate_gpu_count_after_config_change"] = legate_gpu_count()
    out["auto_after_config_change"] = resolve_backend("auto", torch.device("cpu")).name
    os.environ["MARQUARDT_SOLVER_BACKEND"] = "cupynumeric"
    out["auto_with_override"] = resolve_backend("auto", torch.device("cpu")).name
    del os.environ["MARQUARDT_SOLVER_BACKEND"]
    return out


def main() -> None:
    torch.set_num_threads(1)
    cache_before = os.environ.get("CUPYNUMERIC_MATMUL_CACHE_SIZE")
    backend = CupynumericBackend()
    from legate.core import TaskTarget, get_legate_runtime

    result = {
        "cache_before": cache_before,
        "cache_after": os.environ.get("CUPYNUMERIC_MATMUL_CACHE_SIZE"),
        "cpus": int(get_legate_runtime().machine.count(TaskTarget.CPU)),
        "systems": systems(backend, NumpyBackend()),
        "rejected": rejected(backend),
        "auto": auto_choice(),
    }
    emit(result)


if __name__ == "__main__":
    main()
