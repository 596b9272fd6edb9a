"""``marquardt-devices --processes | --stop PID… | --stop-orphans``: GPU processes, ended.

What ``nvidia-smi`` (or ``nvitop``) and ``kill`` do by hand after a failed run: list the
compute processes of every GPU with their owner, parent and command, and end the caller's
own (SIGTERM, a grace period, SIGKILL), refusing other users' processes, this command's
ancestors, and PIDs NVML does not list on a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys

from ._errors import CleanupError, NvmlError
from ._proc import available
from ._processes import ComputeProcess, ProcessSurvey, gpu_processes
from ._stop import StopReport, stop_orphans, stop_processes

MiB = 1 << 20
DEFAULT_GRACE = 10.0
COMMAND_WIDTH = 160  # of the command column of --processes; /proc/PID/cmdline has it all


def _pid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a PID (a whole number >= 1; 0 and negative numbers would "
            "signal process groups)"
        )
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The clean-up options, in their own group of ``parser``."""
    group = parser.add_argument_group(
        "GPU processes",
        "List the compute processes of every GPU, and end your own: SIGTERM, then SIGKILL "
        "after the grace period. Other users' processes, this command's ancestors and PIDs "
        "NVML does not list on a GPU are refused, and then nothing is signalled.",
    )
    mode = group.add_mutually_exclusive_group()
    mode.add_argument(
        "--processes", action="store_true",
        help="list every compute process per GPU: PID, user, GPU memory, parent, orphan, command",
    )  # fmt: skip
    mode.add_argument(
        "--stop", nargs="+", type=_pid, metavar="PID", help="end these processes of yours"
    )
    mode.add_argument(
        "--stop-orphans", action="store_true",
        help="end your GPU processes whose parent is gone (see --processes)",
    )  # fmt: skip
    group.add_argument(
        "--grace", type=float, metavar="SECONDS",
        help=f"seconds between SIGTERM and SIGKILL ({DEFAULT_GRACE:g})",
    )  # fmt: skip
    group.add_argument(
        "--force", action="store_true",
        help="with --stop: also end processes of yours that NVML does not list on a GPU",
    )  # fmt: skip
    group.add_argument("--dry-run", action="store_true", help="check and report, send no signal")


def wanted(args: argparse.Namespace) -> bool:
    """Whether the command line asks for one of the clean-up commands."""
    return bool(args.processes or args.stop or args.stop_orphans)


def check_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse options that belong to another command (exit 2 through ``parser.error``)."""
    stopping = bool(args.stop or args.stop_orphans)
    if not stopping:
        for flag, given in (
            ("--grace", args.grace is not None),
            ("--force", args.force),
            ("--dry-run", args.dry_run),
        ):
            if given:
                parser.error(f"{flag} goes with --stop or --stop-orphans")
    if args.force and args.stop_orphans:
        parser.error("--force goes with --stop: --stop-orphans ends only GPU processes")
    if wanted(args) and (args.params is not None or args.env):
        parser.error("--processes, --stop and --stop-orphans do not combine with --params or --env")


def _one_line(text: str) -> str:
    """``text`` with newlines and other control characters escaped (``\\n``), for tables."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _row(process: ComputeProcess) -> str:
    stat = process.process
    memory = "-" if process.used_memory is None else f"{process.used_memory / MiB:.0f}"
    orphan = {None: "?", True: "yes", False: "no"}[process.orphan]
    ppid = "-" if stat is None else str(stat.ppid)
    instance = f"{process.instance_uuid}  " if process.instance_uuid else ""
    command = process.command if stat is not None else f"{process.command} (not readable here)"
    return (
        f"  {process.pid:>8}  {(process.user or '?')[:12]:<12} {memory:>8}  {process.kind:<4} "
        f"{ppid:>8}  {orphan:<6}  {instance}{_short(command, COMMAND_WIDTH)}"
    )


def listing(found: ProcessSurvey, uid: int) -> list[str]:
    """The ``--processes`` report: per GPU, one row per compute process, then a summary."""
    if not found.nvml_available:
        return [f"{note}; no GPU process to list." for note in found.notes]
    lines: list[str] = []
    for gpu in found.gpus:
        count = len(gpu.processes)
        what = f"{count} compute process(es)" if count else "no compute process"
        lines.append(f"GPU {gpu.index}  {gpu.uuid}  {gpu.name}: {what}")
        if gpu.note:
            lines.append(f"  note: {gpu.note}")
        if gpu.processes:
            lines.append(
                f"  {'pid':>8}  {'user':<12} {'GPU MiB':>8}  kind {'ppid':>8}  orphan  command"
            )
            lines.extend(_row(process) for process in gpu.processes)
    processes = {p.pid: p for p in found.processes}
    busy = sum(1 for gpu in found.gpus if gpu.processes)
    summary = f"{len(processes)} compute process(es) on {busy} of {len(found.gpus)} GPU(s)"
    orphans = [p for p in processes.values() if p.orphan]
    mine = [p for p in orphans if p.process is not None and p.process.uid == uid]
    if orphans:
        summary += f"; {len(orphans)} orphan(s), {len(mine)} of them yours"
    lines.append(summary + ".")
    if mine:
        lines.append("`marquardt-devices --stop-orphans --dry-run` shows what --stop-orphans ends.")
    lines.extend(f"note: {note}." for note in found.notes)
    return lines


def _short(command: str, width: int = 60) -> str:
    command = _one_line(command)
    return command if len(command) <= width else command[: width - 3] + "..."


def report_lines(report: StopReport, dry_run: bool) -> list[str]:
    """One line per PID: what happened to it, or would in a dry run."""
    if not report.outcomes:
        return ["no orphaned compute process on any GPU: nothing to stop."]
    lines = [f"PID {o.pid} ({_short(o.command)}): {o.detail}" for o in report.outcomes]
    if dry_run:
        lines.append("dry run: no signal was sent.")
    return lines


def run(args: argparse.Namespace) -> int:
    """Run the clean-up command ``args`` asks for; return the exit status."""
    prog = "marquardt-devices"
    try:
        if args.processes:
            if not available():
                raise CleanupError(
                    "listing GPU processes reads /proc, which this system does not have. "
                    "HINT: the clean-up commands work on Linux; elsewhere use nvidia-smi"
                )
            print("\n".join(listing(gpu_processes(), os.getuid())))
            return 0
        grace = DEFAULT_GRACE if args.grace is None else args.grace
        if args.stop:
            report = stop_processes(args.stop, grace=grace, force=args.force, dry_run=args.dry_run)
        else:
            report = stop_orphans(grace=grace, dry_run=args.dry_run)
    except (NvmlError, CleanupError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    print("\n".join(report_lines(report, args.dry_run)))
    refused = [o.pid for o in report.outcomes if o.status == "refused"]
    if refused:
        print(
            f"{prog}: refused PID(s) {', '.join(map(str, refused))}; no signal was sent to any "
            "PID.",
            file=sys.stderr,
        )
    return 0 if report.ok else 1
