"""No launcher and ``nprocs > 1``: this process spawns the training processes itself.

The children are started with ``torch.multiprocessing`` (method ``spawn``, safe with CUDA)
and meet through torch.distributed's TCP store on 127.0.0.1 and a free port.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from .. import _settings
from .._doclists import with_lists
from .._errors import LaunchError
from ._base import ENVIRONMENT_LISTS, LaunchEnvironment, ProcessLayout


def free_port() -> int:
    """A TCP port free on this host right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@with_lists(ENVIRONMENT_LISTS)
class SpawnEnvironment(LaunchEnvironment):
    """Spawn ``nprocs`` local processes, ranks 0 … nprocs-1."""

    name = "spawn"
    spawns = True

    def __init__(
        self, env: Mapping[str, str], nprocs: int, gpu_count: int = 0, use_gpu: bool = False
    ) -> None:
        super().__init__(env, nprocs, gpu_count, use_gpu)
        self._port: int | None = None

    @classmethod
    def detect(cls, env: Mapping[str, str], nprocs: int) -> bool:
        return nprocs > 1

    def validate(self) -> None:
        if self.nprocs < 2:
            raise LaunchError(
                f"spawn: nprocs={self.nprocs}; spawning needs at least 2 processes. "
                "HINT: nprocs=1 trains in this process"
            )
        self._check_gpus()

    @property
    def local_processes(self) -> int:
        return self.nprocs

    @property
    def master_addr(self) -> str:
        return _settings.get("MASTER_ADDR", self.env) or "127.0.0.1"

    @property
    def master_port(self) -> int:
        if self._port is None:
            self._port = _settings.get_int("MASTER_PORT", self.env) or free_port()
        return self._port

    def layouts(self) -> list[ProcessLayout]:
        n = self.nprocs
        return [ProcessLayout(i, i, n, n, 0, self.master_addr, self.master_port) for i in range(n)]
