"""What the figures were measured on and what a measurement costs the process: the machine
(CPU, libraries, the source measured), the load average, and the resident set size.
"""

from __future__ import annotations

import gc
import os
import platform
import re
import resource
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import HERE, SOURCE_VARIABLE, THREADS


def load_average() -> float:
    """The 1-minute load average (NaN where the OS does not tell)."""
    try:
        return float(os.getloadavg()[0])
    except OSError:
        return float("nan")


def _status_mib(field: str) -> float | None:
    """A memory figure of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in MiB; None where
    there is no ``/proc``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mib() -> float:
    """This process's peak resident set size so far: ``VmHWM`` on Linux, else ``ru_maxrss``.

    ``ru_maxrss`` is not used where ``/proc`` answers: Linux carries the peak of the process
    that started this one over ``exec`` (``subprocess`` spawns through ``vfork``), and keeps
    the larger of the two, so a child whose own peak stays below its parent's would report
    the parent's. ``VmHWM`` is this process's own, and ``reset_peak_rss`` resets it.
    """
    peak = _status_mib("VmHWM")
    if peak is not None:
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def rss_mib() -> float:
    """This process's resident set size now (Linux ``/proc/self/status``; NaN elsewhere)."""
    rss = _status_mib("VmRSS")
    return float("nan") if rss is None else rss


def reset_peak_rss() -> bool:
    """Reset the peak-RSS mark to the current RSS (Linux ``/proc/self/clear_refs``).

    Returns False where the OS refuses; the baseline is then the peak so far.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_growth_mib(fn: Callable[[], object]) -> float | None:
    """The peak RSS growth during ``fn()`` over the RSS before it, in MiB (None where the OS
    cannot reset the peak)."""
    if not reset_peak_rss():
        return None
    base = rss_mib()
    fn()
    return peak_rss_mib() - base


def step_rss(step: Callable[[], object]) -> dict[str, Any]:
    """Run ``step()`` once in this process and measure its peak RSS growth over the RSS
    before it (after a peak reset where the OS allows one, else over the peak so far) and
    its seconds."""
    gc.collect()
    reset = reset_peak_rss()
    baseline = rss_mib() if reset else peak_rss_mib()
    start = time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    peak = peak_rss_mib()
    return {
        "baseline_mib": baseline,
        "baseline_is": "current RSS after a peak reset" if reset else "peak RSS so far",
        "peak_mib": peak,
        "growth_mib": peak - baseline,
        "step_seconds": seconds,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    match = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    flags = set(match.group(1).split()) if match else set()
    wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")
    return " ".join(f for f in wanted if f in flags)


def _numpy_blas() -> str:
    try:
        import numpy

        config = numpy.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception as exc:  # the BLAS description is informative only
        return f"unknown ({type(exc).__name__})"


def _torch_blas() -> str:
    text = torch.__config__.show()
    match = re.search(r"BLAS_INFO=(\w+)", text)
    mkl = "MKL" if torch.backends.mkl.is_available() else ""
    return (match.group(1) if match else mkl or "unknown") + (
        ", oneDNN" if torch.backends.mkldnn.is_available() else ""
    )


def source_revision() -> str:
    """The commit the packages were installed from, and whether ``packages/`` had edits
    (``SOURCE_VARIABLE``'s value where it is set)."""
    if os.environ.get(SOURCE_VARIABLE):
        return os.environ[SOURCE_VARIABLE]
    root = HERE.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "packages"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    edited = [line[3:] for line in dirty if line.strip() and "/src/" in line]
    if not edited:
        return f"commit {commit}"
    return f"commit {commit} with uncommitted edits in {len(edited)} package source files"


def describe(device: str = "cpu") -> dict[str, Any]:
    """What the figures were measured on: the CPU, the libraries, and the GPU behind
    ``device`` where it is one."""
    import numpy

    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cpu_flags": _cpu_flags(),
        "cores": os.cpu_count(),
        "threads_used": THREADS,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_blas": _torch_blas(),
        "numpy": numpy.__version__,
        "numpy_blas": _numpy_blas(),
        "load_average_1min": load_average(),
    }
    info["source"] = source_revision()
    try:
        from importlib.metadata import version

        info["torch_levenberg_marquardt"] = version("torch-levenberg-marquardt")
    except Exception:
        info["torch_levenberg_marquardt"] = "not installed"
    where = torch.device(device)
    if where.type == "cuda":
        info["device"] = str(where)
        info.update(gpu_info(where))
    return info


def gpu_info(device: torch.device) -> dict[str, Any]:
    """The GPU behind ``device``: its name, memory, multiprocessors, driver and CUDA."""
    props = torch.cuda.get_device_properties(device)
    return {
        "gpu": props.name,
        "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
        "driver": _driver_version(),
        "cuda": torch.version.cuda,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


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
