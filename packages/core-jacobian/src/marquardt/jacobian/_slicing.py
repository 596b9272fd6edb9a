"""Cutting a batch into slices and running them on the model devices.

Slice ``s`` covers samples ``[s·k, min((s+1)·k, N))`` for ``k = slice_size`` and is
given round-robin to device ``s mod D``. Each device has one worker thread, so the
devices compute concurrently (torch releases the GIL inside its kernels); on a GPU the
worker runs on its own CUDA stream, inputs are staged through pinned host memory and
copied with ``non_blocking=True``. Results come back in slice order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

import torch

__all__ = ["DeviceWorkers", "slice_ranges", "to_device", "to_host_fresh"]

T = TypeVar("T")


def slice_ranges(batch: int, slice_size: int) -> list[tuple[int, int]]:
    """The sample ranges ``(start, stop)`` of consecutive slices of ``slice_size``."""
    return [(lo, min(lo + slice_size, batch)) for lo in range(0, batch, slice_size)]


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``; host tensors bound for a GPU go through pinned memory."""
    if t.device == device or (device.type == "cpu" and t.device.type == "cpu"):
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        if not t.is_pinned():
            t = t.pin_memory()
        return t.to(device, non_blocking=True)
    return t.to(device)


def to_host_fresh(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A new tensor holding ``t`` on ``device`` (never a buffer handed out before).

    From a GPU to the host the copy lands in a freshly pinned buffer and the stream is
    synchronised before returning, so a consumer that reads it asynchronously (Legate
    attaching host memory) always sees complete, never-overwritten data.
    """
    if t.device == device or (device.type == "cpu" and t.device.type == "cpu"):
        return t
    if t.device.type == "cuda" and device.type == "cpu":
        buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        buf.copy_(t, non_blocking=True)
        torch.cuda.current_stream(t.device).synchronize()
        return buf
    return t.to(device)


_WORKER_STREAMS: dict[torch.device, Any] = {}
_WORKER_STREAMS_LOCK = threading.Lock()


def _worker_stream(device: torch.device) -> Any:
    """The one side stream of ``device`` that every worker thread of this process runs on.

    Created on first use, never at import, and shared by all ``DeviceWorkers``: each new
    stream costs cuBLAS a workspace (tens of MiB on recent GPUs) that PyTorch keeps for the
    life of the process, so a stream per optimizer would leak that much per optimizer.
    """
    with _WORKER_STREAMS_LOCK:
        if device not in _WORKER_STREAMS:
            _WORKER_STREAMS[device] = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
        return _WORKER_STREAMS[device]


class DeviceWorkers:
    """One worker thread per model device; work for replica ``i`` runs on worker ``i``.

    With a single device the work runs in the calling thread (no thread hop).
    """

    def __init__(self, devices: Sequence[torch.device]) -> None:
        self._devices = list(devices)
        self._pools: list[ThreadPoolExecutor] | None = None
        self._lock = threading.Lock()

    def _pool(self, index: int) -> ThreadPoolExecutor:
        with self._lock:
            if self._pools is None:
                self._pools = [
                    ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"marquardt-dev{i}")
                    for i in range(len(self._devices))
                ]
            return self._pools[index]

    def _stream_context(self, index: int) -> AbstractContextManager[Any]:
        device = self._devices[index]
        if device.type != "cuda":
            return nullcontext()
        return torch.cuda.stream(_worker_stream(device))

    def _run(self, index: int, fn: Callable[[], T]) -> T:
        """``fn`` on worker ``index``'s stream; the stream is waited for, so the caller's
        thread may use the result on any stream."""
        with self._stream_context(index):
            out = fn()
            if self._devices[index].type == "cuda":
                torch.cuda.current_stream(self._devices[index]).synchronize()
            return out

    def submit(self, index: int, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on replica ``index``'s worker."""
        if len(self._devices) == 1:
            # The job's own errors travel in the future, as from a worker thread. An
            # interrupt (KeyboardInterrupt, SystemExit) is not the job's result: it reaches
            # the caller as itself, also when it lands while the future is being completed
            # (handling it there would raise InvalidStateError on a finished future).
            # In the calling thread on its current stream: the caller's next kernels queue
            # behind the job's, so nothing waits for the device here.
            fut: Future[T] = Future()
            try:
                out = fn()
            except Exception as exc:
                fut.set_exception(exc)
            else:
                fut.set_result(out)
            return fut
        return self._pool(index).submit(self._run, index, fn)

    def map_ordered(
        self, jobs: Sequence[Callable[[int], T]], window: int | None = None
    ) -> Iterator[T]:
        """Results of ``jobs[s](s mod D)`` on worker ``s mod D``, in order ``s``.

        At most ``window`` jobs are in flight (default ``2·D``), bounding memory when the
        consumer is slower than the devices.
        """
        d = len(self._devices)
        limit = max(1, window if window is not None else 2 * d)
        pending: list[Future[T]] = []
        nxt = 0
        try:
            while nxt < len(jobs) or pending:
                while nxt < len(jobs) and len(pending) < limit:
                    job = jobs[nxt]
                    dev = nxt % d
                    pending.append(self.submit(dev, lambda job=job, dev=dev: job(dev)))  # type: ignore[misc]
                    nxt += 1
                yield pending.pop(0).result()
        finally:
            for fut in pending:
                fut.cancel()
            _drain(pending)

    def run_all(self, jobs: Sequence[Callable[[int], T]]) -> list[T]:
        """All results of ``map_ordered`` as a list (every device busy at once)."""
        return list(self.map_ordered(jobs, window=len(jobs)))

    def close(self) -> None:
        """Stop the worker threads."""
        with self._lock:
            if self._pools is not None:
                for p in self._pools:
                    p.shutdown(wait=True)
                self._pools = None


def _drain(pending: Sequence[Future[Any]]) -> None:
    """Wait for the jobs still running (they write into the replicas' buffers), dropping
    their own errors: the stream already ends with the error or the close that stopped it.

    A Ctrl-C while waiting is not one of the jobs' errors: the waiting goes on (the jobs
    end on their own, and the caller's restore must not race them), then the interrupt is
    raised, in place of whatever was ending the stream.
    """
    interrupt: BaseException | None = None
    for fut in pending:
        while not fut.cancelled():
            try:
                fut.exception()  # waits; the job's error is returned, not raised
                break
            except (KeyboardInterrupt, SystemExit) as exc:
                interrupt = interrupt or exc
    if interrupt is not None:
        raise interrupt
