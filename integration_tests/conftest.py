"""Fixtures of the integration tests: a real Slurm, the Legate driver stub, shellcheck.

Markers (``--strict-markers``; the ``marquardt.testing`` plugin registers them): ``slurm``
(needs the local Slurm the test run starts), ``multiprocess`` (several processes, gloo on
CPU), ``legate`` (Legate on CPUs through the driver stub), ``gpu`` (needs an NVIDIA GPU;
only ``nox -s gpu_tests`` selects them).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _support import STUB_SOURCE
from slurm_cluster import SlurmCluster, running_cluster
from slurm_host import apt_install


def pytest_configure(config: pytest.Config) -> None:
    # The markers themselves are registered by marquardt-testing's plugin.
    config.option.strict_markers = True


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A one-node Slurm (installed from Debian if absent) for the whole session."""
    t0 = time.monotonic()
    with running_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        print(
            f"\nslurm: node {cluster.node_name} idle after {time.monotonic() - t0:.1f} s "
            f"(installed: {cluster.installed}); SLURM_CONF={cluster.conf}"
        )
        yield cluster


def _ensure_program(program: str, package: str) -> str:
    found = shutil.which(program)
    if found is None:
        apt_install([package])
        found = shutil.which(program)
    if found is None:
        raise RuntimeError(
            f"{program} is needed and `apt-get install {package}` did not provide it. "
            f"HINT: install {package} with this system's package manager."
        )
    return found


@pytest.fixture(scope="session")
def shellcheck() -> str:
    """The shellcheck program, installed from Debian if absent (a fresh CI machine has none).

    Asked for by the tests that run it (the recipes', the docs' bash blocks), and by no
    other: a GPU node without a package mirror runs the GPU tests without it.
    """
    return _ensure_program("shellcheck", "shellcheck")


@pytest.fixture(scope="session")
def legate_stub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ``libcuda.so.1``, the driver stub that lets Legate run on CPUs.

    The PyPI wheels of Legate are GPU builds that load the NVIDIA driver library; the
    stub (core-solver's test support, compiled here) answers "no device" to every call.
    """
    compiler = shutil.which("gcc") or shutil.which("cc") or _ensure_program("gcc", "gcc")
    folder = tmp_path_factory.mktemp("libcuda-stub")
    target = folder / "libcuda.so.1"
    done = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1", "-o", str(target),
         str(STUB_SOURCE)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"compiling {STUB_SOURCE} failed:\n{done.stderr}")
    return folder
