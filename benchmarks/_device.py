"""What an LM step costs the device beyond time: peak GPU memory and what is left after
the optimizer is deleted, the host synchronisations in one step, and the largest batch
whose whole Jacobian the planner fits. ``bench_scale.py``'s
device path measures them (``--device cuda``); each comes with its rows.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import _common as c
import _versus as v
import torch
from _quality_trace import side as quality_side
from _rows import Row, row

from marquardt.testing.problems import sinc

MIB = 2**20
TARGET_MEMORY = 1.0
#: The seed's network, on whose loop the synchronisations are counted.
SYNC_HIDDEN = 64


def largest_batch(
    params: int, device: torch.device, clip: int | None
) -> tuple[int, list[str], str]:
    """The largest N whose whole float32 J (explicit strategy) the planner fits on ``device``.

    Bisected on ``marquardt.devices.plan(params, N, strategy="explicit").fits``, with the
    device's free memory as NVML reports it now (the host's for ``cpu``). Returns N, the
    plan's explanation at that N, and a note when ``clip`` lowered it.
    """
    from marquardt.devices import discover_gpus, plan

    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        gpus = [g for g in discover_gpus() if g.ordinal == index]
        if not gpus:
            raise RuntimeError(f"NVML lists no GPU with ordinal {index} for {device}")
    else:
        gpus = []

    def fits(n: int) -> bool:
        return plan(params, n, 1, "float32", gpus, strategy="explicit").fits

    if not fits(1):
        return 0, list(plan(params, 1, 1, "float32", gpus, strategy="explicit").lines), ""
    lo, hi = 1, max(2, params)
    while fits(hi) and hi < 2**31:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    note = ""
    if clip is not None and lo > clip:
        lo, note = clip, f"the planner's {lo:,} clipped to {clip:,} on this device"
    return lo, list(plan(params, lo, 1, "float32", gpus, strategy="explicit").lines), note


def gpu_memory(
    make: Callable[[Sequence[int], torch.device], tuple[v.Step, Any]],
    widths: Sequence[int],
    device: torch.device,
    x: torch.Tensor,
    y: torch.Tensor,
) -> dict[str, Any]:
    """Peak GPU memory of building one side and one step, and what is left once deleted."""
    v.release(device)
    base = torch.cuda.memory_allocated(device)
    reserved_before = torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    peak: int | None = None
    seconds: float | None = None
    error = ""
    try:
        step, owner = make(widths, device)
        c.synchronize(device)
        start = time.perf_counter()
        step(x, y)
        c.synchronize(device)
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated(device) - base
        del step, owner
    except Exception as exc:  # out of memory included: the result says so
        error = v.describe_error(exc)
    v.release(device)
    after = torch.cuda.memory_allocated(device)
    return {
        "base_bytes": base,
        "peak_bytes": peak,
        "after_delete_bytes": after,
        "leftover_bytes": after - base,
        "reserved_before_bytes": reserved_before,
        "reserved_after_empty_cache_bytes": torch.cuda.memory_reserved(device),
        "first_step_seconds": seconds,
        "error": error,
    }


def _site(w: warnings.WarningMessage) -> str:
    path = str(w.filename)
    for marker in ("site-packages/", "/src/", "/lib/python"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{w.lineno}"


def count_syncs(device: torch.device) -> dict[str, Any]:
    """Host synchronisations in one LM step of each side (after a warm-up step) on the seed's
    loop (``_quality_trace``'s), counted by torch's sync debug mode; CUDA only."""
    if device.type != "cuda":
        return {"note": f"counted on CUDA only (device {device})"}
    x_all, y_all = sinc()
    batches = c.shuffled_batches(x_all, y_all, c.BATCH)
    out: dict[str, Any] = {}
    for kind in ("ours", "peer"):
        try:
            step, _model = quality_side(kind, c.sinc_model(SYNC_HIDDEN).to(device), device, None)
            x, y = (t.to(device) for t in next(batches))
            step(x, y)
            x, y = (t.to(device) for t in next(batches))
            torch.cuda.synchronize(device)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    step(x, y)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs = [w for w in caught if "synchroniz" in str(w.message)]
            sites = Counter(_site(w) for w in syncs)
            out[kind] = {"count": len(syncs), "sites": dict(sites.most_common(12))}
        except Exception as exc:
            out[kind] = {"count": None, "error": v.describe_error(exc)}
        v.release(device)
    return out


def warm(device: torch.device) -> None:
    """Create the cuBLAS and cuSOLVER handles before any memory baseline is taken."""
    a = torch.randn(64, 64, device=device)
    (a @ a.T).sum().item()
    spd = (a @ a.T).double() + 64 * torch.eye(64, dtype=torch.float64, device=device)
    torch.linalg.cholesky(spd).sum().item()
    v.release(device)


# -- their rows ----------------------------------------------------------------------------
def _mib(value: float | None) -> str:
    return "—" if value is None else f"{value / MIB:,.0f} MiB"


def memory_rows(label: str, memory: dict[str, Any]) -> list[Row]:
    """Peak GPU memory of ours over the peer's, and what ours left after its deletion."""
    mo, mp = memory["ours"], memory["peer"]
    ratio = (
        None
        if mo["peak_bytes"] is None or mp["peak_bytes"] is None
        else mo["peak_bytes"] / max(mp["peak_bytes"], 1)
    )
    return [
        row(
            f"{label}: peak GPU memory ours / peer",
            ratio,
            TARGET_MEMORY,
            detail=f"ours {_mib(mo['peak_bytes'])}{' ' + mo['error'] if mo['error'] else ''}, "
            f"peer {_mib(mp['peak_bytes'])}{' ' + mp['error'] if mp['error'] else ''} "
            "(build + one step, over the memory allocated before)",
        ),
        row(
            f"{label}: GPU memory left after deleting ours",
            mo["leftover_bytes"] / MIB,
            0.0,
            unit=" MiB",
            detail=f"{mo['leftover_bytes']:,} bytes over the baseline of "
            f"{_mib(mo['base_bytes'])} (peer: {mp['leftover_bytes']:,} bytes)",
        ),
    ]


def memory_cell(memory: dict[str, Any] | None) -> str:
    """Both sides' peak GPU memory and what ours left, for a table's cell."""
    if not memory:
        return "—"
    peaks = " / ".join(
        f"failed ({memory[k]['error'][:60]})"
        if memory[k]["error"]
        else _mib(memory[k]["peak_bytes"])
        for k in ("ours", "peer")
    )
    return f"{peaks}; {memory['ours']['leftover_bytes']:,} B left"


def sync_rows(syncs: dict[str, Any]) -> list[Row]:
    """Our host synchronisations in one step (information; the peer's in the detail)."""
    if "ours" not in syncs:
        return []
    peer = syncs.get("peer", {}).get("count")
    return [
        row(
            f"host synchronisations in one step of ours (1-{SYNC_HIDDEN}-1)",
            syncs["ours"].get("count"),
            None,
            unit="",
            detail=f"peer {peer if peer is not None else '—'}; "
            + (syncs["ours"].get("error") or "sites in the JSON"),
        )
    ]


def sync_lines(syncs: dict[str, Any]) -> list[str]:
    """Each side's count and where the synchronisations happen, as Markdown lines."""
    if "note" in syncs:
        return [syncs["note"] + "."]
    out = []
    for key in ("ours", "peer"):
        r = syncs.get(key, {})
        if r.get("count") is None:
            out.append(f"- {key}: failed: {r.get('error', 'not run')}")
            continue
        sites = ", ".join(f"`{k}` ×{n}" for k, n in r.get("sites", {}).items())
        out.append(f"- {key}: {r['count']} ({sites or 'none'})")
    return out
