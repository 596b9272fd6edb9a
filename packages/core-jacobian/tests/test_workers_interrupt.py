"""An interrupt inside the single-device worker pool reaches the caller as itself."""

from __future__ import annotations

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
