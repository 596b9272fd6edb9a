"""The planner's arithmetic, checked against values worked out by hand."""

from __future__ import annotations

from typing import Any

import pytest

from marquardt.devices import GpuInfo, plan
from marquardt.devices._memory import HostMemory, host_memory

GiB = 1 << 30
USABLE_16G = 16 * GiB * 0.8  # free x (1 - headroom) = 13743895347.2 bytes


def gpu(ordinal: int, free: int = 16 * GiB) -> GpuInfo:
    return GpuInfo(
        ordinal=ordinal, index=ordinal, uuid=f"GPU-{ordinal}", name="Test GPU",
        memory_total=16 * GiB, memory_used=16 * GiB - free, memory_free=free,
        utilization_gpu=0, utilization_memory=0, mig_mode=None, pci_bus_id="0",
    )  # fmt: skip


def test_sinc_model_on_four_gpus() -> None:
    # P = 769, N = 100000: R >= P, so accumulate; the solver holds 2 x 769^2 x 8 + 3 x 769 x 8.
    result = plan(769, 100_000, gpus=[gpu(i) for i in range(4)])
    assert result.strategy == "accumulate" and result.backend == "cupynumeric"
    assert result.rows == 100_000
    assert result.solver_bytes == 9_480_232
    assert result.jacobian_bytes == 100_000 * 769 * 4
    assert result.normal_bytes == 769 * 769 * 8
    assert result.legate_gpus == 1  # 9 MiB fits one GPU
    assert result.model_devices == ("cuda:1", "cuda:2", "cuda:3")
    # Memory allows 1488856 samples per slice, N // D = 33333 keeps all three busy.
    assert result.slice_size == 33_333
    assert result.fbmem_mib == 13_107  # 12.8 GiB usable in MiB
    # Only the reduced JtJ, Jtr and delta cross the host: 769^2 x 8 + 2 x 769 x 8 = 4743192 B,
    # x 1.25 = 5.65 MiB, below the 256 MiB floor.
    assert result.sysmem_mib == 256
    assert result.fits
    assert result.command("train.py") == (
        "legate --gpus 1 --fbmem 13107 --sysmem 256 train.py --slice-size 33333"
    )


def test_wide_model_needs_two_gpus_for_j() -> None:
    # P = 2e6 > R = 2000: explicit; J is 16 GB, more than one GPU's 12.8 GiB usable.
    result = plan(2_000_000, 2000, gpus=[gpu(i) for i in range(4)])
    assert result.strategy == "explicit"
    assert result.solver_bytes == 2000 * 2_000_000 * 4 + 2 * 2000**2 * 8 + 2_002_000 * 8
    assert result.solver_bytes > USABLE_16G and result.solver_bytes <= 2 * USABLE_16G
    assert result.legate_gpus == 2 and result.model_devices == ("cuda:2", "cuda:3")
    # A sample's slice costs 3 x 2e6 x 4 = 24 MB: 572 fit in 12.8 GiB, below N // D = 1000.
    assert result.slice_size == 572
    # 2 slices in flight on each of 2 model GPUs: 4 x 572 x (2e6 + 1) x 4 + 2e6 x 8 =
    # 18320009152 B, x 1.25 = 22900011440 B = 21839.15 MiB -> 21840.
    assert result.sysmem_mib == 21_840
    assert result.fits
    text = result.explain()
    assert "K = 2" in text and "slice_size = min(572, N // D = 2000 // 2 = 1000) = 572" in text


def test_busy_first_gpu_limits_every_share() -> None:
    # Legate splits its 4.02 GB evenly: cuda:0, with 1.6 GiB usable, cannot hold a half.
    busy = plan(1_000_000, 1000, gpus=[gpu(0, free=2 * GiB), gpu(1), gpu(2)], strategy="explicit")
    assert busy.strategy == "explicit" and busy.legate_gpus == 2 and not busy.fits
    assert "CUDA_VISIBLE_DEVICES" in busy.explain()
    assert busy.fbmem_mib == 1638  # the smallest Legate GPU's usable memory, in MiB
    # With a third idle GPU, 4.02 GB / 3 = 1.34 GB fits even on cuda:0.
    spread = plan(1_000_000, 1000, gpus=[gpu(0, free=2 * GiB), gpu(1), gpu(2), gpu(3)])
    assert spread.legate_gpus == 3 and spread.fits
    assert spread.model_devices == ("cuda:3",)


