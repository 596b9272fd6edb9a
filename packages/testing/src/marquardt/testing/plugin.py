"""The pytest plugin of the marquardt test suites (entry point ``pytest11``).

It registers the markers every suite uses, so that ``--strict-markers`` knows them in each
package's tests and in the integration tests alike.
"""

from __future__ import annotations

import pytest

#: Marker -> what a test that carries it needs.
MARKERS = {
    "gpu": "needs an NVIDIA GPU and driver; run by `nox -s gpu_tests`",
    "legate": "runs Legate/cuPyNumeric in a subprocess (on CPUs through the driver stub)",
    "multiprocess": "starts several processes (gloo on CPU)",
    "slurm": "needs the local Slurm started by the integration tests",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
