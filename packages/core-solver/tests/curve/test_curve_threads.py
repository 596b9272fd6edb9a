"""The default torch thread count of fits on the CPU (``_curve.threads``): the rule, given
the machine's cores and load, and that curve_fit_batch and the sliced engine use it."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np
import pytest
import torch

from marquardt.solver import curve_fit, curve_fit_batch
from marquardt.solver._curve import curve_fit as scipy_edge
from marquardt.solver._curve import threads as threads_module
from marquardt.solver._curve.batch import curve_fit_batch as batch_module
from marquardt.solver._curve.curve_fit import ENGINE_ONE_THREAD_POINTS
from marquardt.solver._curve.threads import (
    BATCH_THREAD_WORK,
    FIT_THREAD_BYTES,
    NEVER,
    batch_crossover,
    choose_threads,
    idle_cores,
    torch_threads,
)


@pytest.mark.parametrize(
    ("cores", "load", "idle"),
    [
        (2, 0.0, 2),
        (2, 0.4, 2),
        (2, 0.6, 1),
        (2, 1.4, 1),
        (2, 8.0, 1),
        (16, 3.6, 12),
        (16, 0.0, 16),
        (2, None, 1),
        (4, math.nan, 1),
    ],
)
def test_idle_cores_are_the_cores_less_the_rounded_load(
    cores: int, load: float | None, idle: int
) -> None:
    assert idle_cores(cores, load) == idle


def test_less_work_than_the_crossover_runs_on_one_thread_even_on_an_idle_machine() -> None:
    assert choose_threads(999, 1000, most=16, machine=(16, 0.0)) == 1
    assert choose_threads(1000, 1000, most=16, machine=(16, 0.0)) == 16


@pytest.mark.parametrize(
    ("most", "machine", "threads"),
    [
        (2, (2, 0.1), 2),  # idle two-core machine: both cores
        (2, (2, 1.6), 1),  # one core busy elsewhere: never more threads than idle cores
        (2, (2, 7.5), 1),  # overloaded: one thread
        (1, (8, 0.0), 1),  # torch's setting (OMP_NUM_THREADS=1) is the most
        (32, (8, 2.2), 6),
        (4, (4, None), 1),  # no load average: one thread
    ],
)
def test_enough_work_takes_the_idle_cores_up_to_torchs_setting(
    most: int, machine: tuple[int, float | None], threads: int
) -> None:
    assert choose_threads(BATCH_THREAD_WORK, BATCH_THREAD_WORK, most=most, machine=machine) == (
        threads
    )


def test_the_machine_is_read_when_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    cores, load = threads_module._machine()
    assert cores >= 1 and (load is None or load >= 0.0)
    monkeypatch.setattr(threads_module, "_machine", lambda: (6, 1.2))
    assert choose_threads(10, 1, most=32) == 5


def _recording_gaussian(seen: list[int]) -> Any:
    def f(x: torch.Tensor, a: torch.Tensor, mu: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return a * torch.exp(-((x - mu) ** 2) / (2 * s * s))

    return f


def _batch_data(fits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.linspace(-3.0, 3.0, 20)
    rng = np.random.default_rng(3)
    a = rng.uniform(1.0, 2.0, (fits, 1))
    y = a * np.exp(-((x - 0.3) ** 2) / 2.0) + 0.01 * rng.standard_normal((fits, 20))
    return x, y, np.tile([1.0, 0.0, 1.0], (fits, 1))


def _record_thread_rule(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[tuple[int, int]]:
    """Replace ``module.choose_threads`` by a rule that answers 2 threads; returns the list
    of the (work, crossover) it is asked."""
    asked: list[tuple[int, int]] = []

    def rule(work: int, crossover: int) -> int:
        asked.append((work, crossover))
        return 2

    monkeypatch.setattr(module, "choose_threads", rule)
    return asked


def _batch_in_chunks_of_5(f: Any, x: np.ndarray, y: np.ndarray, p0: np.ndarray) -> Any:
    return curve_fit_batch(f, x, y, p0, chunk_size=5)


def _one_fit_on_the_sliced_engine(f: Any, x: np.ndarray, y: np.ndarray, p0: np.ndarray) -> Any:
    return curve_fit(f, x, y[0], p0[0], device="cpu")


@pytest.mark.parametrize(
    ("module", "fit", "fits", "asks"),
    [
        # fits per chunk × N × P, against the crossover for these fits (eager, float64)
        pytest.param(
            batch_module,
            _batch_in_chunks_of_5,
            12,
            (5 * 20 * 3, batch_crossover(20, 3, 8, fused=False)),
            id="curve_fit_batch-for-its-chunk",
        ),
        pytest.param(
            scipy_edge,
            _one_fit_on_the_sliced_engine,
            1,
            (20, ENGINE_ONE_THREAD_POINTS),
            id="sliced-engine-for-its-points",
        ),
    ],
)
def test_a_fit_runs_on_the_rules_count_for_its_work(
    monkeypatch: pytest.MonkeyPatch, module: Any, fit: Any, fits: int, asks: tuple[int, int]
) -> None:
    asked = _record_thread_rule(monkeypatch, module)
    seen: list[int] = []
    x, y, p0 = _batch_data(fits)
    with torch_threads(1):  # the model check before the fit runs on the caller's count
        fit(_recording_gaussian(seen), x, y, p0)
        assert torch.get_num_threads() == 1
    assert asked == [asks]
    assert seen[0] == 1 and seen[-1] == 2


def test_curve_fit_batch_runs_on_a_thread_count_given(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _record_thread_rule(monkeypatch, batch_module)
    seen: list[int] = []
    x, y, p0 = _batch_data(12)
    with torch_threads(3):
        curve_fit_batch(_recording_gaussian(seen), x, y, p0, threads=1)
    assert not asked and seen[0] == 3 and seen[-1] == 1  # a count given is used


def test_the_batch_crossover_counts_the_work_per_fit_unless_the_iteration_is_fused() -> None:
    large = FIT_THREAD_BYTES // (25 * 4) + 1  # the P from which a float32 fit of 25
    assert 25 * large * 4 >= FIT_THREAD_BYTES > 25 * (large - 1) * 4  # points is large
    assert batch_crossover(25, large - 1, 4, fused=False) == NEVER
    assert batch_crossover(25, large - 1, 4, fused=True) == BATCH_THREAD_WORK
    assert batch_crossover(25, large, 4, fused=False) == BATCH_THREAD_WORK
    assert choose_threads(10 * BATCH_THREAD_WORK, NEVER) == 1


def test_curve_fit_batch_default_is_one_thread_for_a_small_batch() -> None:
    seen: list[int] = []
    x, y, p0 = _batch_data(8)
    with torch_threads(2):
        curve_fit_batch(_recording_gaussian(seen), x, y, p0)
    assert seen[0] == 2 and seen[-1] == 1


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "2"])
def test_curve_fit_batch_refuses_a_thread_count_that_is_not_a_positive_integer(
    threads: Any,
) -> None:
    x, y, p0 = _batch_data(2)
    with pytest.raises(ValueError, match="threads must be a positive integer or None"):
        curve_fit_batch(_recording_gaussian([]), x, y, p0, threads=threads)


def test_own_load_weights_this_process_cpu_time_as_the_load_average_does() -> None:
    samples: deque[tuple[float, float]] = deque()
    # No earlier read: nothing is known of this process's past, which counts as idle.
    assert threads_module.own_load(samples, 100.0, 5.0) == 0.0
    # One busy thread over the last minute and more: about one runnable thread.
    samples = deque((t, t - 1000.0) for t in range(1000, 1600, 5))
    assert threads_module.own_load(samples, 1600.0, 600.0) == pytest.approx(1.0, abs=0.02)
    # Two threads busy for the last 6 s only, idle before: a tenth of a minute, weighted.
    samples = deque([(0.0, 0.0), (594.0, 0.0)])
    assert threads_module.own_load(samples, 600.0, 12.0) == pytest.approx(
        12.0 / 60.0 * math.exp(-3.0 / 60.0)
    )
    # Idle since the last read: an old busy stretch counts less as it ages.
    assert threads_module.own_load(samples, 700.0, 12.0) < 0.2 * math.exp(-1.0)


def test_the_machine_seen_by_a_busy_process_leaves_out_its_own_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(threads_module.os, "getloadavg", lambda: (1.1, 1.0, 1.0))
    monkeypatch.setattr(threads_module, "own_load", lambda *args: 1.0)
    monkeypatch.setattr(threads_module, "_others_now", lambda: None)
    load = threads_module._machine()[1]
    assert load == pytest.approx(0.1)
    monkeypatch.setattr(threads_module, "own_load", lambda *args: 3.0)
    assert threads_module._machine()[1] == 0.0


def test_the_runnable_threads_now_leave_out_this_process() -> None:
    text = "0.52 0.61 0.70 4/612 31337\n"
    assert threads_module.runnable_others(text, ["R", "S", "R"]) == 2
    assert threads_module.runnable_others(text, ["R", "R", "R", "R", "R"]) == 0


def test_a_load_left_by_an_ended_process_is_capped_by_the_threads_runnable_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A first run ended a moment ago: the minute's load still counts it, /proc sees no one.
    monkeypatch.setattr(threads_module.os, "getloadavg", lambda: (1.0, 0.8, 0.5))
    monkeypatch.setattr(threads_module, "own_load", lambda *args: 0.0)
    monkeypatch.setattr(threads_module, "_others_now", lambda: 0)
    assert threads_module._machine()[1] == 0.0
    assert choose_threads(10, 1, most=2, machine=threads_module._machine()) == 2
    # A neighbour that keeps a core busy: runnable now and in the minute's load.
    monkeypatch.setattr(threads_module, "_others_now", lambda: 1)
    assert threads_module._machine()[1] == 1.0
    assert choose_threads(10, 1, most=2, machine=threads_module._machine()) == 1
    # A neighbour that only just started counts as the load has seen it so far.
    monkeypatch.setattr(threads_module.os, "getloadavg", lambda: (0.2, 0.1, 0.0))
    monkeypatch.setattr(threads_module, "_others_now", lambda: 2)
    assert threads_module._machine()[1] == pytest.approx(0.2)


def test_this_machine_answers_the_runnable_threads_now() -> None:
    now = threads_module._others_now()
    assert now is None or now >= 0