def test_too_big_says_so() -> None:
    result = plan(
        100_000, 1_000_000, gpus=[gpu(0, free=GiB), gpu(1, free=GiB)], strategy="accumulate"
    )
    assert result.strategy == "accumulate"
    assert result.legate_gpus == 1  # as many as can be spared
    assert not result.fits
    assert "does NOT fit" in result.explain() and "HINT:" in result.explain()


def test_one_gpu_shares_it_with_the_solver() -> None:
    result = plan(769, 100_000, gpus=[gpu(0)])
    assert (result.legate_gpus, result.backend) == (0, "torch")
    assert result.model_devices == ("cuda:0",)
    assert result.slice_size == 100_000
    assert result.command() == "python script.py --slice-size 100000"
    assert result.fbmem_mib is None


def test_no_gpu_plans_numpy_in_ram() -> None:
    host = HostMemory(8 * GiB, "test")
    result = plan(769, 100_000, gpus=[], host=host)
    assert (result.backend, result.legate_gpus, result.model_devices) == ("numpy", 0, ("cpu",))
    assert result.slice_size == 100_000  # memory would allow 743144
    assert "at most 743144 samples" in result.explain()
    assert "8.00 GiB available (test), 6.40 GiB usable" in result.explain()
    assert result.fits


def test_no_gpu_too_little_ram() -> None:
    result = plan(50_000, 10, gpus=[], host=HostMemory(GiB, "test"))
    # 10 x 50000 x 4 for J + 2 x 10^2 x 8: fits; one sample's slice needs 600 kB: fits.
    assert result.strategy == "explicit" and result.fits
    big = plan(200_000, 1_000_000, gpus=[], host=HostMemory(GiB, "test"), strategy="accumulate")
    assert not big.fits  # JtJ alone is 2 x 200000^2 x 8 bytes


def test_matrix_free_past_the_dense_wall() -> None:
    # P = 200,000, N = 1e6 in 1 GiB: neither JtJ (320 GB) nor J fits; the matrix-free step
    # needs P x (2 x 4 + 8) + 76 x P x 8 = 124.8 MB: it is recommended, not subsets.
    result = plan(200_000, 1_000_000, gpus=[], host=HostMemory(GiB, "test"))
    assert (result.strategy, result.params_per_step, result.fits) == ("matrix_free", None, True)
    assert result.solver_bytes == 76 * 8 * 200_000
    assert result.command("train.py") == (
        "python train.py --slice-size 1000000 --strategy matrix_free"
    )
    assert "the dense step does not fit" in result.explain()
    assert result.step_seconds is not None and result.step_seconds > 0
    on_gpu = plan(200_000, 1_000_000, gpus=[gpu(0, free=GiB)])
    assert on_gpu.strategy == "matrix_free" and on_gpu.backend == "torch"
    assert on_gpu.model_devices == ("cuda:0",) and on_gpu.legate_gpus == 0


def test_subsets_when_neither_strategy_nor_matrix_free_fits() -> None:
    # P = 2e6 in 1 GiB: the matrix-free step needs 2e6 x 624 = 1.2 GB > 858993459.2 B usable.
    # theta, backup, delta: 2e6 x 16 = 32 MB; half the rest / 24 -> isqrt 4150 -> 4096.
    result = plan(2_000_000, 1_000_000, gpus=[], host=HostMemory(GiB, "test"))
    assert (result.strategy, result.params_per_step, result.backend) == ("subsets", 4096, "numpy")
    assert result.solver_bytes == 24 * 4096**2 and result.fits
    assert result.command("train.py").endswith("--params-per-step 4096")
    text = result.explain()
    assert "neither strategy fits" in text and "k = 4096 (a multiple of 64)" in text
    on_gpu = plan(2_000_000, 1_000_000, gpus=[gpu(0, free=GiB)])
    assert on_gpu.strategy == "subsets" and on_gpu.backend == "torch"
    assert on_gpu.params_per_step == 4096 and on_gpu.model_devices == ("cuda:0",)
    # Nothing fits: not even the parameters.
    hopeless = plan(200_000_000, 10, gpus=[], host=HostMemory(GiB, "test"))
    assert hopeless.params_per_step == 0 and not hopeless.fits


