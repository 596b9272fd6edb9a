"""The marquardt-devices command: its table, its plan, its plain answers without GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from marquardt.devices._cli import main

SRC = str(Path(__file__).resolve().parents[1] / "src")


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_table_and_split(
    fake_nvml: Any, kit: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus = kit.four_gpus()
    gpus[3].procs, gpus[3].used, gpus[3].util = [(77, kit.GiB)], 5 * kit.GiB, (55, 10)
    fake_nvml(gpus)
    monkeypatch.setenv("LEGATE_CONFIG", "--gpus 3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    code, out, _ = run([], capsys)
    assert code == 0
    rows = [line for line in out.splitlines() if "NVIDIA A100" in line]
    assert len(rows) == 4
    assert [row.split()[1] for row in rows] == ["legate", "legate", "legate", "model"]
    assert "5.0/40.0" in rows[3] and "55%" in rows[3] and kit.uuid(3) in rows[3]
    assert "Legate holds 3 GPU(s) (LEGATE_CONFIG='--gpus 3'): cuda:0, cuda:1, cuda:2" in out
    assert "model devices (get_available_gpus): cuda:3" in out
    assert "busy: cuda:3 (1 proc)" in out


def test_plan_on_four_gpus(four_gpus_nvml: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--params", "769", "--batch", "100000", "--script", "train.py"], capsys)
    assert code == 0
    assert "strategy=accumulate, backend=cupynumeric, Legate GPUs=1" in out
    # 40 GiB x 0.8 = 32768 MiB for --fbmem; 100000 // 3 model GPUs = 33333 per slice.
    # --sysmem: JtJ, Jtr and delta in float64 (4.52 MiB) + 25% stays below the 256 MiB floor.
    assert "legate --gpus 1 --fbmem 32768 --sysmem 256 train.py --slice-size 33333" in out


def test_plan_recommends_matrix_free_when_p_squared_does_not_fit(
    four_gpus_nvml: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # JtJ of P = 2e6 is 32 TB, J of N = 1e6 is 8 TB: neither fits in 40 GiB GPUs; the
    # matrix-free step (2e6 x 624 B = 1.2 GB) does, and is recommended over subsets.
    code, out, _ = run(["--params", "2000000", "--batch", "1000000", "--script", "t.py"], capsys)
    assert code == 0
    assert "the dense step does not fit" in out and "neither strategy fits" not in out
    assert "strategy=matrix_free, backend=torch" in out
    assert "python t.py --slice-size " in out and "--strategy matrix_free" in out


def test_no_nvml_says_so_and_plans_for_cpu(
    fake_nvml: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_nvml([], init_error="LibraryNotFound")
    code, out, err = run(["--params", "769", "--batch", "100000"], capsys)
    assert code == 0 and err == ""
    assert "libnvidia-ml.so.1) is not found" in out
    assert "No GPU: the model side runs on the CPU" in out
    assert "backend=numpy" in out and "python script.py --slice-size 100000" in out


def test_no_gpu_listing(fake_nvml: Any, capsys: pytest.CaptureFixture[str]) -> None:
    fake_nvml([])
    code, out, _ = run([], capsys)
    assert code == 0 and "NVML reports no GPU on this machine." in out


def test_failing_nvml_exits_1_with_a_hint(
    fake_nvml: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_nvml([], init_error="NoPermission")
    code, out, err = run([], capsys)
    assert code == 1 and out == ""
    assert "nvmlInit() failed" in err and "HINT:" in err


def test_bad_legate_config_exits_1(
    four_gpus_nvml: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEGATE_CONFIG", "--gpus many")
    code, _, err = run([], capsys)
    assert code == 1 and "--gpus 'many'" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--params", "769"], "--params and --batch go together"),
        (["--params", "0", "--batch", "10"], "params=0"),
        (["--params", "10", "--batch", "10", "--dtype", "int8"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_2(
    fake_nvml: Any, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_nvml([])
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_env_lists_every_variable(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--env"], capsys)
    assert code == 0
    for name in ("CUDA_VISIBLE_DEVICES", "LEGATE_CONFIG", "LOCAL_RANK", "SLURM_PROCID"):
        assert f"{name}: " in out


def test_module_on_this_machine() -> None:
    """``python -m marquardt.devices --params 769 --batch 100000`` with the real NVML."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "marquardt.devices", "--params", "769", "--batch", "100000"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Recommendation: strategy=accumulate" in done.stdout
    assert "--slice-size " in done.stdout
    if "No GPU" in done.stdout:  # a machine without NVML or GPU: the NumPy path, said plainly
        assert "python script.py --slice-size 100000" in done.stdout


def test_threads_prints_the_rules_count(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from marquardt.devices import cpu_budget

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LEGATE_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    code, out, err = run(["--threads", "2"], capsys)
    assert code == 0 and out.strip() == str(max(1, cpu_budget().cores // 2))
    assert "processes from --threads" in err
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    code, out, err = run(["--threads", "2"], capsys)
    assert (code, out.strip()) == (0, "7") and "(OMP_NUM_THREADS)" in err
