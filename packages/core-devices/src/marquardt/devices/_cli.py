"""``marquardt-devices``: the GPUs of this machine, their split, and a plan for one LM step.

Exit status: 0 when the report was printed (also on a machine without GPU or NVML),
1 when NVML is present but failing or Legate's configuration is unreadable, 2 on bad
arguments. ``--threads PROCESSES`` prints the thread rule's count for that many processes
on this node (what the launch recipes export as ``OMP_NUM_THREADS``). The clean-up commands (``--processes``, ``--stop``, ``--stop-orphans``) live in
``_cli_cleanup``, with their own exit statuses.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import _cli_cleanup, _settings
from ._discovery import GpuInfo, Survey, survey
from ._errors import LegateConfigError, NvmlError
from ._plan_types import ITEMSIZE
from ._planner import plan
from ._split import Split, current_split
from ._threads import threads_per_process

GiB = 1 << 30


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="marquardt-devices",
        description=(
            "List the GPUs this process sees (through NVML, without touching CUDA), which of "
            "them Legate holds, and which are left for the model. With --params and --batch, "
            "plan one Levenberg-Marquardt step and print the command line to run it."
        ),
    )
    parser.add_argument("--params", type=int, help="number of model parameters P")
    parser.add_argument("--batch", type=int, help="samples per LM step N")
    parser.add_argument("--outputs", type=int, default=1, help="residuals per sample m (1)")
    parser.add_argument(
        "--dtype", default="float32", choices=sorted(ITEMSIZE), help="Jacobian dtype (float32)"
    )
    parser.add_argument("--legate-gpus", type=int, help="force Legate's GPU count K")
    parser.add_argument(
        "--headroom", type=float, default=0.2, help="fraction of free memory kept unused (0.2)"
    )
    parser.add_argument("--script", default="script.py", help="script named in the command")
    parser.add_argument("--env", action="store_true", help="list the environment variables read")
    parser.add_argument(
        "--threads",
        type=int,
        metavar="PROCESSES",
        help="print the threads each of PROCESSES processes on this node should run (the "
        "thread rule; OMP_NUM_THREADS wins), and on stderr where the count came from",
    )
    _cli_cleanup.add_arguments(parser)
    return parser


def _gib(nbytes: int) -> str:
    return f"{nbytes / GiB:.1f}"


def _table(split: Split) -> list[str]:
    header = (
        f"{'cuda':>4}  {'role':<6} {'name':<28} {'used/total GiB':>14} {'util':>5} "
        f"{'MIG':<4} {'PCI bus':<16} procs  uuid"
    )
    rows = [header]
    for gpu in split.visible:
        role = "legate" if gpu.ordinal in split.legate else "model"
        util = "-" if gpu.utilization_gpu is None else f"{gpu.utilization_gpu}%"
        mig = "inst" if gpu.is_mig else {None: "-", True: "on", False: "off"}[gpu.mig_mode]
        memory = f"{_gib(gpu.memory_used)}/{_gib(gpu.memory_total)}"
        rows.append(
            f"{gpu.ordinal:>4}  {role:<6} {gpu.name[:28]:<28} {memory:>14} {util:>5} "
            f"{mig:<4} {gpu.pci_bus_id[:16]:<16} {len(gpu.processes):>5}  {gpu.uuid}"
        )
    return rows


def _summary(split: Split) -> list[str]:
    share = split.share
    source = {
        "runtime": "the running Legate runtime",
        "LEGATE_CONFIG": f"LEGATE_CONFIG={_settings.legate_config()!r}",
        "none": "no running Legate and no --gpus in LEGATE_CONFIG",
    }[share.source]
    legate = ", ".join(f"cuda:{i}" for i in split.legate) or "none"
    model = ", ".join(f"cuda:{i}" for i in split.model) or "none (the model runs on cpu)"
    lines = [
        f"Legate holds {len(split.legate)} GPU(s) ({source}): {legate}",
        f"model devices (get_available_gpus): {model}",
    ]
    busy = [gpu for gpu in split.visible if gpu.busy]
    if busy:
        lines.append(
            "busy: " + ", ".join(f"cuda:{g.ordinal} ({len(g.processes)} proc)" for g in busy)
        )
    if share.note and split.visible:
        lines.append(f"note: {share.note}")
    return lines


def _report(found: Survey, split: Split) -> list[str]:
    place = _settings.process_place()
    lines = [f"{_settings.describe_visible()}; CUDA_DEVICE_ORDER={_settings.cuda_device_order()}"]
    if place.world_size is not None or place.rank is not None:
        lines.append(
            f"process: rank {place.rank}, local rank {place.local_rank}, world size "
            f"{place.world_size}"
            + (f", SLURM_JOB_GPUS={place.slurm_job_gpus}" if place.slurm_job_gpus else "")
        )
    if not found.gpus:
        lines.extend(f"{note}." for note in found.notes)
        lines.append("No GPU: the model side runs on the CPU (get_available_gpus() -> [cpu]).")
        return lines
    lines.extend(_table(split))
    lines.extend(_summary(split))
    lines.extend(f"note: {note}" for note in found.notes)
    return lines


def _plan_lines(args: argparse.Namespace, gpus: Sequence[GpuInfo]) -> list[str]:
    result = plan(
        args.params, args.batch, args.outputs, args.dtype, gpus,
        legate_gpus=args.legate_gpus, headroom=args.headroom,
    )  # fmt: skip
    lines = ["", f"Plan for P={args.params}, N={args.batch}, m={args.outputs}, {args.dtype}:"]
    lines.extend(f"  {line}" for line in result.explain().splitlines())
    devices = ", ".join(result.model_devices)
    subsets = (
        f", params_per_step={result.params_per_step}" if result.params_per_step is not None else ""
    )
    lines.append(
        f"Recommendation: strategy={result.strategy}{subsets}, backend={result.backend}, "
        f"Legate GPUs={result.legate_gpus}, model devices={devices}, "
        f"slice_size={result.slice_size}" + ("" if result.fits else " (does NOT fit)")
    )
    lines.append(f"  {result.command(args.script)}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with ``argv`` (``sys.argv[1:]`` by default); return the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if (args.params is None) != (args.batch is None):
        parser.error("--params and --batch go together: give both to plan, or neither to list")
    _cli_cleanup.check_arguments(args, parser)
    if _cli_cleanup.wanted(args):
        try:
            return _cli_cleanup.run(args)
        except ValueError as exc:
            parser.error(str(exc))
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads takes the number of processes on this node (>= 1)")
        choice = threads_per_process(args.threads, processes_from="--threads")
        print(choice.threads)
        print(f"marquardt-devices: {choice.describe()}", file=sys.stderr)
        return 0
    if args.env:
        for name, meaning in _settings.ENVIRONMENT.items():
            print(f"{name}: {meaning}")
        return 0
    try:
        found = survey()
        split = current_split(found.gpus)
        lines = _report(found, split)
        if args.params is not None:
            lines.extend(_plan_lines(args, found.gpus))
    except (NvmlError, LegateConfigError) as exc:
        print(f"marquardt-devices: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        parser.error(str(exc))
    print("\n".join(lines))
    return 0