def test_forced_choices() -> None:
    gpus = [gpu(i) for i in range(4)]
    assert plan(769, 100_000, gpus=gpus, legate_gpus=2).model_devices == ("cuda:2", "cuda:3")
    forced = plan(769, 100_000, gpus=gpus, strategy="explicit")
    assert forced.strategy == "explicit" and "forced" in forced.explain()
    assert plan(769, 100_000, outputs=3, dtype="float64", gpus=gpus).rows == 300_000


def test_torch_dtype_is_accepted() -> None:
    import torch

    result = plan(10, 100, dtype=torch.float64, gpus=[], host=HostMemory(GiB, "t"))
    assert result.dtype == "float64" and result.jacobian_bytes == 100 * 10 * 8


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"params": 0}, "params=0"),
        ({"batch": -5}, "batch=-5"),
        ({"outputs": 1.5}, "outputs=1.5"),
        ({"dtype": "int8"}, "dtype='int8'"),
        ({"headroom": 1.0}, "headroom=1.0"),
        ({"strategy": "magic"}, "strategy='magic'"),
        ({"legate_gpus": 2}, "legate_gpus=2 was given but 2 GPU"),
    ],
)
def test_bad_input_is_named(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"params": 10, "batch": 10, "gpus": [gpu(0), gpu(1)]}
    args.update(kwargs)
    with pytest.raises(ValueError, match=r"HINT: ") as info:
        plan(**args)
    assert message in str(info.value)


def test_host_memory_reads_meminfo(tmp_path: Any) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  2048 kB\nMemFree:  1024 kB\nMemAvailable:  1536 kB\n")
    assert host_memory(str(meminfo)) == HostMemory(1536 * 1024, f"MemAvailable in {meminfo}")
    fallback = host_memory(str(tmp_path / "missing"))
    assert fallback.available > 0 and "sysconf" in fallback.source


def test_sysmem_for_accumulate_is_the_reduced_jtj_only(four_gpus_nvml: Any) -> None:
    # Four idle 40 GiB GPUs from the fake NVML; P = 20000, N = 100000: accumulate, and the
    # solver holds 2 x 20000^2 x 8 + 3 x 20000 x 8 = 6400480000 B (5.96 GiB): K = 1.
    result = plan(20_000, 100_000)
    assert (result.strategy, result.legate_gpus, result.slice_size) == ("accumulate", 1, 33_333)
    assert result.solver_bytes == 6_400_480_000
    # Host staging per step: JtJ and Jtr reduced on the first model GPU, copied once in
    # float64, and delta back: 20000^2 x 8 + 2 x 20000 x 8 = 3200320000 B; x 1.25 =
    # 4000400000 B = 3815.08 MiB -> 3816 MiB. (The old rule, 2 x 3 x (slice J 33333 x
    # 20000 x 4 + JtJ part 20000^2 x 8) = 35199840000 B, asked for 33570 MiB.)
    assert result.sysmem_mib == 3816
    line = next(x for x in result.explain().splitlines() if x.startswith("--sysmem"))
    assert "20000^2 x 8 + 2 x 20000 x 8 = 2.98 GiB" in line
    assert "no slice of J" in line and "25% margin = 3.73 GiB" in line
    assert "--sysmem 3816 " in result.command()


def test_sysmem_for_explicit_counts_slices_in_flight(four_gpus_nvml: Any) -> None:
    # P = 2e6, N = 2000: explicit; J is 16e9 B, within one 40 GiB GPU's 32 GiB usable: K = 1,
    # three model GPUs. A sample's slice costs 3 x 2e6 x 4 = 24e6 B: 1431 fit, N // 3 = 666.
    result = plan(2_000_000, 2000)
    assert (result.strategy, result.legate_gpus, result.slice_size) == ("explicit", 1, 666)
    # 2 slices in flight x 3 model GPUs, each J_s and r_s: 6 x 666 x (2e6 + 1) x 4, and delta
    # 2e6 x 8: 31984015984 B; x 1.25 = 39980019980 B = 38127.92 MiB -> 38128 MiB.
    assert result.sysmem_mib == 38_128
    assert "6 x 666 x (2000000 + 1) x 4 + 2000000 x 8" in result.explain()
