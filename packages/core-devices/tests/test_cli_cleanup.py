"""marquardt-devices --processes, --stop and --stop-orphans on real processes, fake NVML."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import pytest

from marquardt.devices import _stop
from marquardt.devices._cli import main
from marquardt.devices._proc import user_name


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def devices(real_processes: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The real processes, whose stand-in device files count as NVIDIA's for the command."""
    monkeypatch.setattr(_stop, "DEVICE_FILES", real_processes.device_files)
    return real_processes


def test_processes_lists_each_gpu(
    fake_nvml: Any, kit: Any, devices: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    child = devices.sleeper()
    orphan, _ = devices.orphan()
    gpus = kit.four_gpus()[:2]
    gpus[1].procs = [(child.pid, 1536 << 20), (orphan, kit.GiB)]
    fake_nvml(gpus)
    code, out, err = run(["--processes"], capsys)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"GPU 0  {kit.uuid(0)}  NVIDIA A100-SXM4-40GB: no compute process"
    assert lines[1] == f"GPU 1  {kit.uuid(1)}  NVIDIA A100-SXM4-40GB: 2 compute process(es)"
    assert lines[2].split() == ["pid", "user", "GPU", "MiB", "kind", "ppid", "orphan", "command"]
    rows = {int(line.split()[0]): line.split(maxsplit=6) for line in lines[3:5]}
    me = user_name(os.getuid())
    assert rows[child.pid][:6] == [str(child.pid), me, "1536", "C", str(os.getpid()), "no"]
    assert rows[orphan][:3] == [str(orphan), me, "1024"] and rows[orphan][5] == "yes"
    # Newlines show as \n, so each process stays on one line; long commands are cut.
    assert rows[orphan][6].startswith(f"{sys.executable} -c '\\nimport ctypes, os, sys, time\\n")
    assert len(rows[orphan][6]) == 160 and rows[orphan][6].endswith("...")
    assert rows[child.pid][6].startswith(f"{sys.executable} -c '\\nimport signal, sys, time\\n")
    assert lines[5] == "2 compute process(es) on 1 of 2 GPU(s); 1 orphan(s), 1 of them yours."
    assert "--stop-orphans --dry-run" in lines[6]


def test_processes_without_nvml(fake_nvml: Any, capsys: pytest.CaptureFixture[str]) -> None:
    fake_nvml([], init_error="DriverNotLoaded")
    code, out, _ = run(["--processes"], capsys)
    assert code == 0
    assert out == (
        "no NVIDIA GPU can be used: the NVIDIA driver is not loaded on this machine; "
        "no GPU process to list.\n"
    )


def test_stop_reports_each_pid(
    fake_nvml: Any, kit: Any, devices: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    polite, stubborn = devices.sleeper("exit"), devices.sleeper("ignore")
    fake_nvml([kit.FakeGpu(kit.uuid(0), procs=[(polite.pid, kit.GiB), (stubborn.pid, kit.GiB)])])
    code, out, err = run(["--stop", str(polite.pid), str(stubborn.pid), "--grace", "2"], capsys)
    assert code == 0 and err == ""
    first, second = out.splitlines()
    assert first.startswith(f"PID {polite.pid} (") and ": stopped by SIGTERM (gone " in first
    assert second.endswith(": killed by SIGKILL (still running 2 s after SIGTERM)")
    assert polite.wait(timeout=60) == -signal.SIGTERM
    assert stubborn.wait(timeout=60) == -signal.SIGKILL


def test_stop_refusal_exits_1_and_sends_nothing(
    fake_nvml: Any, kit: Any, devices: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    child = devices.sleeper()
    fake_nvml([kit.FakeGpu(kit.uuid(0), procs=[(child.pid, kit.GiB)])])
    code, out, err = run(["--stop", str(child.pid), str(os.getpid()), "--dry-run"], capsys)
    assert code == 1
    assert f"PID {os.getpid()} (" in out and "refused: it is this command itself" in out
    assert f"refused PID(s) {os.getpid()}; no signal was sent to any PID." in err
    assert child.poll() is None


def test_stop_orphans(
    fake_nvml: Any, kit: Any, devices: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    orphan, _ = devices.orphan()
    child = devices.sleeper()
    gpu = kit.FakeGpu(kit.uuid(0), procs=[(orphan, kit.GiB), (child.pid, kit.GiB)])
    fake_nvml([gpu])
    code, out, _ = run(["--stop-orphans", "--dry-run"], capsys)
    assert code == 0 and not kit.gone(orphan)
    assert out.splitlines() == [
        f"PID {orphan} ({out.split('(', 1)[1].split('): ')[0]}): would send SIGTERM, then "
        "SIGKILL if still running 10 s later",
        "dry run: no signal was sent.",
    ]
    code, out, _ = run(["--stop-orphans", "--grace", "30"], capsys)
    assert code == 0 and "stopped by SIGTERM" in out and kit.gone(orphan)
    assert child.poll() is None
    gpu.procs = [(child.pid, kit.GiB)]  # NVML drops a process once it has exited
    code, out, _ = run(["--stop-orphans"], capsys)
    assert (code, out) == (0, "no orphaned compute process on any GPU: nothing to stop.\n")


def test_stop_without_nvml_exits_1_with_a_hint(
    fake_nvml: Any, devices: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    child = devices.sleeper()
    fake_nvml([], init_error="LibraryNotFound")
    code, out, err = run(["--stop", str(child.pid)], capsys)
    assert code == 1 and out == ""
    assert "cannot tell which processes compute on a GPU" in err and "HINT: --force" in err
    assert child.poll() is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--stop", "0"], "'0' is not a PID"),
        (["--stop", "-1"], "'-1' is not a PID"),
        (["--stop", "12x"], "'12x' is not a PID"),
        (["--grace", "3"], "--grace goes with --stop or --stop-orphans"),
        (["--processes", "--dry-run"], "--dry-run goes with --stop"),
        (["--stop-orphans", "--force"], "--force goes with --stop:"),
        (["--processes", "--stop-orphans"], "not allowed with argument"),
        (["--processes", "--params", "9", "--batch", "9"], "do not combine with --params"),
        (["--stop", "5", "--grace", "-1"], "grace=-1.0 seconds"),
    ],
)
def test_bad_arguments_exit_2(
    fake_nvml: Any, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = fake_nvml([])
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert "nvmlInit" not in fake.calls
