"""How many torch threads a fit on the CPU runs on, and a block that sets that count.

torch's intra-op pool splits each kernel between its threads, which wait for each other
at its end. A batched LM iteration is dozens of short kernels, so a second thread pays
only when each kernel has enough work, and only when a core is free to run it at once: on
a busy machine each kernel waits for the thread the scheduler let go, and a fit runs many
times slower than on one thread. The default is therefore one thread, and more only when
both the work per kernel and the idle cores allow (``choose_threads``).

The load average counts this process's own threads too: a script that has been fitting
for a minute adds about one to it. ``own_load`` estimates that share from this process's
CPU time, with the kernel's one-minute weighting, so that an otherwise idle machine is
seen as idle by the process that keeps it busy. And it lags: a process that ended a
moment ago (a script's first run, before its second) still counts for most of a minute,
so the load is capped by the threads of other processes runnable now
(``runnable_others``, from ``/proc``).
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = [
    "BATCH_THREAD_WORK",
    "FIT_THREAD_BYTES",
    "NEVER",
    "batch_crossover",
    "choose_threads",
    "idle_cores",
    "own_load",
    "runnable_others",
    "torch_threads",
]

#: Elements of J per chunk (fits × N × P) from which ``curve_fit_batch`` tries more than
#: one thread: below it a second thread has not paid even on idle cores (benchmarks/
#: NOTES.md, the cpufit rows' default threads against one thread).
BATCH_THREAD_WORK = 2_000_000
#: Bytes of J per fit (N·P·item size) from which the eager batched iteration tries more
#: than one thread: its per-fit P × P work (the Gram matrices, the Cholesky solves) runs as
#: many short kernels that a second thread does not split well for smaller fits
#: (benchmarks/NOTES.md, the cpufit rows). The fused (compiled) iteration has no such floor.
FIT_THREAD_BYTES = 768
#: A crossover no work reaches: one thread.
NEVER = 2**62


def batch_crossover(points: int, params: int, item: int, fused: bool) -> int:
    """The work per chunk from which ``curve_fit_batch`` tries more than one thread.

    **Arguments:**

    - ``points``, ``params``: N and P of each fit; ``item``: bytes per element.
    - ``fused``: whether the iteration runs compiled (``_curve.compiled_lm``).

    **Returns:** ``BATCH_THREAD_WORK`` where the iteration runs fused or each fit holds at
    least ``FIT_THREAD_BYTES`` of J; else ``NEVER`` (one thread).
    """
    if fused or points * params * item >= FIT_THREAD_BYTES:
        return BATCH_THREAD_WORK
    return NEVER


def idle_cores(cores: int, load: float | None) -> int:
    """The cores free for this process: ``cores`` less the runnable threads the last
    minute's load average counts (rounded), at least 1; 1 when the load is unknown.

    ``load`` is meant without this process's own share (``_machine`` subtracts it)."""
    if load is None or not math.isfinite(load):
        return 1
    return max(1, min(cores, cores - round(load)))


#: The time constant of the one-minute load average, in seconds.
LOAD_MINUTE = 60.0
#: (monotonic time, this process's CPU seconds) at earlier reads, oldest first.
_SAMPLES: deque[tuple[float, float]] = deque(maxlen=64)


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def own_load(samples: deque[tuple[float, float]], now: float, cpu: float) -> float:
    """This process's share of the one-minute load average: the CPU time it used between
    successive ``samples`` (and up to ``now``, ``cpu``), each interval weighted as the
    kernel decays it, exp(−age/60 s)/60 s. Time before the first sample counts as idle,
    which errs toward fewer threads. ``(now, cpu)`` is appended to ``samples``.

    Arguments:
        samples: earlier (monotonic time, CPU seconds) reads of this process, oldest first.
        now: the monotonic time now.
        cpu: this process's CPU seconds now (user and system, all threads).

    Returns:
        The estimated runnable threads of this process in the load average (≥ 0).
    """
    share = 0.0
    later_t, later_cpu = now, cpu
    for t, used in reversed(samples):
        if later_t > t:
            age = now - 0.5 * (t + later_t)
            share += max(0.0, later_cpu - used) / LOAD_MINUTE * math.exp(-age / LOAD_MINUTE)
        later_t, later_cpu = t, used
    samples.append((now, cpu))
    return share


#: Reads of the runnable threads now (``runnable_others``), the most of which counts: a
#: busy neighbour is runnable at almost every instant.
NOW_READS = 3


def runnable_others(loadavg: str, own_states: list[str]) -> int:
    """Threads of other processes runnable at this instant: the running count of
    ``/proc/loadavg`` (its fourth field, "running/total") less this process's threads in
    state R (the reading thread among them).

    Arguments:
        loadavg: the text of ``/proc/loadavg``.
        own_states: the state letter of each of this process's threads.

    Returns:
        The other processes' runnable threads now (≥ 0).
    """
    running = int(loadavg.split()[3].split("/")[0])
    return max(0, running - sum(state == "R" for state in own_states))


def _others_now() -> int | None:
    """``runnable_others`` read ``NOW_READS`` times, the most; None where /proc is absent."""
    most = None
    try:
        for _ in range(NOW_READS):
            states = []
            for task in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{task}/stat") as fh:
                        stat = fh.read()
                except OSError:  # a thread that ended since the listing
                    continue
                states.append(stat[stat.rindex(")") + 2])
            with open("/proc/loadavg") as fh:
                now = runnable_others(fh.read(), states)
            most = now if most is None else max(most, now)
    except (OSError, ValueError, IndexError):
        return None
    return most


def _machine() -> tuple[int, float | None]:
    """(cores this process may run on, the other processes' load, or None): the one-minute
    load average less this process's own share of it (``own_load``), and no more than the
    threads of other processes runnable now (``runnable_others``), so that the minute-long
    tail of a process that has just ended (a script's first run, before its second) does
    not count as a neighbour."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cores = os.cpu_count() or 1
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - Windows has no load average
        load = None
    own = own_load(_SAMPLES, time.monotonic(), _cpu_seconds())
    if load is None:
        return cores, None
    others = max(0.0, load - own)
    now = _others_now()
    return cores, others if now is None else min(others, float(now))


def choose_threads(
    work: int,
    crossover: int,
    *,
    most: int | None = None,
    machine: tuple[int, float | None] | None = None,
) -> int:
    """The default torch thread count for a fit whose kernels each handle ``work`` elements.

    One thread when ``work < crossover`` (measured per caller: below it a second thread
    does not pay even on idle cores); else ``min(most, idle_cores(cores, load))``.

    **Arguments:**

    - ``work``, ``crossover``: the work per kernel and the measured crossover, in one unit.
    - ``most``: the most threads to use; default torch's setting (``torch.get_num_threads``,
      which honours ``OMP_NUM_THREADS``).
    - ``machine``: (the cores this process may run on, the one-minute load average or
      None where the system has none); read from the machine when not given.

    **Returns:** a thread count of at least 1.
    """
    if work < crossover:
        return 1
    cores, load = _machine() if machine is None else machine
    most = torch.get_num_threads() if most is None else most
    return max(1, min(most, idle_cores(cores, load)))


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to ``count`` (None: left as it is) for a block."""
    threads = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if count is not None:
            torch.set_num_threads(threads)
