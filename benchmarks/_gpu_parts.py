"""The GPU benchmark's parts apart from the step times: the machine, the largest batch the
planner fits, peak GPU memory of a step, time to quality on the seed's loop, and the host
synchronisations in one step (``bench_gpu.py`` runs them; its docstring says how).
"""

from __future__ import annotations

import datetime as dt
import platform
import subprocess
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import _common as c
import _versus as v
import torch
from bench_quality import QualityTrace

QUALITY_HIDDEN = 64
QUALITY_SLICE = 5_000


# -- the device and the machine ----------------------------------------------------------
def _driver_version() -> str:
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        try:
            done = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            return done.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            return "unknown"


def _version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "not installed"


def machine(device: torch.device, source: str) -> dict[str, Any]:
    """What the figures were measured on, and from which source."""
    info: dict[str, Any] = {
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "source": source or c.source_revision(),
        "device": str(device),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "torch_levenberg_marquardt": _version("torch-levenberg-marquardt"),
        "cupy": _version("cupy-cuda13x")
        if _version("cupy-cuda13x") != "not installed"
        else _version("cupy-cuda12x"),
        "cpu": c.machine()["cpu"],
        "torch_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
            driver=_driver_version(),
        )
    return info


def largest_batch(
    params: int, device: torch.device, clip: int | None
) -> tuple[int, list[str], str]:
    """The largest N whose whole float32 J (explicit strategy) the planner fits on ``device``.

    Bisected on ``marquardt.devices.plan(params, N, strategy="explicit").fits``, with the
    device's free memory as NVML reports it now (the host's for ``cpu``). Returns N, the
    plan's explanation at that N, and a note when ``clip`` lowered it.
    """
    from marquardt.devices import discover_gpus, plan

    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        gpus = [g for g in discover_gpus() if g.ordinal == index]
        if not gpus:
            raise RuntimeError(f"NVML lists no GPU with ordinal {index} for {device}")
    else:
        gpus = []

    def fits(n: int) -> bool:
        return plan(params, n, 1, "float32", gpus, strategy="explicit").fits

    if not fits(1):
        return 0, list(plan(params, 1, 1, "float32", gpus, strategy="explicit").lines), ""
    lo, hi = 1, max(2, params)
    while fits(hi) and hi < 2**31:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    note = ""
    if clip is not None and lo > clip:
        lo, note = clip, f"the planner's {lo:,} clipped to {clip:,} on this device"
    return lo, list(plan(params, lo, 1, "float32", gpus, strategy="explicit").lines), note


# -- GPU memory of one step ------------------------------------------------------------
def gpu_memory(
    make: Callable[[Sequence[int], torch.device], tuple[v.Step, Any]],
    widths: Sequence[int],
    device: torch.device,
    x: torch.Tensor,
    y: torch.Tensor,
) -> dict[str, Any]:
    """Peak GPU memory of building one side and one step, and what is left once deleted."""
    v.release(device)
    base = torch.cuda.memory_allocated(device)
    reserved_before = torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    peak: int | None = None
    seconds: float | None = None
    error = ""
    try:
        step, owner = make(widths, device)
        c.synchronize(device)
        start = time.perf_counter()
        step(x, y)
        c.synchronize(device)
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated(device) - base
        del step, owner
    except Exception as exc:  # out of memory included: the result says so
        error = v.describe_error(exc)
    v.release(device)
    after = torch.cuda.memory_allocated(device)
    return {
        "base_bytes": base,
        "peak_bytes": peak,
        "after_delete_bytes": after,
        "leftover_bytes": after - base,
        "reserved_before_bytes": reserved_before,
        "reserved_after_empty_cache_bytes": torch.cuda.memory_reserved(device),
        "first_step_seconds": seconds,
        "error": error,
    }


# -- time to quality ---------------------------------------------------------------------
def _quality_side(kind: str, device: torch.device) -> tuple[Callable[..., bool], Any]:
    model = c.sinc_model(QUALITY_HIDDEN).to(device)
    if kind == "ours":
        from marquardt.solver import LMA

        lma = LMA(model, [device], v.residual)
        return (lambda x, y: lma.step(x, y, QUALITY_SLICE)[1]), lma.model
    tlm = c.import_peer()
    module = tlm.training.LevenbergMarquardtModule(model, solve_method="cholesky")
    return (lambda x, y: bool(module.training_step(x, y)[2])), module.model


def time_to_quality(kind: str, device: torch.device, cap: float) -> dict[str, Any]:
    """Training wall time until the full-dataset MSE reaches each threshold (capped)."""
    x_all, y_all = c.sinc_dataset()
    x_dev, y_dev = x_all.to(device), y_all.to(device)
    step, evaluated = _quality_side(kind, device)
    batches = c.shuffled_batches(x_all, y_all, c.BATCH)
    quality = QualityTrace(c.full_mse(evaluated, x_dev, y_dev))
    train, steps, stopped = 0.0, 0, "time cap"
    while train < cap:
        c.synchronize(device)
        start = time.perf_counter()
        x, y = next(batches)
        terminated = step(x.to(device), y.to(device))
        c.synchronize(device)
        train += time.perf_counter() - start
        steps += 1
        mse = c.full_mse(evaluated, x_dev, y_dev)
        why = quality.stop(train, steps, mse, terminated, "the optimizer terminated")
        if why:
            stopped = why
            break
    return {
        "kind": kind,
        "cap_seconds": cap,
        "train_seconds": train,
        "steps": steps,
        "final_mse": quality.trace[-1][2],
        "stopped": stopped,
        "reached": quality.reached,
        "trace": quality.trace,
    }


# -- host synchronisations ---------------------------------------------------------------
def _site(w: warnings.WarningMessage) -> str:
    path = str(w.filename)
    for marker in ("site-packages/", "/src/", "/lib/python"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{w.lineno}"


def count_syncs(device: torch.device) -> dict[str, Any]:
    """Host synchronisations in one LM step (after a warm-up step) on the quality loop."""
    if device.type != "cuda":
        return {"note": f"counted on CUDA only (device {device})"}
    x_all, y_all = c.sinc_dataset()
    batches = c.shuffled_batches(x_all, y_all, c.BATCH)
    out: dict[str, Any] = {}
    for kind in ("ours", "peer"):
        try:
            step, _model = _quality_side(kind, device)
            x, y = (t.to(device) for t in next(batches))
            step(x, y)
            x, y = (t.to(device) for t in next(batches))
            torch.cuda.synchronize(device)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    step(x, y)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs = [w for w in caught if "synchroniz" in str(w.message)]
            sites = Counter(_site(w) for w in syncs)
            out[kind] = {"count": len(syncs), "sites": dict(sites.most_common(12))}
        except Exception as exc:
            out[kind] = {"count": None, "error": v.describe_error(exc)}
        v.release(device)
    return out


def warm(device: torch.device) -> None:
    """Create the cuBLAS and cuSOLVER handles before any memory baseline is taken."""
    a = torch.randn(64, 64, device=device)
    (a @ a.T).sum().item()
    spd = (a @ a.T).double() + 64 * torch.eye(64, dtype=torch.float64, device=device)
    torch.linalg.cholesky(spd).sum().item()
    v.release(device)
