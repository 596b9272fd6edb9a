"""Every development task of the marquardt monorepo, as nox sessions.

Sessions are generated from ``PACKAGES``: each ``tests-<package>`` session installs only
that package (with its test extra, and its sibling dependencies from their folders) into
a fresh virtual environment, so it proves the package installs and works alone.
Versions are pinned in ``constraints/``: ``test.txt`` for libraries, ``tools.txt`` for tools.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
TEST_CONSTRAINTS = ("-c", str(ROOT / "constraints" / "test.txt"))
TOOL_CONSTRAINTS = ("-c", str(ROOT / "constraints" / "tools.txt"))
PYTHON = "3.11"

nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["tests", "lint", "typecheck"]

# package folder -> (sibling folders it depends on, pytest marker expression, extras)
PACKAGES: dict[str, tuple[tuple[str, ...], str, str]] = {
    "core-devices": ((), "not gpu", "test"),
    "core-jacobian": (("core-devices",), "not gpu", "test"),
    "core-solver": (("core-devices", "core-jacobian"), "not gpu and not legate", "test"),
    "core-solver-legate": (("core-devices", "core-jacobian"), "legate and not gpu", "test,legate"),
    "trainer": (("core-devices", "core-jacobian", "core-solver"), "not gpu", "test,lm"),
}
ALL_PACKAGES = ("core-devices", "core-jacobian", "core-solver", "trainer")
CORE_PACKAGES = ("core-devices", "core-jacobian", "core-solver")


def _folder(name: str) -> str:
    """The package folder for a session name (``core-solver-legate`` tests ``core-solver``)."""
    return "core-solver" if name == "core-solver-legate" else name


def _install_packages(session: nox.Session, *folders: str, extras: str = "test") -> None:
    """Install local packages (siblings first) under the test constraints."""
    args = [str(ROOT / "packages" / f) for f in folders[:-1]]
    args.append(f"{ROOT / 'packages' / folders[-1]}[{extras}]")
    session.install(*TEST_CONSTRAINTS, *args)


def _make_test_session(name: str) -> None:
    siblings, markers, extras = PACKAGES[name]

    @nox.session(name=f"tests-{name}", python=PYTHON)
    def _tests(session: nox.Session) -> None:
        folder = _folder(name)
        _install_packages(session, *siblings, folder, extras=extras)
        session.run(
            "pytest",
            str(ROOT / "packages" / folder / "tests"),
            "-m",
            markers,
            "-p",
            "no:cacheprovider",
            "-ra",
            *session.posargs,
        )


for _name in PACKAGES:
    _make_test_session(_name)


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """Every package's tests, each in its own fresh environment."""
    session.run(
        sys.executable,
        "-m",
        "nox",
        "-s",
        *(f"tests-{name}" for name in PACKAGES),
        *(["--", *session.posargs] if session.posargs else []),
        external=True,
    )


@nox.session(python=PYTHON)
def integration_tests(session: nox.Session) -> None:
    """Multi-process and multi-component tests: torchrun, a real Slurm, legate, PBS."""
    _install_packages(session, *ALL_PACKAGES, extras="test,lm")
    session.install(*TEST_CONSTRAINTS, "legate", "nvidia-cupynumeric")
    session.run(
        "pytest", str(ROOT / "integration_tests"), "-p", "no:cacheprovider", "-ra", *session.posargs
    )


def _gpu_present() -> bool:
    """Whether NVML answers on this machine (no CUDA is touched)."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
        pynvml.nvmlShutdown()
        return count > 0
    except Exception:
        return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


@nox.session(python=PYTHON)
def gpu_tests(session: nox.Session) -> None:
    """Tests marked ``gpu``. On a machine without a GPU, says so and runs nothing."""
    if not _gpu_present():
        session.skip(
            "no GPU present on this machine (NVML finds none): 0 gpu tests ran, none counted as passing"
        )
    _install_packages(session, *ALL_PACKAGES, extras="test,lm")
    session.install(*TEST_CONSTRAINTS, "legate", "nvidia-cupynumeric")
    paths = [str(ROOT / "packages" / p / "tests") for p in ALL_PACKAGES]
    session.run(
        "pytest",
        *paths,
        str(ROOT / "integration_tests"),
        "-m",
        "gpu",
        "-p",
        "no:cacheprovider",
        "-ra",
        *session.posargs,
    )


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree."""
    session.install(*TOOL_CONSTRAINTS, "ruff")
    session.run("ruff", "check", str(ROOT), *session.posargs)
    session.run("ruff", "format", "--check", str(ROOT))


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy, strict on the core packages, ordinary on the trainer."""
    _install_packages(session, *ALL_PACKAGES, extras="test,lm")
    session.install(*TOOL_CONSTRAINTS, "mypy")
    core = [str(ROOT / "packages" / p / "src" / "marquardt") for p in CORE_PACKAGES]
    session.run(
        "mypy",
        "--strict",
        "--namespace-packages",
        "--explicit-package-bases",
        *[f"--package=marquardt.{p.split('-')[1]}" for p in CORE_PACKAGES],
        env={"MYPYPATH": os.pathsep.join(str(Path(c).parent) for c in core)},
    )
    session.run(
        "mypy",
        "--package=marquardt.trainer",
        "--namespace-packages",
        env={"MYPYPATH": str(ROOT / "packages" / "trainer" / "src")},
    )


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the docs site strictly; every code block is executed by the docs tests."""
    _install_packages(session, *ALL_PACKAGES, extras="test,lm")
    session.install("-r", str(ROOT / "docs" / "requirements.txt"), *TEST_CONSTRAINTS)
    # mkdocs-material 9.7+ prints a banner about its end of life on every build; it is
    # not a warning about these docs, and NO_MKDOCS_2_WARNING is its documented switch.
    session.run(
        "mkdocs",
        "build",
        "--strict",
        "-f",
        str(ROOT / "mkdocs.yml"),
        "-d",
        str(ROOT / "site"),
        *session.posargs,
        env={"NO_MKDOCS_2_WARNING": "1"},
    )


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks against the peers, measured in the same run; ratios printed beside targets."""
    _install_packages(session, *ALL_PACKAGES, extras="test,lm")
    session.install(*TEST_CONSTRAINTS, "-r", str(ROOT / "benchmarks" / "requirements.txt"))
    session.run("python", str(ROOT / "benchmarks" / "run_all.py"), *session.posargs)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: the sinc LM fit of the tutorial on this machine, with a loss-curve PNG."""
    _install_packages(session, "core-devices", "core-jacobian", "core-solver", extras="test")
    session.install(*TEST_CONSTRAINTS, "matplotlib")
    session.run("python", str(ROOT / "examples" / "sinc_lm.py"), *session.posargs)
