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
from _floor import random_floor

from marquardt.testing.problems import sinc, tanh_mlp

#: One LM step on a batch; returns what it reports (``attempts``, and for ours its parts).
Step = Callable[[torch.Tensor, torch.Tensor], dict[str, float]]
PARTS = ("jacobian", "transfer", "assembly", "solve", "trial")
WARMUP = 1
#: Peak device memory of building one side and one step (``_device.gpu_memory``).
Memory = Callable[..., dict[str, Any]]


def residual(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return outputs - targets


def make_ours(
    widths: Sequence[int], device: torch.device, slice_size: int | None = None
) -> tuple[Step, Any]:
    """Our LMA with its defaults on ``tanh_mlp(widths)``; ``lma.step(x, y, slice_size)``."""
    from marquardt.solver import LMA

    lma = LMA(tanh_mlp(widths).to(device), [device], residual)

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
        tanh_mlp(widths).to(device), solve_method="cholesky"
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


def batches(n: int, count: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` shuffled batches of ``n`` sinc points (at least the seed's 100000 points)."""
    x_all, y_all = sinc(max(c.DATASET_SIZE, n))
    loader = c.shuffled_batches(x_all, y_all, n)
    return [(x.to(device), y.to(device)) for x, y in (next(loader) for _ in range(count))]


def measure_shape(
    widths: Sequence[int],
    n: int,
    device: torch.device,
    *,
    steps: int,
    cap: float,
    floor_repeats: int,
    floor_budget: float | None = None,
    step_share: float = 1.0,
    memory: Memory | None = None,
) -> dict[str, Any]:
    """Ours against the peer on ``tanh_mlp(widths)`` and N = ``n``: interleaved steps, the
    floor, and (``memory``) each side's device memory first.

    **Arguments:**

    - `steps`: timed steps of each side, after ``WARMUP`` (none where ``memory``'s first
      step already took a sixth of ``cap``).
    - `cap`: seconds for the shape; the steps get ``step_share`` of what is left of it when
      they start, and no new step starts after that.
    - `floor_repeats`, `floor_budget`: the floor's timed calls and their seconds (None: a
      sixth of what is left of ``cap``).
    - `memory`: ``memory(make, widths, device, x, y)`` per side; a side whose memory step
      failed is not timed.

    **Returns:** the shape's entry: ``ours`` and ``peer`` (steps, error, medians),
    ``floor`` (or its ``error``), ``memory`` where measured, ``seconds``.
    """
    params = c.mlp_params(widths)
    start = time.perf_counter()
    entry: dict[str, Any] = {
        "widths": list(widths),
        "params": params,
        "n": n,
        "system": "P × P (JᵀJ)" if n >= params else "N × N (JJᵀ)",
        "steps_asked": steps,
        "cap_seconds": cap,
    }
    pairs = batches(n, WARMUP + steps, device)
    makers = {"ours": make_ours, "peer": make_peer}
    warmup = WARMUP
    skipped: dict[str, str] = {}
    if memory is not None:
        entry["memory"] = {
            side: memory(make, widths, device, *pairs[0]) for side, make in makers.items()
        }
        # The memory phase warmed the kernels; a slow first step needs no second warm-up.
        if max(m["first_step_seconds"] or 0.0 for m in entry["memory"].values()) > cap / 6:
            warmup = 0
        for side, m in entry["memory"].items():
            if m["error"]:  # it would only fail again, at the cost of the time cap
                skipped[side] = f"not timed: its memory step failed ({m['error']})"
    entry["warmup"] = warmup
    sides: dict[str, Step] = {}
    owners: dict[str, Any] = {}
    for side, make in makers.items():
        if side not in skipped:
            sides[side], owners[side] = make(widths, device)
    runs = interleave(
        sides,
        pairs[WARMUP - warmup :],
        warmup=warmup,
        device=device,
        cap=max(1.0, cap - (time.perf_counter() - start)) * step_share,
    )
    report = getattr(owners.get("ours"), "report", None)
    entry["ours_runs"] = f"strategy {report.strategy}, backend {report.backend}" if report else ""
    del sides, owners, report, pairs
    release(device)
    for side in makers:
        record = runs.get(side, {"seconds": [], "reports": [], "error": skipped.get(side, "")})
        entry[side] = {
            "steps": record["seconds"],
            "error": record["error"],
            "median": medians(record) if record["seconds"] else {},
        }
    left = max(1.0, cap - (time.perf_counter() - start))
    budget = left / 6 if floor_budget is None else floor_budget
    try:
        entry["floor"] = random_floor(n, params, device, floor_repeats, warmup=1, budget=budget)
    except Exception as exc:  # out of memory included
        entry["floor"] = {"error": describe_error(exc)}
        release(device)
    entry["seconds"] = time.perf_counter() - start
    return entry
