"""What Linux's ``/proc`` says about a process: owner, parent, session, command, start.

A PID alone does not name a process for long: once it exits, the kernel may give its PID
to another. ``(pid, start_ticks)`` does (the start time never changes and no two
processes with one PID start at the same tick), so whatever is read here carries both, and
``_stop`` signals a PID only while that pair still holds.

Nothing here needs privileges: ``stat``, ``status`` and ``cmdline`` of every process are
readable by all users; only ``fd`` (which files a process holds open) is limited to its
owner and root.
"""

from __future__ import annotations

import os
import pwd
import shlex
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessStat:
    """One process as ``/proc/<pid>`` shows it.

    ``uid`` is the real user id (who started it, the owner ``kill`` checks); ``session`` its
    session id (the PID of the session's leader: a login shell, a terminal multiplexer's
    pane, a service); ``state`` the one-letter state of ``ps`` (``R``, ``S``, ``D``, ``Z``…);
    ``start_ticks`` its start time in clock ticks since boot; ``argv`` its command line,
    empty for kernel threads and zombies; ``comm`` the kernel's short name for it.
    """

    pid: int
    ppid: int
    session: int
    state: str
    start_ticks: int
    uid: int
    comm: str
    argv: tuple[str, ...]

    @property
    def command(self) -> str:
        """The command line as a shell would read it, else ``[comm]`` as ``ps`` shows it."""
        return shlex.join(self.argv) if self.argv else f"[{self.comm}]"

    @property
    def exited(self) -> bool:
        """Whether it has exited and waits only for its parent to collect its status."""
        return self.state in {"Z", "X"}


def available(proc: Path = PROC) -> bool:
    """Whether ``/proc`` is mounted here (Linux), so processes can be read at all."""
    return (proc / "self" / "stat").exists()


def read_process(pid: int, proc: Path = PROC) -> ProcessStat | None:
    """The process ``pid`` now, or ``None`` when no such process can be read here.

    ``None`` covers a PID that has exited, one of another PID namespace (a container's PIDs
    differ from the host's) and ``/proc`` mounted with ``hidepid``.
    """
    if pid <= 0:
        return None
    base = proc / str(pid)
    try:
        stat = (base / "stat").read_text()
        status = (base / "status").read_text()
        raw = (base / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # "pid (comm) state ppid pgrp session …": comm may hold spaces and parentheses, so the
    # fields after it are found from the last ")".
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    uid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:"))
    return ProcessStat(
        pid=pid,
        ppid=int(fields[1]),
        session=int(fields[3]),
        state=fields[0],
        start_ticks=int(fields[19]),
        uid=uid,
        comm=comm,
        argv=tuple(os.fsdecode(arg) for arg in raw.split(b"\0")[:-1]),
    )


def same_process(stat: ProcessStat, proc: Path = PROC) -> ProcessStat | None:
    """``stat``'s process as it is now, or ``None`` once it has exited or its PID is reused."""
    now = read_process(stat.pid, proc)
    return now if now is not None and now.start_ticks == stat.start_ticks else None


def user_name(uid: int) -> str:
    """The login name of ``uid``, or the number when the password database has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def lineage(pid: int, proc: Path = PROC) -> tuple[ProcessStat, ...]:
    """``pid`` and its ancestors, nearest first, up to the first PID of this namespace."""
    found: list[ProcessStat] = []
    seen: set[int] = set()
    current = read_process(pid, proc)
    while current is not None and current.pid not in seen:
        found.append(current)
        seen.add(current.pid)
        current = read_process(current.ppid, proc)
    return tuple(found)


def is_orphan(process: ProcessStat, parent: ProcessStat | None) -> bool | None:
    """Whether ``process`` outlived what started it and was adopted by another process.

    A child is born in its parent's session and keeps it; when the parent exits, the kernel
    gives the child to PID 1 of its namespace or to the nearest ancestor that asked to reap
    orphans (a *subreaper*: ``systemd --user``, a container's init), which does not belong to
    that session. So a process is an orphan when it is not a session leader and its
    parent is gone (``parent`` is ``None``) or lives in another session.

    Session leaders are never orphans here: services, ``setsid`` runs and notebook kernels
    were detached from whatever started them on purpose. ``None`` (cannot tell) for a parent
    outside this PID namespace (``ppid`` 0). A process adopted by a subreaper of its own
    session is not detected.
    """
    if process.session == process.pid or process.pid == 1:
        return False
    if process.ppid == 0:
        return None
    if parent is None:
        return True
    return parent.session != process.session


def holds_file(pid: int, prefix: str, proc: Path = PROC) -> bool | None:
    """Whether ``pid`` holds open a file whose path starts with ``prefix`` (``/dev/nvidia``).

    ``None`` when its open files cannot be read: another user's process, unless root.
    """
    fds = proc / str(pid) / "fd"
    try:
        names = os.listdir(fds)
    except FileNotFoundError:
        return False
    except PermissionError:
        return None
    for name in names:
        try:
            target = os.readlink(fds / name)
        except OSError:  # closed since the listing
            continue
        if target.startswith(prefix):
            return True
    return False
