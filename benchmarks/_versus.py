"""Our LMA and the peer on the same model, the same batches and the same device, in turn.

Both optimizers start from the same parameters (``tanh_mlp(widths)`` from the same seed)
and get the same batches. Ours is ``LMA(model, [device], a - b)`` with its defaults;
the peer is ``LevenbergMarquardtModule(model, solve_method="cholesky")``, driven as its
own ``fit`` loop drives it (one ``training_step(x, y)`` per batch, the whole batch's J at
once). Their steps alternate, so that a change of machine load hits both alike; on CUDA
the clock is read after the device has finished each step. A side that fails (out of
memory, say) is recorded with its error and left out of the remaining steps, and the other
side goes on.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

import _common as c
import torch

#: One LM step on a batch; returns what it reports (``attempts``, and for ours its parts).
Step = Callable[[torch.Tensor, torch.Tensor], dict[str, float]]
PARTS = ("jacobian", "transfer", "assembly", "solve", "trial")


def residual(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return outputs - targets


def make_ours(
    widths: Sequence[int], device: torch.device, slice_size: int | None = None
) -> tuple[Step, Any]:
    """Our LMA with its defaults on ``tanh_mlp(widths)``; ``lma.step(x, y, slice_size)``."""
    from marquardt.solver import LMA

    lma = LMA(c.tanh_mlp(widths).to(device), [device], residual)

    def step(x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        lma.step(x, y, slice_size)
        report = lma.report
        assert report is not None
        out = {"attempts": float(report.attempts)}
        out.update({k: float(getattr(report, f"seconds_{k}")) for k in PARTS})
        return out

    return step, lma


def make_peer(widths: Sequence[int], device: torch.device) -> tuple[Step, Any]:
    """The peer's ``LevenbergMarquardtModule`` (Cholesky solver) on ``tanh_mlp(widths)``."""
    tlm = c.import_peer()
    module = tlm.training.LevenbergMarquardtModule(
        c.tanh_mlp(widths).to(device), solve_method="cholesky"
    )

    def step(x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        logs = module.training_step(x, y)[3]
        return {"attempts": float(logs["attempts"])}

    return step, module


def describe_error(exc: BaseException) -> str:
    """``OutOfMemoryError: CUDA out of memory. Tried to allocate 9.3 GiB ...`` (one line)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}".strip()


def release(device: torch.device) -> None:
    """Collect garbage and give torch's cached blocks back to the device."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def interleave(
    sides: dict[str, Step],
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    warmup: int,
    device: torch.device,
    cap: float,
) -> dict[str, dict[str, Any]]:
    """Step every side on each batch in turn; the first ``warmup`` batches are not timed.

    No new batch is started when the last one, taken again, would end after ``cap``
    seconds, but at least one timed batch is run. Per side: ``seconds`` and ``reports`` of
    the timed steps, ``error`` (empty when every step ran).
    """
    out: dict[str, dict[str, Any]] = {
        name: {"seconds": [], "reports": [], "error": ""} for name in sides
    }
    start = time.perf_counter()
    last = 0.0
    for i, (x, y) in enumerate(pairs):
        began = time.perf_counter()
        if i > warmup and began - start + last > cap:
            break
        for name, step in sides.items():
            record = out[name]
            if record["error"]:
                continue
            error = ""
            c.synchronize(device)
            t0 = time.perf_counter()
            try:
                report = step(x, y)
                c.synchronize(device)
            except Exception as exc:  # out of memory included: recorded, the other side goes on
                error = describe_error(exc)
            seconds = time.perf_counter() - t0
            if error:
                record["error"] = f"step {i + 1}: {error}"
                release(device)
                continue
            if i >= warmup:
                record["seconds"].append(seconds)
                record["reports"].append(report)
        last = time.perf_counter() - began
    return out


def medians(record: dict[str, Any]) -> dict[str, float]:
    """Median step seconds, attempts and (ours) parts of one side's timed steps."""
    reports: list[dict[str, float]] = record["reports"]
    keys = reports[0].keys() if reports else ()
    result = {k: c.median([r[k] for r in reports]) for k in keys}
    result["step"] = c.median(record["seconds"])
    return result
