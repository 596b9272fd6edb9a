"""The GPU driver (``benchmarks/gpu/run_on_gpu.sh``) and the device paths it runs, without a
GPU: the script parses and passes shellcheck, its default benchmark parts all run on a GPU
and their limits fit the run's TOTAL beside the parts before them, its README states the
one command and the defaults; ``first_call``'s processes on a GPU (a compiling one between
the default one and the second), ``compile_time``'s models there, and the PINN step's rows
from a GPU run, each read from its function with the child processes stood in for."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"
DRIVER = GPU / "run_on_gpu.sh"
sys.path.insert(0, str(ROOT / "benchmarks"))


def _default(name: str) -> str:
    """The default of the driver's variable ``name`` (``NAME="${NAME:-default}"``)."""
    found = re.search(rf'^{name}="\$\{{{name}:-([^}}]*)\}}"$', DRIVER.read_text(), re.M)
    assert found, f"no default of {name} in {DRIVER.name}"
    return found.group(1)


def _prelude_seconds() -> int:
    """What README.md allows the parts before the benchmarks ("N s before the benchmarks")."""
    found = re.search(r"(\d+) s before the benchmarks", (GPU / "README.md").read_text())
    assert found, "README.md states no time for the parts before the benchmarks"
    return int(found.group(1))


