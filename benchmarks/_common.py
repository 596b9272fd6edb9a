"""Shared pieces of the benchmarks: the sinc problem, timing, machine description, output.

The seed problem (the cuPyLMA sinc tutorial): ``y = sinc(10 x)`` on 100000 points of
``[-1, 1]``, batches of 10000, fitted by a 1-H-1 tanh MLP (H = 64: P = 193; H = 256:
P = 769). Every benchmark builds its models from the same seed so that all optimizers
start from the same parameters.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
THREADS = 2
SEED = 0
DATASET_SIZE = 100_000
BATCH = 10_000
#: What was measured, where the tree is not a git checkout (``run_all.py --source``).
SOURCE_VARIABLE = "MARQUARDT_BENCH_SOURCE"


def setup_threads() -> None:
    """Two intra-op threads (the machine has two cores), one inter-op thread."""
    torch.set_num_threads(THREADS)


def sinc_dataset(n: int = DATASET_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """The seed's data: ``x`` evenly spaced on ``[-1, 1]`` (n × 1), ``y = sinc(10 x)``."""
    x = torch.linspace(-1, 1, n, dtype=torch.float32).unsqueeze(1)
    return x, torch.sinc(10 * x)


@torch.no_grad()
def full_mse(
    model: nn.Module, x: torch.Tensor | None = None, y: torch.Tensor | None = None
) -> float:
    """The model's MSE on ``(x, y)`` (default the seed's whole sinc dataset), in chunks of
    20,000 rows so that a large model's activations stay small."""
    if x is None or y is None:
        x, y = sinc_dataset()
    total = 0.0
    for lo in range(0, x.shape[0], 20_000):
        total += float(((model(x[lo : lo + 20_000]) - y[lo : lo + 20_000]) ** 2).sum())
    return total / x.shape[0]


def sinc_model(hidden: int = 256, seed: int = SEED) -> nn.Module:
    """A 1-hidden-1 tanh MLP, initialised from ``seed`` (the same for every optimizer)."""
    return tanh_mlp((1, hidden, 1), seed)


def tanh_mlp(widths: Sequence[int], seed: int = SEED) -> nn.Module:
    """A tanh MLP with layer widths ``widths`` (``(1, 64, 64, 1)`` is 1-64-64-1), from ``seed``.

    ``(1, H, 1)`` draws the same parameters as ``sinc_model(H)``.
    """
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        if i:
            layers.append(nn.Tanh())
        layers.append(nn.Linear(fan_in, fan_out))
    return nn.Sequential(*layers)


def mlp_name(widths: Sequence[int]) -> str:
    """``(1, 64, 64, 1)`` -> ``"1-64-64-1"``."""
    return "-".join(str(w) for w in widths)


def mlp_params(widths: Sequence[int]) -> int:
    """Parameters of the MLP with these widths (weights and biases)."""
    return sum((a + 1) * b for a, b in itertools.pairwise(widths))


def shuffled_batches(
    x: torch.Tensor, y: torch.Tensor, batch: int = BATCH, seed: int = SEED
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """An endless shuffled loader: a ``DataLoader`` whose sampler yields whole batches.

    ``BatchSampler(RandomSampler)`` as the sampler with ``batch_size=None`` makes the
    ``TensorDataset`` index each batch with one gather instead of collating 10000 single
    samples (which alone costs tens of milliseconds per batch and would dominate Adam's
    steps). The same seed gives every optimizer the same sequence of batches.
    """
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

    dataset = TensorDataset(x, y)
    generator = torch.Generator().manual_seed(seed)
    sampler = BatchSampler(RandomSampler(dataset, generator=generator), batch, drop_last=False)
    loader = DataLoader(dataset, sampler=sampler, batch_size=None)
    while True:
        yield from loader


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (CUDA kernels run asynchronously); no-op on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def time_calls(
    fn: Callable[[], object],
    repeats: int,
    warmup: int = 1,
    *,
    device: torch.device | str | None = None,
    budget: float | None = None,
) -> list[float]:
    """Wall seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed calls.

    On a CUDA ``device`` the clock is read only after the device has finished the call's
    work. With ``budget`` (seconds), no further call is started once the timed calls have
    taken that long (one is always timed): the large shapes get fewer repeats; a warm-up
    call that alone took the whole budget is the one measurement (its one-time costs are
    small beside it).
    """
    sync = (lambda: synchronize(device)) if device is not None else (lambda: None)
    for _ in range(warmup):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        seconds = time.perf_counter() - start
        if budget is not None and seconds >= budget:
            return [seconds]
    out: list[float] = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - start)
        if budget is not None and sum(out) >= budget:
            break
    return out


