"""Ports and process ids for tests that start processes."""

from __future__ import annotations

import socket
from pathlib import Path


def free_port() -> int:
    """A TCP port free on this host now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unused_pid() -> int:
    """A PID no process can have: above the kernel's largest."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