def test_the_driver_parses_and_passes_shellcheck(shellcheck: str) -> None:
    for script in (DRIVER, GPU / "fetch_wheels.sh"):
        parsed = subprocess.run(
            ["bash", "-n", str(script)], capture_output=True, text=True, timeout=30, check=False
        )
        assert parsed.returncode == 0, parsed.stderr
        done = subprocess.run(
            [shellcheck, "--shell=bash", "--severity=style", str(script)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_default_parts_run_on_a_gpu_and_fit_the_total() -> None:
    import _registry as registry

    parts = [p.split(":") for p in _default("BENCH_PARTS").split()]
    names = [p[0] for p in parts]
    for name in ("scale", "batch_fit", "small_fit", "first_call", "pinn", "compile_time"):
        assert name in names, name
    for name, limit, *budget in parts:
        assert "cuda" in registry.get(name).devices, f"{name} does not run on a GPU"
        assert not budget or float(budget[0]) < float(limit), f"{name}: budget over its limit"
    limits = sum(int(p[1]) for p in parts)
    assert limits + _prelude_seconds() <= int(_default("TOTAL")) <= 540, limits


def test_the_readme_states_the_one_command_and_the_defaults() -> None:
    text = " ".join((GPU / "README.md").read_text().split())
    assert "OUT=$OUT bash benchmarks/gpu/run_on_gpu.sh" in text
    assert f"`{_default('BENCH_PARTS')}`" in text
    assert "benchmarks/gpu/wheels" in text and "wheels folder carried" in text


def _fake_children(
    monkeypatch: pytest.MonkeyPatch, module: Any, fail: str = ""
) -> list[tuple[list[Any], str]]:
    """Stand in for ``_child.call``: each call's arguments and cache folder are recorded and
    it returns made-up figures (an error for the kind ``fail``)."""
    import _child

    calls: list[tuple[list[Any], str]] = []

    def call(_module: str, _function: str, args: list[Any], **kw: Any) -> tuple[Any, str]:
        calls.append((list(args), kw["env"]["MARQUARDT_CACHE_DIR"]))
        if args[0] == fail:
            return None, "timed out after 40 s"
        figures = {"first_s": 2.0, "compiled": args[0] == "build", "compile_s": 0.0}
        if args[0] == "first":
            return {**figures, "builds_ended": True, "build_s": 0.01}, ""
        if args[0] == "build":
            figures["compile_s"] = 30.0
        return {**figures, "later_s": 0.5, "later_compiled": args[0] != "eager"}, ""

    monkeypatch.setattr(_child, "call", call)
    monkeypatch.setattr(module._machine, "load_average", lambda: 1.0)
    return calls


def test_first_call_on_a_gpu_compiles_in_a_process_of_its_own_for_the_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import bench_first_call as bench

    calls = _fake_children(monkeypatch, bench)
    row = bench.case(100_000, "float32", "cuda:0", timeout=40.0)
    assert [args[0] for args, _ in calls] == ["eager", "first", "build", "second"]
    assert all(args[1:] == [100_000, "float32", "cuda:0"] for args, _ in calls)
    folders = [folder for _, folder in calls]
    assert folders[0] not in folders[1:] and len(set(folders[1:])) == 1
    rows = bench.rows({"rows": [row]})
    assert [r.verdict for r in rows] == ["PASS", "info", "info"]
    assert rows[1].value == pytest.approx(1.0) and "compile 30.0 s" in rows[1].detail
    assert "no background build on the device" in rows[0].detail
    summary = {"machine": {"cpu": "c", "cores": 16, "torch": "t", "gpu": "H200"}, "rows": [row]}
    assert "GPU H200;" in bench.section(summary) and "| 2.00: 30.0 |" in bench.section(summary)

    calls.clear()
    cpu_row = bench.case(1_000, "float32", "cpu")
    assert [args[0] for args, _ in calls] == ["eager", "first", "second"]
    assert "background build 0 s" in bench.rows({"rows": [cpu_row]})[0].detail


def test_a_failed_gpu_build_is_recorded_and_ends_the_row(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench_first_call as bench

    calls = _fake_children(monkeypatch, bench, fail="build")
    row = bench.case(100_000, "float32", "cuda:0", timeout=40.0)
    assert [args[0] for args, _ in calls] == ["eager", "first", "build"]
    first, build = bench.rows({"rows": [row]})
    assert first.verdict == "PASS" and build.verdict == "n/a"
    assert build.detail == "did not complete: timed out after 40 s"
    summary = {"machine": {"cpu": "c", "cores": 16, "torch": "t"}, "rows": [row]}
    assert "| did not complete | — | — |" in bench.section(summary)


def test_compile_time_on_a_gpu_builds_its_gpu_models_in_one_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import _child
    import bench_compile_time as bench

    asked = []

    def call(_module: str, function: str, args: list[Any], **kw: Any) -> tuple[Any, str]:
        asked.append((function, list(args), kw["timeout"]))
        return {"compile_s": 9.0, "kernels": 1, "later_s": 0.01, "parts": {}}, ""

    monkeypatch.setattr(_child, "call", call)
    machine = {"cpu": "c", "cores": 16, "torch": "t", "gpu": "H200"}
    monkeypatch.setattr(bench._machine, "describe", lambda device: machine)
    summary = bench.main(device="cuda:0", timeout=30.0)
    level = bench.PASSES[0]  # the package's wrappers
    assert asked == [
        (function, [name, level, "cuda:0"], 30.0)
        for name in bench.GPU_MODELS
        for function in ("shared", "process")
    ]
    shared, model = bench.rows(summary)
    assert "no model P=6" in shared.what and shared.verdict == "info"
    assert model.verdict == "PASS" and "elliptic" in model.what
    assert summary["machine"]["gpu"] == "H200" and "GPU H200" in bench.section(summary)


def test_the_pinn_step_on_a_gpu_gives_its_row_or_says_why_not() -> None:
    import _pinn_report as report

    assert report.device_step_rows(None) == [] and report.device_step_text(None) == ""
    (failed,) = report.device_step_rows({"error": "timed out after 60 s"})
    assert failed.verdict == "n/a" and "timed out" in failed.detail
    step = {
        "pinn_step_eager": 0.004,
        "pinn_step_compiled": 0.001,
        "pinn_step_compile_s": 12.0,
        "pinn_step_compiled_ran": 1.0,
        "repeats": 20,
    }
    (ratio,) = report.device_step_rows(step)
    assert ratio.value == pytest.approx(0.25) and ratio.verdict == "info"
    assert "1.00 ms vs 4.00 ms" in ratio.detail and "compiled ran: True" in ratio.detail
    assert "(0.25×) after a compile of 12.0 s" in report.device_step_text(step)


def test_the_pinn_run_on_a_gpu_times_pinnstep_there_and_shows_no_cpu_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import _pinn_report as report
    import bench_pinn as bench

    run = {"trace": [[0.0, 1.0], [2.0, 1e-3]], "steps": 9, "step_median_s": 0.01,
           "memory_mib": 5.0, "params": 337, "rows": 484}  # fmt: skip
    asked = []

    def call(module: str, function: str, args: list[Any], **kw: Any) -> tuple[Any, str]:
        asked.append((module, function, list(args), kw["timeout"]))
        return {"pinn_step_eager": 0.004, "pinn_step_compiled": 0.002, "repeats": args[1],
                "pinn_step_compile_s": 9.0, "pinn_step_compiled_ran": 1.0}, ""  # fmt: skip

    machine = {"cpu": "c", "cores": 16, "gpu": "H200", "load_average_1min": 1.0}
    monkeypatch.setattr(bench, "_child", lambda *args, **kw: dict(run))
    monkeypatch.setattr(bench._child_process, "call", call)
    cpu = {k: v for k, v in machine.items() if k != "gpu"}
    monkeypatch.setattr(
        bench._machine, "describe", lambda device="cpu": machine if device != "cpu" else cpu
    )
    monkeypatch.setattr(bench.report, "figures", lambda *args: None)
    results = bench.main(quick=True, budget=2.0, device="cuda:0")
    assert asked == [("_pinn_engd", "device_steps", ["cuda:0", bench.STEP_REPEATS],
                      bench.STEP_TIMEOUT)]  # fmt: skip
    rows = report.summary(results)
    assert rows[-1].what.startswith("PINN step on the device") and rows[-1].value == 0.5
    assert not [r for r in rows if r.source], "the CPU's recorded step rows in a GPU's report"
    assert "(0.50×) after a compile of 9.0 s" in report.section(results)
