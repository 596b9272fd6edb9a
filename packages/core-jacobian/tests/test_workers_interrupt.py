"""An interrupt inside the single-device worker pool reaches the caller as itself."""

from __future__ import annotations

import _thread
import signal
import threading
import time
from concurrent.futures import Future

import pytest
import torch

from marquardt.jacobian._slicing import DeviceWorkers


def _interrupt() -> int:
    raise KeyboardInterrupt


def test_an_interrupt_in_the_job_is_raised_not_stored() -> None:
    workers = DeviceWorkers([torch.device("cpu")])
    with pytest.raises(KeyboardInterrupt):
        workers.submit(0, _interrupt)


def test_an_error_of_the_job_travels_in_the_future() -> None:
    def fail() -> int:
        raise ValueError("bad slice")

    fut = DeviceWorkers([torch.device("cpu")]).submit(0, fail)
    with pytest.raises(ValueError, match="bad slice"):
        fut.result()


def test_an_interrupt_landing_after_the_result_is_stored_stays_an_interrupt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C between storing the result and returning from ``set_result``: the caller
    must see KeyboardInterrupt, not InvalidStateError from completing a finished future."""
    original = Future.set_result

    def set_then_interrupt(self: Future[int], result: int) -> None:
        original(self, result)
        raise KeyboardInterrupt

    monkeypatch.setattr(Future, "set_result", set_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        DeviceWorkers([torch.device("cpu")]).submit(0, lambda: 3)


def test_map_ordered_passes_an_interrupt_through() -> None:
    workers = DeviceWorkers([torch.device("cpu")])
    jobs = [lambda dev: 1, lambda dev: _interrupt(), lambda dev: 3]
    with pytest.raises(KeyboardInterrupt):
        list(workers.map_ordered(jobs))


def test_an_interrupt_while_waiting_for_jobs_in_flight_is_not_swallowed() -> None:
    """A job's error ends the stream; Ctrl-C while the stream waits for the jobs still in
    flight on other workers reaches the caller as KeyboardInterrupt, after they finish."""
    finished: list[int] = []

    def fail(_dev: int) -> int:
        raise ValueError("bad slice")

    def slow(_dev: int) -> int:
        time.sleep(0.4)
        finished.append(1)
        return 1

    workers = DeviceWorkers([torch.device("cpu"), torch.device("cpu")])
    timer = threading.Timer(0.1, _thread.interrupt_main)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            try:
                timer.start()
                list(workers.map_ordered([fail, slow]))
            finally:
                timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
        workers.close()
    assert finished == [1]
