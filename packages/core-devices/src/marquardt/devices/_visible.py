"""``CUDA_VISIBLE_DEVICES``: which physical GPUs become CUDA ordinals 0, 1, 2, … and in what order.

The rules follow the CUDA runtime (and PyTorch's NVML-based device count, which mirrors it):

* unset: every GPU, in enumeration order;
* empty, or a first entry of ``-1``: no GPU at all;
* ``0,2``: indices, read like ``strtoul`` (``1gpu`` is ``1``); the first entry that is not a
  non-negative number, or names no GPU, ends the list;
* ``GPU-8932f937,GPU-d4a…``: UUIDs or prefixes of them, each matching exactly one GPU;
  the first entry without the prefix, or matching none or several, ends the list;
* ``MIG-…``: MIG instances by UUID (or unique prefix), with the same rule;
* a repeated device hides every GPU.

A GPU in MIG mode is not a CUDA device itself: its MIG instances are, one ordinal each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Kind = Literal["all", "indices", "uuids", "mig"]


@dataclass(frozen=True)
class VisibleSpec:
    """``CUDA_VISIBLE_DEVICES`` parsed, before it is matched against the GPUs present."""

    raw: str | None
    kind: Kind
    entries: tuple[str, ...]
    note: str = ""


@dataclass(frozen=True)
class PhysicalGpu:
    """What matching needs from NVML about one physical GPU."""

    index: int
    uuid: str
    mig_enabled: bool = False
    mig_uuids: tuple[str, ...] = ()


@dataclass(frozen=True)
class VisibleDevice:
    """CUDA ordinal ``ordinal`` is GPU ``gpu_index`` (NVML), or its MIG instance ``mig_uuid``."""

    ordinal: int
    gpu_index: int
    mig_uuid: str | None = None


@dataclass(frozen=True)
class Resolution:
    """The visible devices, in CUDA order, and why the list ended early (``""`` if it did not)."""

    devices: tuple[VisibleDevice, ...]
    note: str = ""


def _leading_number(text: str) -> int | None:
    """The integer ``text`` starts with, as ``strtoul`` reads it (``None`` if none)."""
    sign = ""
    digits = text
    if text[:1] and text[:1] in "+-":
        sign, digits = text[0], text[1:]
    count = 0
    while count < len(digits) and digits[count].isdigit():
        count += 1
    return int(sign + digits[:count]) if count else None


def parse_visible(raw: str | None) -> VisibleSpec:
    """Parse ``CUDA_VISIBLE_DEVICES`` (``None`` = unset) into indices, UUIDs or MIG ids."""
    if raw is None:
        return VisibleSpec(raw, "all", ())
    items = [item.strip() for item in raw.split(",")]
    first = items[0]
    if first.startswith(("GPU-", "MIG-")):
        prefix = first[:4]
        kind: Kind = "uuids" if prefix == "GPU-" else "mig"
        kept: list[str] = []
        for item in items:
            if not item.startswith(prefix):
                return VisibleSpec(raw, kind, tuple(kept), _stop_note(item, "lacks " + prefix))
            if item in kept:
                return VisibleSpec(raw, kind, (), f"{item!r} is repeated, which hides every GPU")
            kept.append(item)
        return VisibleSpec(raw, kind, tuple(kept))
    numbers: list[str] = []
    for item in items:
        number = _leading_number(item)
        if number is None or number < 0:
            note = "" if item in {"", "-1"} and not numbers else _stop_note(item, "is no index")
            return VisibleSpec(raw, "indices", tuple(numbers), note)
        if str(number) in numbers:
            return VisibleSpec(raw, "indices", (), f"{number} is repeated, which hides every GPU")
        numbers.append(str(number))
    return VisibleSpec(raw, "indices", tuple(numbers))


def _stop_note(item: str, why: str) -> str:
    return f"entry {item!r} {why}, so CUDA ignores it and every entry after it"


def _expand(gpu: PhysicalGpu) -> list[tuple[int, str | None]]:
    # A GPU in MIG mode shows CUDA only its MIG instances (none if none are configured).
    if gpu.mig_enabled:
        return [(gpu.index, mig) for mig in gpu.mig_uuids]
    return [(gpu.index, None)]


def _unique_match(candidate: str, names: Sequence[str]) -> tuple[int | None, str]:
    hits = [i for i, name in enumerate(names) if name.lower().startswith(candidate.lower())]
    if len(hits) == 1:
        return hits[0], ""
    why = "matches no device" if not hits else f"matches {len(hits)} devices (ambiguous prefix)"
    return None, _stop_note(candidate, why)


def resolve_visible(spec: VisibleSpec, gpus: Sequence[PhysicalGpu]) -> Resolution:
    """Match ``spec`` against the GPUs NVML lists (in NVML index order)."""
    chosen: list[tuple[int, str | None]] = []
    note = spec.note
    if spec.kind == "all":
        for gpu in gpus:
            chosen.extend(_expand(gpu))
    elif spec.kind == "indices":
        for entry in spec.entries:
            index = int(entry)
            if index >= len(gpus):
                note = _stop_note(entry, f"names no GPU (there are {len(gpus)})")
                break
            chosen.extend(_expand(gpus[index]))
    elif spec.kind == "uuids":
        for entry in spec.entries:
            hit, why = _unique_match(entry, [g.uuid for g in gpus])
            if hit is None:
                note = why
                break
            if any(index == gpus[hit].index for index, _ in chosen):
                return Resolution((), f"{entry!r} names a GPU twice, which hides every GPU")
            chosen.extend(_expand(gpus[hit]))
    else:
        migs = [(g.index, m) for g in gpus for m in g.mig_uuids]
        for entry in spec.entries:
            hit, why = _unique_match(entry, [m for _, m in migs])
            if hit is None:
                note = why
                break
            if migs[hit] in chosen:
                return Resolution((), f"{entry!r} names a MIG instance twice, hiding every GPU")
            chosen.append(migs[hit])
    devices = tuple(
        VisibleDevice(ordinal, index, mig) for ordinal, (index, mig) in enumerate(chosen)
    )
    return Resolution(devices, note)
