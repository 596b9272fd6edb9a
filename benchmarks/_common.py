"""Shared pieces of the benchmarks: the sinc problem, timing, machine description, output.

The seed problem (the cuPyLMA sinc tutorial): ``y = sinc(10 x)`` on 100000 points of
``[-1, 1]``, batches of 10000, fitted by a 1-H-1 tanh MLP (H = 64: P = 193; H = 256:
P = 769). Every benchmark builds its models from the same seed so that all optimizers
start from the same parameters.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from _child import jsonable
from torch import nn

from marquardt.testing.problems import sinc, tanh_mlp

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
THREADS = 2
SEED = 0
DATASET_SIZE = 100_000
BATCH = 10_000
#: The large network (P = 526,849) that ``matrix_free`` and ``scale``'s subsets train, on
#: batches of ``LARGE_N``, against Adam on minibatches of ``ADAM_BATCH`` at ``ADAM_LRS``.
LARGE_WIDTHS = (1, 512, 512, 512, 1)
LARGE_N = 10_000
ADAM_LRS = (1e-3, 3e-4, 1e-4)
ADAM_BATCH = 1000
#: What was measured, where the tree is not a git checkout (``run_all.py --source``).
SOURCE_VARIABLE = "MARQUARDT_BENCH_SOURCE"


def setup_threads() -> None:
    """Two intra-op threads (the machine has two cores), one inter-op thread."""
    torch.set_num_threads(THREADS)


def full_mse(
    model: nn.Module, x: torch.Tensor | None = None, y: torch.Tensor | None = None
) -> float:
    """The model's MSE on ``(x, y)`` (default the seed's whole sinc dataset), in chunks of
    20,000 rows so that a large model's activations stay small."""
    if x is None or y is None:
        x, y = sinc(DATASET_SIZE)
    total = 0.0
    with torch.no_grad():
        for lo in range(0, x.shape[0], 20_000):
            total += float(((model(x[lo : lo + 20_000]) - y[lo : lo + 20_000]) ** 2).sum())
    return total / x.shape[0]


def sinc_model(hidden: int = 256, seed: int = SEED) -> nn.Module:
    """The seed's 1-hidden-1 tanh MLP (``tanh_mlp((1, hidden, 1), seed)``)."""
    return tanh_mlp((1, hidden, 1), seed)


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


def suffix(quick: bool, device: str = "cpu") -> str:
    """What a run adds to the names of its files: "-quick" for a quick run (never the
    recorded figures), "-gpu" for a run on a GPU (beside the CPU's)."""
    gpu = torch.device(device).type == "cuda"
    return ("-quick" if quick else "") + ("-gpu" if gpu else "")


def write_json(name: str, data: dict[str, Any]) -> Path:
    """Write ``results/<name>.json`` and return its path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=jsonable) + "\n")
    return path


def import_peer() -> Any:
    """The peer, ``torch_levenberg_marquardt`` (installed by the bench session)."""
    import torch_levenberg_marquardt

    return torch_levenberg_marquardt


def plot(draw: Callable[[Any, dict[str, Any]], Any]) -> Callable[[dict[str, Any], str], None]:
    """A benchmark's plot: ``draw(plt, results)`` makes the figure (or None: nothing to
    show); the function returned, ``(results, png)``, writes it to ``results/<png>``, and
    does nothing where matplotlib is not installed."""

    def write(results: dict[str, Any], png: str) -> None:
        plt = pyplot()
        fig = None if plt is None else draw(plt, results)
        if fig is None:
            return
        fig.tight_layout()
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        fig.savefig(RESULTS_DIR / png, dpi=120)
        plt.close(fig)

    return write


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
