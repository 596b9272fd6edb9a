"""CUDA_VISIBLE_DEVICES in every form, matched against the GPUs present."""

from __future__ import annotations

import pytest

from marquardt.devices._visible import PhysicalGpu, parse_visible, resolve_visible

GPUS = [
    PhysicalGpu(0, "GPU-0a1b2c3d-0000"),
    PhysicalGpu(1, "GPU-0a1bffff-1111"),
    PhysicalGpu(2, "GPU-77777777-2222"),
    PhysicalGpu(3, "GPU-88888888-3333", mig_enabled=True, mig_uuids=("MIG-aaaa-1", "MIG-bbbb-2")),
]


def ordinals(raw: str | None) -> list[tuple[int, str | None]]:
    res = resolve_visible(parse_visible(raw), GPUS)
    assert [d.ordinal for d in res.devices] == list(range(len(res.devices)))
    return [(d.gpu_index, d.mig_uuid) for d in res.devices]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, [(0, None), (1, None), (2, None), (3, "MIG-aaaa-1"), (3, "MIG-bbbb-2")]),
        ("", []),
        ("-1", []),
        ("  ", []),
        ("2,0", [(2, None), (0, None)]),
        (" 1 , 2 ", [(1, None), (2, None)]),
        ("1gpu,2ampere", [(1, None), (2, None)]),  # read like strtoul
        ("0,x,1", [(0, None)]),  # an invalid entry ends the list
        ("0,-1,1", [(0, None)]),
        ("0,9,1", [(0, None)]),  # an index past the last GPU ends the list
        ("0,1,0", []),  # a repeated index hides every GPU
        ("3", [(3, "MIG-aaaa-1"), (3, "MIG-bbbb-2")]),  # a MIG-mode GPU shows its instances
        ("GPU-7777,GPU-0a1b2", [(2, None), (0, None)]),  # unique prefixes
        ("GPU-77777777-2222", [(2, None)]),
        ("GPU-0a1b,GPU-7777", []),  # ambiguous first prefix: nothing
        ("GPU-7777,GPU-0a1b", [(2, None)]),  # ambiguous later prefix ends the list
        ("GPU-7777,1", [(2, None)]),  # mixing forms ends the list
        ("GPU-7777,GPU-77777777", []),  # the same GPU twice
        ("GPU-dead", []),
        ("MIG-bbbb", [(3, "MIG-bbbb-2")]),
        ("MIG-bbbb-2,MIG-aaaa-1", [(3, "MIG-bbbb-2"), (3, "MIG-aaaa-1")]),
        ("MIG-zzzz", []),
    ],
)
def test_visible_forms(raw: str | None, expected: list[tuple[int, str | None]]) -> None:
    assert ordinals(raw) == expected


def test_notes_say_why_the_list_ended() -> None:
    assert "'x'" in resolve_visible(parse_visible("0,x"), GPUS).note
    assert "no GPU (there are 4)" in resolve_visible(parse_visible("0,7"), GPUS).note
    assert "ambiguous" in resolve_visible(parse_visible("GPU-0a1b"), GPUS).note
    assert "repeated" in resolve_visible(parse_visible("1,1"), GPUS).note
    # Hiding every GPU on purpose is no anomaly worth a note.
    assert resolve_visible(parse_visible("-1"), GPUS).note == ""
    assert resolve_visible(parse_visible("0,1"), GPUS).note == ""


def test_parse_keeps_the_kind() -> None:
    assert parse_visible(None).kind == "all"
    assert parse_visible("GPU-1,GPU-2").kind == "uuids"
    assert parse_visible("MIG-1").kind == "mig"
    assert parse_visible("3,1").entries == ("3", "1")


def test_mig_gpu_without_instances_shows_nothing() -> None:
    gpus = [PhysicalGpu(0, "GPU-1", mig_enabled=True), PhysicalGpu(1, "GPU-2")]
    res = resolve_visible(parse_visible(None), gpus)
    assert [(d.gpu_index, d.mig_uuid) for d in res.devices] == [(1, None)]
