"""Ending the caller's processes left on GPUs: SIGTERM, a grace period, then SIGKILL.

Every PID asked for is checked before any signal is sent, and when one is refused none is
sent: a mistyped PID must not cost the others' work. A PID is stopped only when

1. a process with that PID exists here and has not already exited (else it is *gone*);
2. it is neither this command nor one of its ancestors (the shell, the notebook kernel,
   the launcher that runs it);
3. its real user id is the caller's (``uid``): another user's processes are theirs to
   stop, even for root;
4. unless ``force``: NVML lists it as a compute process on a GPU, and it holds an NVIDIA
   device file (``/dev/nvidia*``) open here. The second half guards against NVML reporting
   PIDs of another PID namespace (a container on an older driver), where the same number
   names another process.

Signals go through a pidfd opened once the checks pass (``pidfd_open``, Linux 5.3), so a
PID the kernel hands to a new process meanwhile is never signalled; where pidfds are
missing, the process's start time is checked again before each signal.
"""

from __future__ import annotations

import math
import os
import select
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict, Unpack

from ._errors import CleanupError
from ._proc import PROC, ProcessStat, available, holds_file, lineage, read_process, same_process
from ._proc import user_name as _user_name
from ._processes import ComputeProcess, ProcessSurvey, gpu_processes
from ._whole import is_whole

#: A process with a CUDA context holds these open (/dev/nvidiactl, /dev/nvidia0, …).
DEVICE_FILES = "/dev/nvidia"
_POLL = 0.02  # seconds between looks at the processes being stopped

Status = Literal["stopped", "killed", "gone", "survived", "refused", "spared", "would-stop", "left"]


@dataclass(frozen=True)
class Outcome:
    """What happened to one PID.

    ``status``: ``stopped`` (exited after SIGTERM), ``killed`` (SIGKILL after the grace),
    ``gone`` (no such process, or it had exited already), ``survived`` (still running after
    SIGKILL), ``refused`` (a check failed; nothing was sent to any PID), ``spared`` (not
    signalled because another PID was refused), ``would-stop`` (a dry run), ``left``
    (an orphan that ``stop_orphans`` leaves: another user's, or this command's ancestor).
    ``detail`` says it in words.
    """

    pid: int
    command: str
    status: Status
    detail: str

    @property
    def ok(self) -> bool:
        """Whether this PID ended up as asked (gone, or would be in a dry run)."""
        return self.status not in {"refused", "survived", "spared"}


@dataclass(frozen=True)
class StopReport:
    """One ``Outcome`` per PID, in the order asked; ``signalled``: whether any signal went."""

    outcomes: tuple[Outcome, ...]
    signalled: bool

    @property
    def ok(self) -> bool:
        return all(outcome.ok for outcome in self.outcomes)


