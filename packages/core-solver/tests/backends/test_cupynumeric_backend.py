"""The cuPyNumeric backend on Legate CPUs, against the NumPy reference.

One child process, started by the ``legate`` launcher with two CPU processors (so Legate
splits J's rows between them), assembles and solves random systems with both backends and
reports the differences; it also asks ``LMA(backend="auto")`` and ``marquardt.devices``
what they see inside the running Legate. The tests assert on that report.

Tolerances: float64 systems agree to 1e-10 relative (the worst-conditioned, 1e4-scaled
columns at λ = 1e-6, differ by ~1e-12). A float32 J is multiplied in float32 by both
backends, in a different summation order, so δ agrees to ~ε₃₂·cond ≈ 1e-6; the test allows
1e-5 there. Products handed over in float64 agree to 1e-12 whatever the slices' dtype.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from legate_support import build_stub, env_for_legate_cpu, legate_launcher, run_json

pytestmark = pytest.mark.legate

WORKER = Path(__file__).resolve().parents[1] / "legate_support" / "worker_backend.py"
TIMEOUT = 600.0
CASES = ("tall_f64", "square_f64", "wide_f64", "tall_f32")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    stub = build_stub(tmp_path_factory.mktemp("libcuda"))
    env = env_for_legate_cpu(stub.parent)
    # Unset, so that the child shows what the backend itself sets.
    env.pop("CUPYNUMERIC_MATMUL_CACHE_SIZE", None)
    command = [*legate_launcher(), "--cpus", "2", "--gpus", "0", "--sysmem", "2000", str(WORKER)]
    result: dict[str, Any] = run_json(command, env, timeout=TIMEOUT)
    return result


def _tolerance(key: str) -> float:
    if "/products/" in key:
        return 1e-12
    return 1e-5 if key.startswith("tall_f32") else 1e-10


def test_legate_ran_on_two_cpu_processors(report: dict[str, Any]) -> None:
    assert report["cpus"] == 2


@pytest.mark.parametrize("case", CASES)
def test_systems_live_in_legate(report: dict[str, Any], case: str) -> None:
    assert report["systems"][f"{case}/in_legate"] == "cupynumeric"


def test_wide_jacobian_gives_the_underdetermined_system(report: dict[str, Any]) -> None:
    systems = report["systems"]
    assert systems["wide_f64/underdetermined"] == [True, True]
    assert systems["tall_f64/underdetermined"] == [False, False]
    assert systems["square_f64/underdetermined"] == [False, False]


@pytest.mark.parametrize("case", CASES)
def test_solutions_match_numpy(report: dict[str, Any], case: str) -> None:
    solved = {
        k: v
        for k, v in report["systems"].items()
        if k.startswith(f"{case}/") and "/" in k[len(case) + 1 :]
    }
    assert len(solved) >= 6, f"{case}: expected every scaling × damping, got {sorted(solved)}"
    for key, found in solved.items():
        limit = _tolerance(key)
        for term in ("delta", "gradient_dot", "curvature"):
            assert found[term] <= limit, f"{key}: {term} differs by {found[term]:.3e} > {limit:g}"
        assert found["rss"] <= 1e-12, f"{key}: rss differs by {found['rss']:.3e}"
        assert (found["delta_dtype"], found["delta_device"]) == ("torch.float64", "cpu")


@pytest.mark.parametrize("failure", ["indefinite", "nan", "inf_in_jacobian"])
def test_unsolvable_systems_are_rejected_attempts_not_errors(
    report: dict[str, Any], failure: str
) -> None:
    assert report["rejected"][failure] == [True, True]  # identity and marquardt scaling


def test_unknown_scaling_is_refused_with_a_hint(report: dict[str, Any]) -> None:
    message = report["rejected"]["bad_scaling"]
    assert "'diagonal'" in message and "HINT:" in message


def test_backend_raises_the_matmul_cache_for_tall_jacobians(report: dict[str, Any]) -> None:
    from marquardt.solver._backends.cupynumeric_backend import MATMUL_CACHE_SIZE

    assert report["cache_before"] is None
    assert report["cache_after"] == str(MATMUL_CACHE_SIZE)


def test_auto_and_devices_agree_with_the_running_legate(report: dict[str, Any]) -> None:
    auto = report["auto"]
    # Legate holds no GPU here, so auto keeps the solve on the model's device (torch).
    assert (auto["legate_gpu_count"], auto["source"], auto["auto"]) == (0, "runtime", "torch")
    # A running runtime is trusted over a LEGATE_CONFIG changed after it started.
    assert auto["legate_gpu_count_after_config_change"] == 0
    assert auto["auto_after_config_change"] == "torch"
    assert auto["auto_with_override"] == "cupynumeric"
