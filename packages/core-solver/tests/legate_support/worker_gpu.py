"""Child process for the ``gpu`` tests: the cuPyNumeric backend with Legate on a real GPU.

Run under ``legate --gpus 1 ...`` on a GPU node. Slices are made on a CUDA device of the
model side when there is one left (else on the GPU Legate also uses), so the backend's
pinned-host staging of CUDA slices is exercised; then a few problems of the shared suite
run through ``LMA(backend="auto")``, which must pick cuPyNumeric because Legate holds a
GPU, with the model on ``get_available_gpus()[0]``. Everything is compared with NumPy.
Prints one result line (``legate_support.emit``). Also runs, without CUDA, on Legate CPUs
(the test asserts that it did run on a GPU).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from problems import SUITE_OPTIONS, problem, residual_fn

from legate_support import emit
from marquardt.devices import get_available_gpus, legate_gpu_count
from marquardt.solver import LMA
from marquardt.solver._backends.cupynumeric_backend import CupynumericBackend
from marquardt.solver._backends.numpy_backend import NumpyBackend

PROBLEMS = ("linear", "rosenbrock", "exponential", "misra1a")


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def staged_slices(device: torch.device) -> dict[str, Any]:
    """Slices living on ``device`` (CUDA on a GPU node), assembled and solved in Legate."""
    backend, reference = CupynumericBackend(), NumpyBackend()
    out: dict[str, Any] = {"slice_device": str(device)}
    generator = torch.Generator().manual_seed(5)
    for dtype in (torch.float64, torch.float32):
        jac = torch.randn(4096, 64, generator=generator, dtype=torch.float64).to(dtype)
        res = torch.randn(4096, generator=generator, dtype=torch.float64).to(dtype)

        def pieces(on: torch.device, jac: torch.Tensor = jac, res: torch.Tensor = res) -> Any:
            for s in range(0, 4096, 1000):
                yield SimpleNamespace(
                    start=s,
                    stop=min(s + 1000, 4096),
                    jacobian=jac[s : s + 1000].to(on).clone(),
                    residuals=res[s : s + 1000].to(on).clone(),
                )

        system_l = backend.system_from_slices(pieces(device), 4096, 64)
        system_n = reference.system_from_slices(pieces(torch.device("cpu")), 4096, 64)
        legate = backend.solve(system_l, 1e-3, "marquardt")
        numpy_ = reference.solve(system_n, 1e-3, "marquardt")
        assert legate is not None and numpy_ is not None
        out[str(dtype)] = _relative(legate.delta, numpy_.delta)
    products = SimpleNamespace(
        jtj=(jac.T.double() @ jac.double()).to(device),
        jtr=(jac.T.double() @ res.double()).to(device),
        rss=float(res.double() @ res.double()),
        rows=4096,
    )
    legate = backend.solve(backend.system_from_products(products), 1e-3, "identity")
    numpy_ = reference.solve(reference.system_from_products(products), 1e-3, "identity")
    assert legate is not None and numpy_ is not None
    out["products"] = _relative(legate.delta, numpy_.delta)
    return out


def lma_runs(devices: list[torch.device]) -> dict[str, Any]:
    """A few suite problems, 30 steps each, auto backend (cuPyNumeric) against NumPy."""
    out: dict[str, Any] = {}
    for name in PROBLEMS:
        prob = problem(name)
        finals = {}
        for backend in ("auto", "numpy"):
            model = prob.make_model().to(devices[0])
            lma = LMA(
                model,
                devices,
                residual_fn,
                backend=backend,
                strategy="explicit",
                **{**SUITE_OPTIONS, **prob.options},  # type: ignore[arg-type]
            )
            for _ in range(30):
                _, terminated = lma.step(prob.x.to(devices[0]), prob.y.to(devices[0]))
                if terminated:
                    break
            finals[backend] = (lma.backend.name, prob.params(model).cpu())
        out[name] = {
            "backend": finals["auto"][0],
            "difference": _relative(finals["auto"][1], finals["numpy"][1]),
        }
    return out


def main() -> None:
    from legate.core import TaskTarget, get_legate_runtime

    torch.set_num_threads(1)
    devices = get_available_gpus()
    # The GPU for CUDA slices: a model-side GPU, else (one GPU in all) Legate's own.
    cuda = torch.cuda.is_available()
    slice_device = (
        devices[0] if devices[0].type == "cuda" else torch.device("cuda" if cuda else "cpu")
    )
    emit(
        {
            "legate_gpus": int(get_legate_runtime().machine.count(TaskTarget.GPU)),
            "legate_gpu_count": legate_gpu_count(),
            "model_devices": [str(d) for d in devices],
            "staged": staged_slices(slice_device),
            "lma": lma_runs(devices),
        }
    )


if __name__ == "__main__":
    main()