class _Handle:
    """A process being stopped, named by a pidfd where the kernel has them."""

    def __init__(self, stat: ProcessStat, proc: Path) -> None:
        self.stat = stat
        self.proc = proc
        self.fd: int | None = None
        self.gone_at: float | None = None
        try:
            self.fd = os.pidfd_open(stat.pid)
        except ProcessLookupError:
            self.gone_at = time.monotonic()
            return
        except (AttributeError, OSError):  # no pidfds (kernel < 5.3): start times instead
            self.fd = None
        # The pidfd names whichever process had the PID when it was opened: make sure it is
        # still the one that was checked.
        if same_process(stat, proc) is None:
            self.close()
            self.gone_at = time.monotonic()

    def alive(self) -> bool:
        if self.gone_at is not None:
            return False
        if self.fd is not None:
            running = not select.select([self.fd], [], [], 0)[0]  # readable once it exits
        else:
            now = same_process(self.stat, self.proc)
            running = now is not None and not now.exited
        if not running:
            self.gone_at = time.monotonic()
        return running

    def send(self, signum: signal.Signals) -> bool:
        """Send ``signum``; ``False`` when the process was already gone."""
        if not self.alive():
            return False
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, signum)
            elif same_process(self.stat, self.proc) is not None:
                os.kill(self.stat.pid, signum)
            else:
                return False
        except ProcessLookupError:
            return False
        return True

    def state(self) -> str:
        now = same_process(self.stat, self.proc)
        return "?" if now is None else now.state

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _wait(handles: Iterable[_Handle], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    pending = [h for h in handles if h.alive()]
    while pending and time.monotonic() < deadline:
        time.sleep(_POLL)
        pending = [h for h in pending if h.alive()]


def _places(found: Sequence[ComputeProcess]) -> str:
    return ", ".join(p.place for p in found)


def _check(
    pid: int, survey: ProcessSurvey, uid: int, ancestry: Sequence[ProcessStat], force: bool,
    proc: Path, device_files: str,
) -> ProcessStat | Outcome:  # fmt: skip
    """Whether ``pid`` may be stopped: its process, or the outcome that says why not."""
    found = survey.find(pid)
    stat = read_process(pid, proc)
    if stat is None:
        if found:
            return Outcome(
                pid, found[0].command, "refused",
                f"refused: NVML lists PID {pid} on {_places(found)}, but no process {pid} can be read "
                "here: it runs in another PID namespace (the host, or another container), or "
                "/proc hides it. HINT: run the command where the process was started",
            )  # fmt: skip
        return Outcome(pid, "?", "gone", "already gone: no such process")
    if stat.exited:
        return Outcome(
            pid, stat.command, "gone", "already exited (a zombie until its parent collects it)"
        )
    if ancestry and pid == ancestry[0].pid:
        return Outcome(pid, stat.command, "refused", "refused: it is this command itself")
    level = next((n for n, a in enumerate(ancestry) if a.pid == pid), None)
    if level is not None:
        return Outcome(
            pid, stat.command, "refused",
            f"refused: it is an ancestor of this command ({level} level(s) up), so stopping it "
            "would end this command and the session that runs it. HINT: check the PID with "
            "`marquardt-devices --processes`",
        )  # fmt: skip
    if stat.uid != uid:
        owner = _user_name(stat.uid)
        return Outcome(
            pid, stat.command, "refused",
            f"refused: it belongs to {owner} (uid {stat.uid}), not to {_user_name(uid)} "
            f"(uid {uid}). HINT: ask {owner} to stop it, or run as that user: "
            f"sudo -u {owner} marquardt-devices --stop {pid}",
        )  # fmt: skip
    if force:
        return stat
    if not found:
        return Outcome(
            pid, stat.command, "refused",
            f"refused: NVML lists no compute process {pid} on any GPU. HINT: "
            "`marquardt-devices --processes` lists them; --force stops a process of yours "
            "that is not on a GPU",
        )  # fmt: skip
    if holds_file(pid, device_files, proc) is False:
        return Outcome(
            pid, stat.command, "refused",
            f"refused: NVML lists PID {pid} on {_places(found)}, but process {pid} here holds "
            f"no {device_files}* device open, so NVML's PID may name a process of another PID "
            "namespace. HINT: run the command where the GPU process was started, or add "
            f"--force if process {pid} here is the one to stop",
        )  # fmt: skip
    return stat


def _check_times(grace: float, kill_wait: float) -> None:
    for name, value in (("grace", grace), ("kill_wait", kill_wait)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
            raise ValueError(
                f"{name}={value!r} seconds was asked for; it must be a finite number >= 0. "
                "HINT: --grace 10 waits ten seconds between SIGTERM and SIGKILL"
            )


def _survey(force: bool, proc: Path, hint: str) -> ProcessSurvey:
    if not available(proc):
        raise CleanupError(
            f"stopping GPU processes reads {proc}, which this system does not have. "
            "HINT: the clean-up commands work on Linux; elsewhere use nvidia-smi and kill"
        )
    found = gpu_processes(proc)
    if not found.nvml_available and not force:
        raise CleanupError(
            f"cannot tell which processes compute on a GPU: {found.notes[0]}. Nothing was "
            f"stopped. HINT: {hint}"
        )
    return found


def _carry_out(
    checked: Sequence[ProcessStat | Outcome], grace: float, kill_wait: float, dry_run: bool,
    proc: Path,
) -> StopReport:  # fmt: skip
    refused = [c.pid for c in checked if isinstance(c, Outcome) and c.status == "refused"]
    targets = [c for c in checked if isinstance(c, ProcessStat)]
    if refused or dry_run:
        status: Status = "spared" if refused else "would-stop"
        if refused:
            listed = ", ".join(map(str, refused))
            why = f"spared: nothing is signalled while a PID is refused ({listed})"
        else:
            why = f"would send SIGTERM, then SIGKILL if still running {grace:g} s later"
        outcomes = tuple(
            Outcome(c.pid, c.command, status, why) if isinstance(c, ProcessStat) else c
            for c in checked
        )
        return StopReport(outcomes, signalled=False)
    handles = [_Handle(target, proc) for target in targets]
    try:
        result = _signal(handles, grace, kill_wait)
    finally:
        for handle in handles:
            handle.close()
    outcomes = tuple(result[c.pid] if isinstance(c, ProcessStat) else c for c in checked)
    return StopReport(outcomes, signalled=bool(targets))


def _signal(handles: list[_Handle], grace: float, kill_wait: float) -> dict[int, Outcome]:
    """SIGTERM to every handle, SIGKILL to those alive ``grace`` seconds later; PID -> outcome."""
    result: dict[int, Outcome] = {}

    def done(handle: _Handle, status: Status, detail: str) -> None:
        result[handle.stat.pid] = Outcome(handle.stat.pid, handle.stat.command, status, detail)

    sent = time.monotonic()
    terminated = []
    for handle in handles:
        if handle.send(signal.SIGTERM):
            terminated.append(handle)
        else:
            done(handle, "gone", "already gone before SIGTERM")
    _wait(terminated, grace)
    survivors = []
    for handle in terminated:
        if handle.alive():
            survivors.append(handle)
        else:
            after = (handle.gone_at or sent) - sent
            done(handle, "stopped", f"stopped by SIGTERM (gone {after:.2f} s after it)")
    killed = [h for h in survivors if h.send(signal.SIGKILL)]
    for handle in survivors:
        if handle not in killed:
            done(handle, "stopped", f"stopped by SIGTERM (gone just after the {grace:g} s grace)")
    _wait(killed, kill_wait)
    for handle in killed:
        if not handle.alive():
            done(handle, "killed", f"killed by SIGKILL (still running {grace:g} s after SIGTERM)")
        else:
            done(
                handle, "survived",
                f"still running {kill_wait:g} s after SIGKILL, in state {handle.state()}. "
                "HINT: a process in state D waits inside the kernel, often in the GPU driver; "
                "if it never ends, the GPU needs a reset (nvidia-smi --gpu-reset) or the node "
                "a reboot",
            )  # fmt: skip
    return result


class StopOptions(TypedDict, total=False):
    """The keywords of `stop_processes` and `stop_orphans`, their defaults in `_Stopping`.

    Arguments:
        grace: seconds between SIGTERM and SIGKILL (10).
        kill_wait: seconds to wait after SIGKILL before reporting a survivor (5).
        dry_run: check and report, send nothing (False).
        uid: the user the caller acts for (``os.getuid()``).
        survey: the GPU processes (asked of NVML by default).
        proc: the ``/proc`` to read (``PROC``).
        device_files: the prefix of the device files a GPU process holds (``DEVICE_FILES``).
    """

    grace: float
    kill_wait: float
    dry_run: bool
    uid: int | None
    survey: ProcessSurvey | None
    proc: Path
    device_files: str | None


@dataclass(frozen=True)
class _Stopping:
    """One request to stop processes, its options resolved and checked, and what it found:
    the GPU processes, the caller's user and ancestry."""

    grace: float
    kill_wait: float
    dry_run: bool
    proc: Path
    found: ProcessSurvey
    uid: int
    ancestry: tuple[ProcessStat, ...]
    devices: str

    @classmethod
    def of(cls, options: StopOptions, *, force: bool, hint: str) -> _Stopping:
        """The options with their defaults; raises ``ValueError`` for a negative time and
        ``CleanupError`` without ``/proc`` (or NVML unless ``force``; ``hint`` says what
        to do then)."""
        grace, kill_wait = options.get("grace", 10.0), options.get("kill_wait", 5.0)
        _check_times(grace, kill_wait)
        proc = options.get("proc", PROC)
        survey, uid, files = options.get("survey"), options.get("uid"), options.get("device_files")
        return cls(
            grace=grace,
            kill_wait=kill_wait,
            dry_run=options.get("dry_run", False),
            proc=proc,
            found=_survey(force, proc, hint) if survey is None else survey,
            uid=os.getuid() if uid is None else uid,
            ancestry=lineage(os.getpid(), proc),
            devices=DEVICE_FILES if files is None else files,
        )

    def check(self, pid: int, force: bool) -> ProcessStat | Outcome:
        """The checks of this module's docstring for ``pid``."""
        return _check(pid, self.found, self.uid, self.ancestry, force, self.proc, self.devices)

    def carry_out(self, checked: Sequence[ProcessStat | Outcome]) -> StopReport:
        """Signal the checked processes (unless one was refused, or a dry run)."""
        return _carry_out(checked, self.grace, self.kill_wait, self.dry_run, self.proc)


def stop_processes(
    pids: Sequence[int], *, force: bool = False, **options: Unpack[StopOptions]
) -> StopReport:
    """Stop the processes ``pids``: SIGTERM, then SIGKILL to those alive ``grace`` s later.

    The checks of this module's docstring run first for every PID; if one refuses, no
    signal is sent. ``options`` are those of `StopOptions`. Raises ``CleanupError``
    without ``/proc``, or without NVML unless ``force``, and ``ValueError`` for a PID below
    1 or a negative time.
    """
    bad = [pid for pid in pids if not is_whole(pid, 1)]
    if bad:
        raise ValueError(
            f"PIDs {bad!r} were given; a PID is a whole number >= 1 (0 and negative numbers "
            "would signal process groups). HINT: `marquardt-devices --processes` lists the PIDs"
        )
    hint = "--force stops processes of yours without asking NVML"
    stopping = _Stopping.of(options, force=force, hint=hint)
    return stopping.carry_out([stopping.check(pid, force) for pid in dict.fromkeys(pids)])


def stop_orphans(**options: Unpack[StopOptions]) -> StopReport:
    """Stop the caller's orphaned GPU processes, as ``stop_processes`` stops a PID.

    The orphans are the compute processes NVML lists whose parent is gone (see
    ``_proc.is_orphan``). Those of other users, and this command's own ancestors, are
    reported as ``left`` and not touched; the caller's own go through every check.
    """
    hint = "find the PIDs with `ps` and stop them with --stop PID --force"
    stopping = _Stopping.of(options, force=False, hint=hint)
    found, uid = stopping.found, stopping.uid
    ancestry = stopping.ancestry
    mine = {a.pid for a in ancestry}
    checked: list[ProcessStat | Outcome] = []
    for pid in dict.fromkeys(p.pid for p in found.processes if p.orphan):
        entry = found.find(pid)[0]
        stat = entry.process
        if stat is not None and stat.uid != uid:
            checked.append(
                Outcome(pid, stat.command, "left", f"left running: {entry.user}'s orphan")
            )
        elif pid in mine:
            checked.append(
                Outcome(pid, entry.command, "left", "left running: an ancestor of this command")
            )
        else:
            checked.append(stopping.check(pid, False))
    return stopping.carry_out(checked)
