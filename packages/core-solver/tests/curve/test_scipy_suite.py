"""SciPy's own TestCurveFit (the installed SciPy's tests, not a copy) run against ours.

A child pytest runs ``scipy/optimize/tests/test_minpack.py -k TestCurveFit`` with
``_scipy_suite_plugin`` swapping in ``marquardt.solver.curve_fit``. SciPy 1.17 has 46
cases; every one passes but ``test_gh4555b``, whose reference pcov was recorded from
MINPACK's last Jacobian (one step before p̂): it is 1.6e-6 from the exact covariance at p̂
and 3.9e-8 from the exact covariance at the point of MINPACK's last Jacobian, ours 5.6e-8
from the exact one at p̂ (test_curve_fit_scipy checks pcov against it). Only MINPACK's own
path of iterates would meet that reference's 2e-7."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

scipy = pytest.importorskip("scipy")

#: Cases where ours differs from SciPy's recorded numbers, and why (module docstring).
EXPECTED_FAILURES = {"test_gh4555b"}


def test_scipy_testcurvefit_passes_against_ours() -> None:
    suite = Path(scipy.__file__).parent / "optimize" / "tests" / "test_minpack.py"
    if not suite.exists():
        pytest.skip("SciPy's tests are not installed")
    here = Path(__file__).resolve().parents[1]  # where _scipy_suite_plugin.py is
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "_scipy_suite_plugin",
            str(suite),
            "-k",
            "TestCurveFit",
            "-rf",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=here,
        timeout=600,
    )
    out = run.stdout + run.stderr
    passed = int(m.group(1)) if (m := re.search(r"(\d+) passed", out)) else 0
    failed = {name.split("[")[0] for name in re.findall(r"FAILED \S+::TestCurveFit::(\S+)", out)}
    assert "marquardt curve_fit swapped into 1 module(s)" in out, out[-3000:]
    assert failed <= EXPECTED_FAILURES, out[-3000:]
    assert passed >= 45, out[-3000:]