def seconds_text(value: float | None) -> str:
    """A duration for the tables: "1.23 s" from a second up, "45 ms" below, "—" for none."""
    if value is None:
        return "—"
    return f"{value:.2f} s" if value >= 1 else f"{value * 1e3:.0f} ms"


def load_average() -> float:
    """The 1-minute load average (NaN where the OS does not tell)."""
    try:
        return float(os.getloadavg()[0])
    except OSError:
        return float("nan")


def peak_rss_mib() -> float:
    """This process's peak resident set size so far: ``VmHWM`` on Linux, else ``ru_maxrss``.

    ``ru_maxrss`` is not used where ``/proc`` answers: Linux carries the peak of the process
    that started this one over ``exec`` (``subprocess`` spawns through ``vfork``), and keeps
    the larger of the two, so a child whose own peak stays below its parent's would report
    the parent's. ``VmHWM`` is this process's own, and ``reset_peak_rss`` resets it.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def rss_mib() -> float:
    """This process's resident set size now (Linux ``/proc/self/status``; NaN elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def reset_peak_rss() -> bool:
    """Reset the peak-RSS mark to the current RSS (Linux ``/proc/self/clear_refs``).

    Returns False where the OS refuses; the baseline is then the peak so far.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


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


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
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
    return info


def write_json(name: str, data: dict[str, Any]) -> Path:
    """Write ``results/<name>.json`` and return its path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=jsonable) + "\n")
    return path


def jsonable(value: object) -> object:
    """``json.dumps``'s ``default``: NaN as null, dtypes, devices and paths as text."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, (torch.dtype, torch.device, Path)):
        return str(value)
    raise TypeError(f"not serialisable: {type(value).__name__}")


def run_child(args: list[str], timeout: float) -> tuple[dict[str, Any] | None, str]:
    """Run ``python <args>`` in a fresh process; its last stdout line is a JSON object.

    Returns ``(result, error)``: ``result`` is None when the child failed or timed out,
    with ``error`` saying how (the child's last stderr lines).
    """
    try:
        proc = subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return None, f"exit code {proc.returncode}: {tail}"
    try:
        return json.loads(lines[-1]), ""
    except json.JSONDecodeError:
        return None, f"unreadable output: {lines[-1][:200]}"


def import_peer() -> Any:
    """The peer, ``torch_levenberg_marquardt`` (installed by the bench session)."""
    import torch_levenberg_marquardt

    return torch_levenberg_marquardt


def row(
    what: str,
    value: float | None,
    target: float | None,
    *,
    op: str = "≤",
    bound: str = "",
    detail: str = "",
    unit: str = "×",
) -> dict[str, Any]:
    """One line of the summary: a ratio, its target and PASS / MISS.

    ``op`` is "≤" (the ratio must not exceed the target) or "≥". ``bound`` is "" for a
    measured ratio, "<" or ">" when only a bound is known (one side did not reach the
    goal within its time cap); a bound that does not decide the target gives "open".
    ``target=None`` marks a figure shown for information ("info"). ``unit`` follows the
    value and the target ("×" for ratios; "" for counts).
    """
    if value is None or value != value:
        result = "n/a"
    elif target is None:
        result = "info"
    elif bound == "":
        result = "PASS" if (value <= target if op == "≤" else value >= target) else "MISS"
    elif bound == "<":  # the true ratio is below ``value``
        if op == "≤":
            result = "PASS" if value <= target else "open"
        else:
            result = "MISS" if value <= target else "open"
    else:  # the true ratio is above ``value``
        if op == "≤":
            result = "MISS" if value >= target else "open"
        else:
            result = "PASS" if value >= target else "open"
    shown = "—" if value is None or value != value else f"{bound}{value:.3g}{unit}"
    return {
        "what": what,
        "value": value,
        "bound": bound,
        "shown": shown,
        "target": "—" if target is None else f"{op} {target:g}{unit}",
        "verdict": result,
        "detail": detail,
    }


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The rows as aligned text lines."""
    out = []
    for r in rows:
        out.append(
            f"  {r['what']:<48s} {r['shown']:>10s}   target {r['target']:<8s} "
            f"{r['verdict']:<5s} {r['detail']}"
        )
    return "\n".join(out)


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
